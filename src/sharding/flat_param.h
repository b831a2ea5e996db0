// accel::sharding::FlatParam — one unit's parameters (of one optimizer param group) flattened into
// one padded buffer, sharded by a ShardLayout over the ranks of a shard group.
//
// Every original parameter is re-pointed in place (same TensorImpl, same autograd identity, same
// name) at its view into full(): module members, named_parameters() and optimizers' references keep
// working. The buffer's storage can be freed and re-allocated in place (free_full/alloc_full) while
// the views stay valid. While it is freed, any access to a parameter's data (a read such as p.sum(),
// p.clone() or p.data_ptr(), or a write) throws c10::Error with freed_parameter_message(): it names
// get_state_dict / save_model, and no kernel ever sees the freed memory.
//
// Gradients live in a second padded buffer, grad_full(), with the same layout. take_grad(i) moves what
// autograd accumulated into params[i].grad into its view and points .grad at that view, so later
// backward passes accumulate in place.
//
// The buffers are written through their own TensorImpls (never the parameters'), so gathering into
// them does not bump the parameters' version counters (autograd's saved tensors stay valid).
// Not thread-safe; one thread drives forward and backward.
#pragma once

#include "base/memory.h"
#include "sharding/shard_layout.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::sharding {

class FlatParam {
 public:
  struct Options {
    int rank = 0;                         // rank within the shard group
    int world = 1;                        // shard group size (the layout's world)
    c10::ScalarType dtype = c10::kFloat;  // compute dtype of the flat buffer
    std::int64_t align = 1;
    // true: this rank keeps only its shard at rest (own buffer); full() is allocated while gathered.
    // false: full() is always allocated and shard() is a view into it.
    bool sharded = false;
    // Sharded only: where the whole buffer lives instead, for good. Called once with (padded(), dtype);
    // a tensor that every rank of the shard group maps (Communicator::node_shared_empty), or undefined
    // for the usual private buffers. The ranks' shards side by side in it ARE the full buffer
    // (node_buffer()): shard() is this rank's view of it, and each rank writes only its own shard (the
    // constructor too). full() still has a storage of its own, which alloc_full() points at the buffer
    // (nothing allocated, nothing to gather) and free_full() frees as it frees a private one: the
    // parameters throw between steps alike. Ordering one rank's writes against the others' reads is
    // the caller's (a barrier after the step's writes, and before them).
    std::function<at::Tensor(std::int64_t numel, c10::ScalarType dtype)> node_shared;
  };

  // params: leaf tensors of one dtype family and device, each at most once. Their values are copied
  // into the flat buffer, then they become views into it.
  FlatParam(std::string name, std::vector<at::Tensor> params, std::vector<std::string> names, Options opts);

  const std::string& name() const { return name_; }
  const ShardLayout& layout() const { return layout_; }
  const Options& options() const { return opts_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  bool requires_grad() const { return requires_grad_; }
  std::int64_t numel() const { return layout_.total(); }

  // --- parameters ------------------------------------------------------------------------------
  const at::Tensor& full() const { return full_; }    // padded() elements; storage freed when !gathered()
  const at::Tensor& shard() const { return shard_; }  // shard_size() elements, always allocated
  bool gathered() const;
  // The whole buffer lives in memory the shard group shares (Options::node_shared): gathering is
  // pointing full() at it.
  bool node_shared() const { return node_shared_; }
  // Node-shared: the buffer every rank of the group maps, whole values readable at any time (the
  // peers' writes ordered by the caller); undefined otherwise.
  const at::Tensor& node_buffer() const { return node_buffer_; }
  // Node-shared only (else a no-op): the buffer becomes this rank's own copy of its values now (shard()
  // and every other view of it follow), and full() is gathered into that copy; the mapping goes once
  // nothing views it. Not collective: the caller orders it after the peers' writes. From then on the
  // flat is not node-shared and its full() is gathered, with shard() a view of it (not a buffer of its
  // own): the caller keeps it gathered (the engine marks such flats persistent, all-gathered in place).
  void make_private();
  // Gives full() storage again (contents undefined until filled, e.g. by an all-gather; node-shared:
  // the buffer's values, nothing to fill). No-op if gathered.
  void alloc_full();
  // Returns full()'s storage to the allocator (sharded only). The parameter views stay valid objects;
  // touching their data throws freed_parameter_message() until alloc_full().
  void free_full();
  // Copies the own shard into its place in full() (e.g. after the shard was updated on this rank).
  void shard_to_full();
  // Moves the buffers (and the parameters, re-pointed at their views) to `device`: what has memory
  // is copied there, what is freed stays freed (a freed shard then throws `freed_shard_message` on
  // access until its storage is given memory again, on the device). Before any gradient exists;
  // not for node-shared flats. No-op where it is already.
  void move_to(c10::Device device, const std::string& freed_shard_message);

  // --- gradients -------------------------------------------------------------------------------
  const at::Tensor& grad_full() const { return grad_full_; }
  bool grad_allocated() const;
  // Makes grad_full() this view of a caller's buffer (e.g. a fused reduction bucket, so the bucket
  // needs no staging copy). Before any gradient exists; free_grad() then only detaches (the buffer is
  // the caller's).
  void bind_grad(const at::Tensor& buffer);
  // Allocates grad_full() (no-op if allocated). Only the padding is zeroed: each parameter's region
  // is the caller's to fill (take_grad without accumulate, or zero_grad_of). With `in` (a contiguous
  // tensor of at least padded() elements in grad_full's dtype and device), grad_full's storage is
  // in's memory until free_grad(): its data pointer holds a reference to `in`, so in's storage stays
  // referenced exactly as long as this window (a gradient buffer handed out from a pool, e.g.).
  void alloc_grad(const at::Tensor& in = at::Tensor());
  // Detaches the parameters' .grad and returns grad_full()'s storage (not a bound one's).
  void free_grad();
  // Moves params[i].grad into its view of grad_full() (copy, or add when `accumulate`), and points
  // .grad at the view. No-op if .grad already is the view or is undefined.
  void take_grad(std::size_t i, bool accumulate);
  // Zeros params[i]'s region of grad_full().
  void zero_grad_of(std::size_t i);
  bool grad_is_view(std::size_t i) const;
  // params' .grad := their views of grad_full() / those that are such views := undefined.
  void attach_grads();
  void detach_grads();
  // Zeros the elements of grad_full() that belong to no parameter.
  void zero_grad_padding();

 private:
  std::string name_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  Options opts_;
  ShardLayout layout_;
  bool requires_grad_ = false;
  bool node_shared_ = false;
  bool grad_bound_ = false;  // bind_grad
  // Node-shared: this rank's shard counted as its parameters, the whole buffer as the node's.
  std::shared_ptr<memory::ExternalCharge> shared_charge_;
  at::Tensor full_, shard_, grad_full_;
  at::Tensor node_buffer_;  // node-shared: the group's one buffer (full_ points into it while gathered)
  std::vector<at::Tensor> grad_views_;
};

// Frees / re-allocates a tensor's storage in place (every view of it sees the change). The storage's
// own allocator is used, so a counting allocator sees both. Without access_error the freed storage has
// size 0 and a null pointer. With access_error it keeps its size (views of it can still be made) and
// any access to its data, reads included, throws c10::Error with that message instead of handing out
// the null pointer, until alloc_storage gives it memory again.
void free_storage(const at::Tensor& t, std::optional<std::string> access_error = std::nullopt);
void alloc_storage(const at::Tensor& t, std::size_t nbytes);
// Whether t's storage has memory (not freed, with or without an access_error).
bool storage_allocated(const at::Tensor& t);
// Whether t's storage is freed with an access_error (its data throws when touched).
bool storage_throws_on_access(const at::Tensor& t);
// What a FlatParam's parameters throw while its full() is freed: names the flat and its parameters, and
// Accelerator::get_state_dict / save_model, the ways to see sharded weights whole.
std::string freed_parameter_message(const std::string& flat, const std::vector<std::string>& names);
// A new tensor (own TensorImpl, own version counter, not an autograd view) over t's memory: same
// storage, offset, sizes and strides.
at::Tensor storage_alias(const at::Tensor& t);

}  // namespace accel::sharding
