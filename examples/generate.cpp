// Example 5: big-model inference. Greedy decoding with the KV cache of a Llama checkpoint directory
// (config.json + safetensors, as Transformers' save_pretrained writes it), the model built empty on
// the meta device and loaded by load_checkpoint_and_dispatch: the decoder layers that do not fit in
// --max_memory are paged in from disk around their forward.
//
//   build/bin/generate --model DIR --device_map auto --max_memory cpu=2GB --offload_folder /tmp/offload
//   build/bin/generate --model DIR --device_map cpu        # everything in memory (the reference)
//
// It prints the generated token ids, the prefill time, the decoding speed (tokens/s), the peak
// resident memory of the process (VmHWM) and where the weights went.
//
// A random checkpoint of any size, written one tensor at a time (never the whole model in memory):
//   build/bin/generate --make_random_checkpoint DIR --preset 1b --dtype bf16   # TinyLlama-1.1B's shape
//   build/bin/generate --make_random_checkpoint DIR --config my_config.json
// (--max_shard_size splits it into model-0000k-of-0000n.safetensors with an index, as Transformers.)
//
// --drop_page_cache: after a disk layer runs its pages are also dropped from the page cache, so every
// token reads the offloaded layers from the disk again (the disk's read bandwidth is then the bound,
// not the page cache's copy). --measure_disk_mb N (with --offload_folder) times the disk after decoding and
// prints that bound where layers are on disk.
#include "checkpoint/safetensors.h"
#include "dispatch/dispatch.h"
#include "models/llama.h"
#include "offload/async_file.h"

#include "base/files.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>

using namespace accel;

namespace {

std::int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

// `where`: what gave the value (--dtype, or a config.json's dtype), for the error.
c10::ScalarType parse_dtype(const std::string& s, const std::string& where = "--dtype") {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  if (s == "fp16" || s == "float16") return at::kHalf;
  throw std::invalid_argument(where + ": fp32, bf16 or fp16, not '" + s + "'");
}
std::string config_dtype(c10::ScalarType t) {
  return t == at::kBFloat16 ? "bfloat16" : t == at::kHalf ? "float16" : "float32";
}

models::LlamaConfig preset(const std::string& name) {
  models::LlamaConfig c;
  if (name == "tiny") {  // ~1M parameters: tests
    c.vocab_size = 256, c.hidden_size = 64, c.intermediate_size = 128, c.num_hidden_layers = 4;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 256;
  } else if (name == "1b") {  // TinyLlama-1.1B's shape: 1.10e9 parameters
    c.vocab_size = 32000, c.hidden_size = 2048, c.intermediate_size = 5632, c.num_hidden_layers = 22;
    c.num_attention_heads = 32, c.num_key_value_heads = 4, c.max_position_embeddings = 2048;
    c.rms_norm_eps = 1e-5;
  } else {
    throw std::invalid_argument("--preset: tiny or 1b, not '" + name + "'");
  }
  return c;
}

// Writes a random Llama checkpoint one tensor at a time: names and shapes from a model built on the
// meta device (no memory), values drawn per tensor (normal(0, initializer_range), norms at one).
void make_random_checkpoint(const std::string& dir, models::LlamaConfig c, c10::ScalarType dtype,
                            std::int64_t max_shard_size, std::uint64_t seed) {
  c.dtype = config_dtype(dtype);
  c.validate();
  files::make_dirs(dir);
  models::LlamaForCausalLM meta(c, at::TensorOptions().device(at::kMeta).dtype(dtype));
  std::vector<std::vector<checkpoint::SafetensorsTensorSpec>> shards(1);
  std::int64_t in_shard = 0, total = 0, params = 0;
  for (const auto& p : meta.named_parameters()) {
    const std::int64_t bytes = p.value().numel() * static_cast<std::int64_t>(c10::elementSize(dtype));
    if (max_shard_size > 0 && in_shard > 0 && in_shard + bytes > max_shard_size) shards.emplace_back(), in_shard = 0;
    shards.back().push_back({p.key(), dtype, p.value().sizes().vec()});
    in_shard += bytes, total += bytes, params += p.value().numel();
  }
  at::manual_seed(seed);
  nlohmann::json index;
  index["metadata"]["total_size"] = total;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    char numbered[64];
    std::snprintf(numbered, sizeof numbered, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string name = shards.size() == 1 ? std::string("model.safetensors") : std::string(numbered);
    checkpoint::SafetensorsWriter w(dir + "/" + name, shards[s], {{"format", "pt"}});
    for (const auto& spec : shards[s]) {
      at::Tensor t =
          spec.name.ends_with("norm.weight") ? at::ones(spec.shape) : at::randn(spec.shape).mul_(c.initializer_range);
      w.write(spec.name, t.to(dtype));
      index["weight_map"][spec.name] = name;
    }
    w.finish();
  }
  if (shards.size() > 1) {
    const std::string text = index.dump(2);
    files::write_file_atomic(dir + "/model.safetensors.index.json", text.data(), text.size());
  }
  const std::string config = c.to_json();
  files::write_file_atomic(dir + "/config.json", config.data(), config.size());
  std::printf("wrote %s: %.4g parameters, %.1f MiB in %zu file%s (%s)\n", dir.c_str(), static_cast<double>(params),
              total / 1048576.0, shards.size(), shards.size() == 1 ? "" : "s", c.dtype.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Greedy generation from a Llama checkpoint, with big-model dispatch"};
  std::string model_dir, device_map = "auto", max_memory, offload_folder, prompt, dtype_name, save_logits;
  std::string make_dir, config_file, preset_name = "tiny", max_shard = "2GB";
  std::int64_t prompt_tokens = 16, new_tokens = 32;
  std::uint64_t seed = 0;
  bool drop_page_cache = false;
  std::int64_t measure_disk_mb = 0;
  app.add_option("--model", model_dir, "checkpoint directory (config.json + safetensors)");
  app.add_option("--device_map", device_map,
                 "auto | balanced | sequential | a place for everything (cpu, cuda:0) | name=place,name=place");
  app.add_option("--max_memory", max_memory, "place=size,... e.g. cpu=2GB,cuda:0=10GiB (default: what is available)");
  app.add_option("--offload_folder", offload_folder,
                 "where disk-offloaded weights go when the checkpoint cannot be mapped");
  app.add_option("--prompt", prompt, "token ids, comma-separated (default: --prompt_tokens random ids)");
  app.add_option("--prompt_tokens", prompt_tokens, "random prompt length")->check(CLI::PositiveNumber);
  app.add_option("--max_new_tokens", new_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  app.add_option("--dtype", dtype_name,
                 "fp32 | bf16 | fp16 (default: config.json's dtype; a --preset's random checkpoint: fp32)");
  app.add_option("--seed", seed, "prompt / random checkpoint seed");
  app.add_option("--save_logits", save_logits, "write every step's last-position logits to this safetensors file");
  app.add_flag("--drop_page_cache", drop_page_cache, "drop disk layers from the page cache after they run");
  app.add_option("--measure_disk_mb", measure_disk_mb,
                 "after decoding, time reading this many MiB in --offload_folder: the disk's bound on tokens/s "
                 "where layers are on disk");
  app.add_option("--make_random_checkpoint", make_dir, "write a random checkpoint into this directory and exit");
  app.add_option("--config", config_file, "with --make_random_checkpoint: a config.json (else --preset)");
  app.add_option("--preset", preset_name, "with --make_random_checkpoint: tiny | 1b");
  app.add_option("--max_shard_size", max_shard, "with --make_random_checkpoint: e.g. 2GB");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!make_dir.empty()) {
      models::LlamaConfig c = config_file.empty() ? preset(preset_name) : models::LlamaConfig::from_file(config_file);
      // --dtype, else the config.json's, else (a preset) fp32
      const c10::ScalarType dtype = !dtype_name.empty() ? parse_dtype(dtype_name)
                                    : !config_file.empty() && !c.dtype.empty()
                                        ? parse_dtype(c.dtype, config_file + "'s dtype")
                                        : at::kFloat;
      make_random_checkpoint(make_dir, c, dtype, parse_size(max_shard), seed);
      return 0;
    }
    if (model_dir.empty()) throw std::invalid_argument("--model DIR is required (or --make_random_checkpoint DIR)");
    if (measure_disk_mb > 0 && offload_folder.empty())
      throw std::invalid_argument("--measure_disk_mb times reads in --offload_folder: give one");
    const models::LlamaConfig config = models::LlamaConfig::from_file(model_dir);
    const c10::ScalarType dtype =
        dtype_name.empty() ? parse_dtype(config.dtype, model_dir + "/config.json's dtype") : parse_dtype(dtype_name);

    const std::int64_t rss_start = status_bytes("VmRSS");
    const auto t0 = std::chrono::steady_clock::now();
    // Built on the meta device: names, shapes and units, no memory.
    auto model = std::make_shared<models::LlamaForCausalLM>(config, at::TensorOptions().device(at::kMeta).dtype(dtype));
    DispatchOptions o;
    if (device_map == "auto" || device_map == "balanced" || device_map == "sequential") {
      o.device_map = device_map;
    } else if (device_map.find('=') == std::string::npos) {
      o.device_map = DeviceMap{{"", device_map}};
    } else {
      DeviceMap m;  // name=place,name=place
      std::size_t start = 0;
      while (start < device_map.size()) {
        std::size_t end = device_map.find(',', start);
        if (end == std::string::npos) end = device_map.size();
        const std::string item = device_map.substr(start, end - start);
        const auto eq = item.find('=');
        m[item.substr(0, eq)] = item.substr(eq + 1);
        start = end + 1;
      }
      o.device_map = m;
    }
    if (!max_memory.empty()) o.max_memory = parse_max_memory(max_memory);
    o.offload_folder = offload_folder;
    o.no_split = {"LlamaDecoderLayer"};
    o.drop_page_cache = drop_page_cache;
    DispatchResult r = load_checkpoint_and_dispatch(model, model_dir, o);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("device map: %s\n", to_string(r.device_map, model.get()).c_str());
    std::string places;
    for (const auto& [place, bytes] : r.bytes_by_place) {
      char item[96];
      std::snprintf(item, sizeof item, " %s %.1f MiB", place.c_str(), bytes / 1048576.0);
      places += item;
    }
    std::printf("weights:%s; %lld layers on disk; loaded in %.2f s\n", places.c_str(),
                static_cast<long long>(r.disk_units), load_s);

    std::vector<std::int64_t> ids;
    if (!prompt.empty()) {
      std::size_t start = 0;
      while (start < prompt.size()) {
        std::size_t end = prompt.find(',', start);
        if (end == std::string::npos) end = prompt.size();
        ids.push_back(std::stoll(prompt.substr(start, end - start)));
        start = end + 1;
      }
    } else {
      at::manual_seed(seed);
      at::Tensor p = at::randint(0, config.vocab_size, {prompt_tokens}, at::kLong);
      ids.assign(p.data_ptr<std::int64_t>(), p.data_ptr<std::int64_t>() + prompt_tokens);
    }
    const c10::Device main(r.main_device);
    c10::NoGradGuard no_grad;
    models::KVCache cache = model->make_cache();
    std::vector<at::Tensor> logits;
    std::vector<std::int64_t> out;
    auto t1 = std::chrono::steady_clock::now();
    at::Tensor step = model->forward(at::tensor(ids, at::kLong).view({1, -1}).to(main), &cache);
    const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const PagingStats paged_before_decode = paging_stats();
    t1 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < new_tokens; ++i) {
      at::Tensor last = step.select(1, step.size(1) - 1).select(0, 0).to(at::kCPU, at::kFloat);
      if (!save_logits.empty()) logits.push_back(last);
      const std::int64_t next = last.argmax().item<std::int64_t>();
      out.push_back(next);
      if (i + 1 < new_tokens) step = model->forward(at::full({1, 1}, next, at::kLong).to(main), &cache);
    }
    const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::string text;
    for (auto t : out) text += (text.empty() ? "" : ",") + std::to_string(t);
    std::printf("tokens: %s\n", text.c_str());
    std::printf(
        "prefill %zu tokens in %.3f s; decode %lld tokens in %.3f s: %.2f tokens/s; peak RSS %.1f MiB "
        "(%.1f MiB at the start); paged from disk %.1f MiB\n",
        ids.size(), prefill_s, static_cast<long long>(new_tokens - 1), decode_s,
        new_tokens > 1 ? (new_tokens - 1) / decode_s : 0.0, status_bytes("VmHWM") / 1048576.0, rss_start / 1048576.0,
        paging_stats().bytes_paged / 1048576.0);
    if (measure_disk_mb > 0 && !r.bytes_by_place.count("disk"))
      std::printf("--measure_disk_mb: no layer is on disk under this device map, so the disk bounds nothing\n");
    if (measure_disk_mb > 0 && r.bytes_by_place.count("disk")) {
      files::make_dirs(offload_folder);
      const auto bw = offload::measure_disk(offload_folder, static_cast<std::uint64_t>(measure_disk_mb) << 20);
      const double per_token = r.bytes_by_place.at("disk") / 1e9;  // GB read per token from disk
      std::printf("disk read %.2f GB/s (%s): %.3f GB of layers per token bounds decoding at %.2f tokens/s\n",
                  bw.read_gbps, bw.direct ? "O_DIRECT" : "page cache dropped", per_token, bw.read_gbps / per_token);
    }
    if (r.disk_units > 0 && decode_s > 0)
      std::printf("decode paged %.1f MiB of disk layers: %.1f MiB/s\n",
                  (paging_stats().bytes_paged - paged_before_decode.bytes_paged) / 1048576.0,
                  (paging_stats().bytes_paged - paged_before_decode.bytes_paged) / 1048576.0 / decode_s);
    if (!save_logits.empty()) checkpoint::write_safetensors(save_logits, {{"logits", at::stack(logits)}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
