// accel::data — token files, mapped from disk, cut into training windows for accel::DataLoader.
//
// TokenFile: a flat array of token ids in a file, mapped (never read whole into memory):
//   - `.bin`: raw little-endian integers, as nanoGPT's prepare.py writes them (uint16 by default, or
//     uint32: the file has no header, so the dtype is an option);
//   - `.npy`: a one-dimensional NumPy array of uint16, uint32, int32 or int64 (its header says which).
// examples/prepare_tokens.py writes both from local text files (the `tokenizers` package).
//
// TokenWindows: a torch::data dataset over a TokenFile, so accel::DataLoader shards, shuffles and
// resumes it (the loader's position is what save_state records). Each example is (input, target),
// int64 [seq_len] each, target the input shifted by one token:
//   - packed (no eos_token_id): window i is tokens [i*seq_len, (i+1)*seq_len] of the file, documents
//     running into each other (nanoGPT's way); (N - 1) / seq_len windows;
//   - one document per row (eos_token_id set): documents end at each eos token (kept as their last
//     token); a row is a document's first seq_len + 1 tokens, padded after its end with pad_token_id in
//     the input and -100 in the target (left out of causal_lm_loss and of Transformers' loss). Right
//     padding needs no attention mask in a causal model: no real token attends to a pad.
// `begin`/`end` take a range of the file's tokens (a held-out tail, for instance).
//
// Errors: InvalidArgumentError naming the file for what cannot be read as tokens (a size not a
// multiple of the dtype, an .npy of another dtype or shape, fewer tokens than one window).
#pragma once

#include "base/mapped_file.h"

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::data {

enum class TokenDtype { UInt16, UInt32, Int32, Int64 };

class TokenFile {
 public:
  // `bin_dtype`: the dtype of a .bin file (an .npy file's header decides its own).
  static TokenFile open(const std::string& path, TokenDtype bin_dtype = TokenDtype::UInt16);
  std::int64_t size() const { return n_; }  // tokens
  std::int64_t at(std::int64_t i) const;    // token i (no bounds check beyond ACCEL_CHECK in debug use)
  // Tokens [begin, begin + n) as int64.
  std::vector<std::int64_t> read(std::int64_t begin, std::int64_t n) const;
  const std::string& path() const { return path_; }
  TokenDtype dtype() const { return dtype_; }

 private:
  std::shared_ptr<files::MappedFile> file_;
  std::string path_;
  const char* data_ = nullptr;  // the first token
  std::int64_t n_ = 0;
  TokenDtype dtype_ = TokenDtype::UInt16;
};

struct TokenWindowsOptions {
  std::int64_t seq_len = 128;                // input tokens per example
  std::optional<std::int64_t> eos_token_id;  // set: one document per row (see above)
  std::int64_t pad_token_id = 0;             // the input's filler after a document's end
  std::int64_t begin = 0;                    // the file's tokens [begin, end) only
  std::optional<std::int64_t> end;           // default: the file's end
};

class TokenWindows : public torch::data::datasets::Dataset<TokenWindows> {
 public:
  TokenWindows(TokenFile file, TokenWindowsOptions options);
  torch::data::Example<> get(std::size_t i) override;
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(rows_); }
  const TokenWindowsOptions& options() const { return opts_; }
  // Document rows: where row i starts in the file, and its length in tokens (before padding).
  std::int64_t row_start(std::int64_t i) const;

 private:
  TokenFile file_;
  TokenWindowsOptions opts_;
  std::int64_t end_ = 0, rows_ = 0;
  std::vector<std::int64_t> doc_starts_;  // document rows: each document's first token, then the end
};

const char* dtype_name(TokenDtype d);
// "uint16" | "uint32" | "int32" | "int64"; InvalidArgumentError otherwise.
TokenDtype parse_dtype(const std::string& name);

}  // namespace accel::data
