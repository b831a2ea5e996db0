// The examples' data, generated on the spot (no downloads), identical on every rank and every run:
// each generator draws from its own std::mt19937_64, never from libtorch's global RNG.
//   ClassificationData — points in R^features labelled by the argmax of a fixed random linear map.
//   CharCorpus         — a character-level corpus from a small grammar, cut into (input, next) windows.
//   ShapesData         — 1 x S x S images of four shapes at random places, with noise.
#pragma once

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace accel::examples {

class ClassificationData : public torch::data::datasets::Dataset<ClassificationData> {
 public:
  // The labelling map comes from `seed`; the points from (seed, split): a train and an eval split
  // share the task but not the points.
  ClassificationData(std::int64_t n, std::int64_t features, std::int64_t classes, std::uint64_t seed,
                     std::uint64_t split = 0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](at::Tensor t) {
      float* p = t.data_ptr<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = normal(rng);
    };
    at::Tensor w = at::empty({features, classes});
    fill(w);
    rng.seed(seed * 1000003 + split + 1);
    x_ = at::empty({n, features});
    fill(x_);
    at::Tensor noise = at::empty({n, classes});
    fill(noise);
    y_ = at::argmax(at::matmul(x_, w) + 0.3 * noise, 1);
  }
  torch::data::Example<> get(std::size_t i) override { return {x_[i], y_[i]}; }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(x_.size(0)); }

 private:
  at::Tensor x_, y_;
};

class CharCorpus : public torch::data::datasets::Dataset<CharCorpus> {
 public:
  // About `chars` characters of text; windows of `seq` tokens (stride seq).
  CharCorpus(std::int64_t chars, std::int64_t seq, std::uint64_t seed) : seq_(seq) {
    const std::vector<std::string> subjects = {"the cat", "a dog", "the old man", "my friend", "the bird", "a child"};
    const std::vector<std::string> verbs = {"sees", "likes", "finds", "follows", "hears", "draws"};
    const std::vector<std::string> objects = {"the moon",      "a red ball", "the river",
                                              "a small house", "the tree",   "an apple"};
    const std::vector<std::string> tails = {".", " today.", " again.", " at night.", " by the sea."};
    std::mt19937_64 rng(seed);
    auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
    while (static_cast<std::int64_t>(text_.size()) < chars)
      text_ += pick(subjects) + " " + pick(verbs) + " " + pick(objects) + pick(tails) + "\n";
    std::string alphabet = text_;
    std::sort(alphabet.begin(), alphabet.end());
    alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
    vocab_ = alphabet;
    std::map<char, std::int64_t> id;
    for (std::size_t i = 0; i < vocab_.size(); ++i) id[vocab_[i]] = static_cast<std::int64_t>(i);
    tokens_ = at::empty({static_cast<std::int64_t>(text_.size())}, at::kLong);
    auto* t = tokens_.data_ptr<std::int64_t>();
    for (std::size_t i = 0; i < text_.size(); ++i) t[i] = id[text_[i]];
  }
  torch::data::Example<> get(std::size_t i) override {
    const std::int64_t start = static_cast<std::int64_t>(i) * seq_;
    return {tokens_.narrow(0, start, seq_), tokens_.narrow(0, start + 1, seq_)};
  }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>((tokens_.numel() - 1) / seq_); }
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(vocab_.size()); }
  const std::string& text() const { return text_; }

 private:
  std::int64_t seq_;
  std::string text_, vocab_;
  at::Tensor tokens_;
};

class ShapesData : public torch::data::datasets::Dataset<ShapesData> {
 public:
  static constexpr std::int64_t kClasses = 4;  // horizontal bar, vertical bar, square outline, diagonal
  ShapesData(std::int64_t n, std::int64_t side, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.15f);
    x_ = at::empty({n, 1, side, side});
    y_ = at::empty({n}, at::kLong);
    const std::int64_t len = side / 2;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t cls = static_cast<std::int64_t>(rng() % kClasses);
      const std::int64_t r0 = static_cast<std::int64_t>(rng() % (side - len)),
                         c0 = static_cast<std::int64_t>(rng() % (side - len));
      float* img = x_[i].data_ptr<float>();
      for (std::int64_t k = 0; k < side * side; ++k) img[k] = noise(rng);
      auto on = [&](std::int64_t r, std::int64_t c) { img[r * side + c] += 1.0f; };
      for (std::int64_t k = 0; k < len; ++k) {
        if (cls == 0) on(r0 + len / 2, c0 + k);
        if (cls == 1) on(r0 + k, c0 + len / 2);
        if (cls == 2) {
          on(r0, c0 + k);
          on(r0 + len - 1, c0 + k);
          on(r0 + k, c0);
          on(r0 + k, c0 + len - 1);
        }
        if (cls == 3) on(r0 + k, c0 + k);
      }
      y_[i] = cls;
    }
  }
  torch::data::Example<> get(std::size_t i) override { return {x_[i], y_[i]}; }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(x_.size(0)); }

 private:
  at::Tensor x_, y_;
};

}  // namespace accel::examples
