// Model FLOPs utilisation for step_bench: the FLOPs a GPT training step needs (PaLM's count,
// Chowdhery et al. 2022, appendix B: 6 per parameter per token for the products of forward and
// backward, plus 12 * layers * seq * d_model per token for attention's scores and weighted values),
// over what the devices could do in the step's time at their peak for the precision.
// Header-only and torch-free: step_bench prints it, tests/cli/mfu_check.sh holds it to the closed form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace accel::bench {

// FLOPs of one optimizer step that trains `tokens` tokens (all ranks together) of a GPT with
// `params` parameters (a tied head counted once: its product is in 6 * params), `layers` blocks of
// width `d_model`, sequences of `seq` tokens. Causal attention is counted whole, as PaLM counts it.
inline double gpt_train_flops(std::int64_t params, std::int64_t layers, std::int64_t seq, std::int64_t d_model,
                              std::int64_t tokens) {
  return (6.0 * static_cast<double>(params) +
          12.0 * static_cast<double>(layers) * static_cast<double>(seq) * static_cast<double>(d_model)) *
         static_cast<double>(tokens);
}

// Dense peak TFLOP/s of one device for a precision (fp32 | bf16 | fp16 | fp8), from the vendor's data
// sheets, by the name the CUDA runtime reports; nullopt for a device or precision not listed (give
// step_bench --peak_tflops). fp32 is the CUDA cores' rate: libtorch leaves TF32 off for matmuls.
inline std::optional<double> device_peak_tflops(const std::string& name, const std::string& precision) {
  struct Row {
    const char* match;  // a substring of the device's name
    const char* not_match;
    double fp32, bf16, fp8;  // fp16 = bf16; 0: not supported
  };
  static const Row rows[] = {
      {"H100", "PCIe", 66.9, 989.4, 1978.9},  // H100 SXM5 (H100 80GB HBM3)
      {"H100", "", 51.2, 756.0, 1513.0},      // H100 PCIe
      {"H200", "", 66.9, 989.4, 1978.9},     {"A100", "", 19.5, 312.0, 0.0}, {"L40S", "", 91.6, 362.0, 733.0},
  };
  for (const Row& r : rows) {
    if (name.find(r.match) == std::string::npos) continue;
    if (*r.not_match && name.find(r.not_match) != std::string::npos) continue;
    const double v = precision == "fp32"                          ? r.fp32
                     : precision == "bf16" || precision == "fp16" ? r.bf16
                     : precision == "fp8"                         ? r.fp8
                                                                  : 0.0;
    if (v > 0) return v;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace accel::bench
