// accel::init_empty_weights() — build a model whose parameters take no memory until
// load_checkpoint_and_dispatch (dispatch.h) loads them: Accelerate's init_empty_weights, in C++.
//
//   std::shared_ptr<Llama> model;
//   {
//     auto empty = accel::init_empty_weights();
//     model = std::make_shared<Llama>(config);
//     empty.release(*model);          // what is outside the units, too
//   }
//   // or in one line:  auto model = accel::make_empty<Llama>(config);
//
// How, in libtorch C++: a Python module can be built on the meta device, but a C++ module allocates
// and initialises its parameters in its constructor, on the CPU, and a meta tensor can never become
// a CPU or CUDA tensor in place (Tensor::set_data refuses the key change), so the module's members
// would keep pointing at meta tensors. Instead, while the scope lives on this thread, each accel
// unit's parameters are freed the moment the unit is marked (right after it was built: the
// sharding layer's unit-built observer, as sharded construction does), keeping their TensorImpl,
// shape, dtype, name and autograd identity; release(model) frees every other parameter. A freed
// parameter throws (c10::Error, naming this scope) when its data is touched, until loading gives it
// storage again (Tensor::set_data: on the CPU, or a CUDA device, or a memory-mapped file).
//
// Limits:
//   - Building still allocates and initialises each parameter once: the peak during construction is
//     the parameters outside units (embeddings, heads: freed by release()) plus the largest unit,
//     not zero. After release() the parameters hold no memory at all.
//   - Buffers are kept (as Accelerate's default include_buffers=False): a buffer that the
//     constructor computes (rotary tables) stays valid; one the checkpoint holds is overwritten.
//   - The scope is per thread; under sharded construction (ShardedInit) it is refused.
// A model whose constructor takes TensorOptions can instead be built on the meta device
// (models/llama.h does: nothing is allocated at all); load_checkpoint_and_dispatch fills either.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>

namespace torch::nn {
class Module;
}

namespace accel {

class EmptyWeights {
 public:
  EmptyWeights();
  ~EmptyWeights();
  EmptyWeights(const EmptyWeights&) = delete;
  EmptyWeights& operator=(const EmptyWeights&) = delete;

  // Frees every parameter of `model` that still holds storage (those outside units). Idempotent.
  void release(torch::nn::Module& model);

  std::int64_t units_released() const { return units_; }
  std::int64_t bytes_released() const { return bytes_; }  // parameter bytes freed so far

  // The scope active on this thread, or null.
  static EmptyWeights* active();

 private:
  friend struct EmptyWeightsObserver;
  void release_params(torch::nn::Module& m);
  std::int64_t units_ = 0, bytes_ = 0;
  void* previous_observer_ = nullptr;
  EmptyWeights* previous_ = nullptr;
};

// The scope (guaranteed copy elision: `auto scope = accel::init_empty_weights();`).
inline EmptyWeights init_empty_weights() { return EmptyWeights(); }

// Builds M(args...) under the scope and releases all of its parameters.
template <class M, class... Args>
std::shared_ptr<M> make_empty(Args&&... args) {
  EmptyWeights scope;
  auto m = std::make_shared<M>(std::forward<Args>(args)...);
  scope.release(*m);
  return m;
}

// Whether p holds no values (freed by this scope or by sharding, or a meta tensor, and not loaded since).
bool is_empty_weight(const at::Tensor& p);

}  // namespace accel
