#include "sharding/flat_param.h"
#include "base/check.h"
#include "base/error.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace accel::sharding {
namespace {

// c10::StorageImpl can be told to throw a message of ours on every access to its data, reads included
// (release_data_and_set_meta_custom_data_ptr_error_msg_: data(), data_ptr(), mutable_data() all check
// throw_on_immutable_data_ptr_), but it has no call that lifts this again, and the flag is private. An
// explicit instantiation may name a private member ([temp.spec.general]/6), and this one hands the
// pointer to that member to throw_flag() below, once. alloc_storage clears the flag through it.
bool c10::StorageImpl::*throw_flag();
template <bool c10::StorageImpl::*Member>
struct ThrowFlag {
  friend bool c10::StorageImpl::*throw_flag() { return Member; }
};
template struct ThrowFlag<&c10::StorageImpl::throw_on_immutable_data_ptr_>;

std::vector<std::int64_t> numels_of(const std::vector<at::Tensor>& ps) {
  std::vector<std::int64_t> n;
  for (const auto& p : ps) n.push_back(p.numel());
  return n;
}

}  // namespace

// Writes through such an alias do not touch the version counter of the parameter views (which
// autograd checks for saved tensors).
at::Tensor storage_alias(const at::Tensor& t) {
  c10::NoGradGuard ng;
  at::Tensor a = at::empty({0}, t.options());
  a.set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
  return a;
}

void free_storage(const at::Tensor& t, std::optional<std::string> access_error) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  if (!access_error) {
    s->set_nbytes(0);
    return;
  }
  // The size stays, so that views made now (p.view(-1), p[0], p.t()) pass ATen's bounds checks and
  // throw the message too when read, instead of a bounds error that names nothing.
  s->release_data_and_set_meta_custom_data_ptr_error_msg_(std::move(access_error));
}

void alloc_storage(const at::Tensor& t, std::size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  ACCEL_CHECK(s->resizable() && s->allocator(), "cannot re-allocate a storage that is not resizable");
  s->*throw_flag() = false;  // before set_data_ptr_noswap, which then re-derives the storage's fast-path check
  // (The CUDA allocator allocates on the current device: the tensor's, whichever this thread has.)
  const c10::DeviceGuard on_device(t.device());
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

namespace {
// t's storage holds in's memory (nbytes of it) until it is freed or pointed elsewhere: its data
// pointer keeps a reference to in, so in's storage lives exactly as long.
void point_storage_at(const at::Tensor& t, const at::Tensor& in, std::size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->*throw_flag() = false;
  auto* keep = new at::Tensor(in);
  s->set_data_ptr_noswap(c10::DataPtr(
      in.data_ptr(), keep, [](void* ctx) { delete static_cast<at::Tensor*>(ctx); }, s->device()));
  s->set_nbytes(nbytes);
}
}  // namespace

bool storage_throws_on_access(const at::Tensor& t) {
  return t.defined() && t.storage().unsafeGetStorageImpl()->*throw_flag();
}

bool storage_allocated(const at::Tensor& t) {
  return t.defined() && t.storage().nbytes() > 0 && !storage_throws_on_access(t);
}

std::string freed_parameter_message(const std::string& flat, const std::vector<std::string>& names) {
  std::string which = names.empty() ? std::string("(none)") : names[0];
  if (names.size() > 1) which += fmt::format(" and {} more", names.size() - 1);
  return fmt::format(
      "accel: this parameter is sharded (ZeRO-3 / FULL_SHARD) and has no storage between steps: only its shape is "
      "left, its values live as shards across the ranks (flat parameter {}: {}). Read or save the full weights "
      "with accelerator.get_state_dict() or accelerator.save_model(model, dir) (both collective), not through the "
      "tensors of unwrap_model(model)->named_parameters()",
      flat, which);
}

FlatParam::FlatParam(std::string name, std::vector<at::Tensor> params, std::vector<std::string> names, Options opts)
    : name_(std::move(name)),
      params_(std::move(params)),
      names_(std::move(names)),
      opts_(opts),
      layout_(numels_of(params_), opts.world, opts.align) {
  if (params_.size() != names_.size()) throw accel::InvalidArgumentError("FlatParam: one name per parameter");
  if (opts.rank < 0 || opts.rank >= opts.world)
    throw accel::InvalidArgumentError("FlatParam: rank outside the shard group");
  c10::NoGradGuard no_grad;
  at::TensorOptions to = at::TensorOptions().dtype(opts.dtype);
  if (!params_.empty()) to = to.device(params_[0].device());
  auto [begin, end] = layout_.shard_range(opts.rank);
  if (opts.sharded && opts.node_shared && to.device().is_cpu()) {
    node_buffer_ = opts.node_shared(layout_.padded(), opts.dtype);
    ACCEL_CHECK(!node_buffer_.defined() ||
                    (node_buffer_.numel() == layout_.padded() && node_buffer_.scalar_type() == opts.dtype &&
                     node_buffer_.is_cpu() && node_buffer_.is_contiguous()),
                "FlatParam {}: Options::node_shared returned a tensor of the wrong shape, dtype or device", name_);
  }
  node_shared_ = node_buffer_.defined();
  if (node_shared_) {
    shared_charge_ = std::make_shared<memory::ExternalCharge>(memory::Category::Parameters,
                                                              (end - begin) * node_buffer_.element_size(),
                                                              static_cast<std::int64_t>(node_buffer_.nbytes()));
    // full() is a storage of its own that points into the shared buffer while gathered, and throws
    // like a private one's when freed: the parameters are views of it, never of the buffer itself.
    full_ = at::empty({0}, to);
    full_.unsafeGetTensorImpl()->set_sizes_contiguous({layout_.padded()});
    point_storage_at(full_, node_buffer_, node_buffer_.nbytes());
  } else {
    full_ = at::zeros({layout_.padded()}, to);
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.is_leaf())
      throw accel::InvalidArgumentError(fmt::format("FlatParam: parameter {} is not a leaf tensor", names_[i]));
    requires_grad_ = requires_grad_ || p.requires_grad();
    const std::int64_t off = layout_.offset(i), n = p.numel();
    if (node_shared_) {  // only this rank's shard: the peers write theirs
      const std::int64_t lo = std::max(off, begin), hi = std::min(off + n, end);
      if (lo < hi) node_buffer_.narrow(0, lo, hi - lo).copy_(p.reshape({-1}).narrow(0, lo - off, hi - lo));
      continue;
    }
    at::Tensor view = full_.narrow(0, off, n).view(p.sizes());
    view.copy_(p);
  }
  // Re-point the parameters last: a parameter listed twice would otherwise read its own new view.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    at::Tensor view = storage_alias(full_).narrow(0, layout_.offset(i), p.numel()).view(p.sizes());
    p.set_data(view);
  }
  if (node_shared_) {
    shard_ = node_buffer_.narrow(0, begin, end - begin);
    free_full();
  } else if (opts.sharded) {
    shard_ = full_.narrow(0, begin, end - begin).clone();
    free_full();
  } else {
    shard_ = full_.narrow(0, begin, end - begin);
  }
}

void FlatParam::make_private() {
  if (!node_shared_) return;
  // The buffer's storage takes a private copy of its values (shard() and every other view of it
  // follow), then full() points at that copy: the mapping goes once nothing views it.
  at::Tensor copy = node_buffer_.clone();
  c10::StorageImpl* mine = copy.storage().unsafeGetStorageImpl();
  node_buffer_.storage().unsafeGetStorageImpl()->set_data_ptr_noswap(
      mine->set_data_ptr(c10::DataPtr(nullptr, mine->device())));
  point_storage_at(full_, node_buffer_, node_buffer_.nbytes());
  node_buffer_ = at::Tensor();
  node_shared_ = false;
  shared_charge_.reset();  // (the private copy is counted as it was allocated)
}

void FlatParam::move_to(c10::Device device, const std::string& freed_shard_message) {
  if (full_.device() == device) return;
  ACCEL_CHECK(!node_shared_ && !grad_full_.defined(), "FlatParam {}: move_to needs a private flat without gradients",
              name_);
  c10::NoGradGuard no_grad;
  const at::TensorOptions on = full_.options().device(device);
  // A freed buffer arrives freed: a storage of its size without memory, never allocated on the device.
  // Its access guard comes after the parameters' views are made (on CUDA, set_ reads the storage's
  // data pointer, which a guarded storage refuses); the views share the storage and so the guard.
  auto freed = [&](std::int64_t numel) {
    at::Tensor t = at::empty({0}, on);
    t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
    free_storage(t, std::nullopt);
    t.storage().unsafeGetStorageImpl()->set_nbytes(static_cast<std::size_t>(numel) * t.element_size());
    return t;
  };
  auto [begin, end] = layout_.shard_range(opts_.rank);
  const bool full_freed = !storage_allocated(full_);
  const bool shard_freed = opts_.sharded && !storage_allocated(shard_);
  at::Tensor full = full_freed ? freed(layout_.padded()) : full_.to(on);
  at::Tensor shard = !opts_.sharded ? full.narrow(0, begin, end - begin)
                     : shard_freed  ? freed(end - begin)
                                    : shard_.to(on);
  full_ = full;
  shard_ = shard;
  for (std::size_t i = 0; i < params_.size(); ++i)
    params_[i].set_data(storage_alias(full_).narrow(0, layout_.offset(i), params_[i].numel()).view(params_[i].sizes()));
  if (full_freed) free_storage(full_, freed_parameter_message(name_, names_));
  if (shard_freed) free_storage(shard_, freed_shard_message);
}

bool FlatParam::gathered() const { return storage_allocated(full_) || layout_.padded() == 0; }

void FlatParam::alloc_full() {
  if (gathered()) return;
  if (node_shared_)
    point_storage_at(full_, node_buffer_, node_buffer_.nbytes());
  else
    alloc_storage(full_, layout_.padded() * full_.element_size());
}

void FlatParam::free_full() {
  ACCEL_CHECK(opts_.sharded, "FlatParam {}: free_full on an unsharded parameter", name_);
  if (storage_allocated(full_)) free_storage(full_, freed_parameter_message(name_, names_));
}

void FlatParam::shard_to_full() {
  auto [begin, end] = layout_.shard_range(opts_.rank);
  if (opts_.sharded && !node_shared_) full_.narrow(0, begin, end - begin).copy_(shard_);
}

bool FlatParam::grad_allocated() const {
  return storage_allocated(grad_full_) || (grad_full_.defined() && layout_.padded() == 0);
}

void FlatParam::bind_grad(const at::Tensor& buffer) {
  ACCEL_CHECK(!grad_full_.defined(), "FlatParam {}: bind_grad after gradients exist", name_);
  if (buffer.numel() != layout_.padded() || !buffer.is_contiguous())
    throw accel::InvalidArgumentError(
        fmt::format("FlatParam {}: bind_grad needs a contiguous buffer of {} elements", name_, layout_.padded()));
  grad_full_ = buffer;
  grad_bound_ = true;
  for (std::size_t i = 0; i < params_.size(); ++i)
    grad_views_.push_back(grad_full_.narrow(0, layout_.offset(i), params_[i].numel()).view(params_[i].sizes()));
  zero_grad_padding();
}

void FlatParam::alloc_grad(const at::Tensor& in) {
  if (grad_allocated()) return;
  const std::size_t nbytes = layout_.padded() * full_.element_size();
  if (in.defined())
    ACCEL_CHECK(in.is_contiguous() && in.numel() >= layout_.padded() && in.scalar_type() == full_.scalar_type() &&
                    in.device() == full_.device(),
                "FlatParam {}: alloc_grad needs a contiguous {} buffer of >= {} elements on {}", name_,
                c10::toString(full_.scalar_type()), layout_.padded(), full_.device().str());
  const bool first = !grad_full_.defined();
  if (first) {
    grad_full_ = at::empty({in.defined() ? 0 : layout_.padded()}, full_.options());
    if (in.defined()) grad_full_.unsafeGetTensorImpl()->set_sizes_contiguous({layout_.padded()});
  }
  if (in.defined()) {  // (before any view is made: views check their bounds against the storage)
    point_storage_at(grad_full_, in, nbytes);
  } else if (!storage_allocated(grad_full_)) {
    alloc_storage(grad_full_, nbytes);
  }
  if (first)
    for (std::size_t i = 0; i < params_.size(); ++i)
      grad_views_.push_back(grad_full_.narrow(0, layout_.offset(i), params_[i].numel()).view(params_[i].sizes()));
  zero_grad_padding();
}

void FlatParam::zero_grad_padding() {
  std::int64_t at = 0;
  for (std::size_t i = 0; i <= params_.size(); ++i) {
    std::int64_t next = i < params_.size() ? layout_.offset(i) : layout_.padded();
    if (next > at) grad_full_.narrow(0, at, next - at).zero_();
    if (i < params_.size()) at = layout_.offset(i) + params_[i].numel();
  }
}

void FlatParam::free_grad() {
  detach_grads();
  if (!grad_bound_ && storage_allocated(grad_full_)) free_storage(grad_full_);
}

bool FlatParam::grad_is_view(std::size_t i) const {
  const at::Tensor& g = params_[i].grad();
  return g.defined() && grad_views_.size() > i && g.is_alias_of(grad_views_[i]) &&
         g.data_ptr() == grad_views_[i].data_ptr();
}

void FlatParam::take_grad(std::size_t i, bool accumulate) {
  at::Tensor& p = params_[i];
  const at::Tensor& g = p.grad();
  if (!g.defined() || grad_is_view(i)) return;
  c10::NoGradGuard no_grad;
  at::Tensor& dst = grad_views_[i];
  if (accumulate)
    dst.add_(g);
  else if (dst.is_cpu() && g.is_cpu() && dst.scalar_type() == g.scalar_type() && dst.is_contiguous() &&
           g.is_contiguous() && dst.sizes() == g.sizes())
    // memcpy rather than copy_: on a 39 MB gradient (one rank's thread) 12.6 GB/s against 9.5 here.
    std::memcpy(dst.data_ptr(), g.data_ptr(), dst.nbytes());
  else
    dst.copy_(g);
  p.mutable_grad() = dst;
}

void FlatParam::zero_grad_of(std::size_t i) { grad_views_[i].zero_(); }

void FlatParam::attach_grads() {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].requires_grad()) params_[i].mutable_grad() = grad_views_[i];
}

void FlatParam::detach_grads() {
  // Only .grad that are views of grad_full: a gradient autograd has just produced (a hook may run
  // this mid-backward) is not ours to drop.
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (grad_is_view(i)) params_[i].mutable_grad() = at::Tensor();
}

}  // namespace accel::sharding
