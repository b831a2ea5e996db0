#include "zero/grad_reducer.h"
#include "base/check.h"
#include "base/log.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace accel::zero {
namespace {
// Pieces of node-shared gradient memory start on 64-byte boundaries (16 elements of up to 4 bytes).
std::int64_t round_up(std::int64_t numel) { return (numel + 15) / 16 * 16; }
}  // namespace

GradReducer::GradReducer(std::vector<sharding::FlatParam*> flats, Mode mode, c10::ScalarType reduce_dtype,
                         std::shared_ptr<comm::Communicator> shard, std::shared_ptr<comm::Communicator> replicate,
                         std::int64_t bucket_bytes, int in_flight, bool node_shared_grads)
    : flats_(std::move(flats)),
      mode_(mode),
      in_flight_(static_cast<std::size_t>(in_flight)),
      dtype_(reduce_dtype),
      shard_(std::move(shard)),
      replicate_(std::move(replicate)) {
  ACCEL_CHECK(in_flight >= 1, "GradReducer: in_flight must be >= 1, got {}", in_flight);
  if (replicate_ && replicate_->size() == 1) replicate_.reset();
  const std::int64_t esize = c10::elementSize(dtype_);
  std::int64_t in_bucket = 0;
  bucket_of_.resize(flats_.size());
  for (std::size_t i = 0; i < flats_.size(); ++i) {
    std::int64_t bytes = flats_[i]->layout().padded() * esize;
    if (buckets_.empty() || in_bucket + bytes > bucket_bytes) {
      buckets_.emplace_back();
      in_bucket = 0;
    }
    buckets_.back().members.push_back(i);
    in_bucket += bytes;
    bucket_of_[i] = buckets_.size() - 1;
  }
  // All-reduce buckets of several flats in the reduce dtype: their gradients live in one contiguous
  // buffer (DDP's gradient_as_bucket_view), reduced in place with no staging copy.
  if (mode_ == Mode::AllReduce)
    for (auto& b : buckets_) {
      if (b.members.size() < 2) continue;
      bool fits = true;
      std::int64_t total = 0;
      for (auto m : b.members) {
        fits = fits && !flats_[m]->grad_full().defined() && flats_[m]->full().scalar_type() == dtype_;
        total += flats_[m]->layout().padded();
      }
      if (!fits) continue;
      b.buffer = at::empty({total}, flats_[b.members[0]]->full().options());
      std::int64_t at = 0;
      for (auto m : b.members) {
        flats_[m]->bind_grad(b.buffer.narrow(0, at, flats_[m]->layout().padded()));
        at += flats_[m]->layout().padded();
      }
    }
  if (shard_->rank() == 0 && log::enabled(log::Level::Debug)) {
    std::string sizes;
    for (const auto& b : buckets_) {
      std::int64_t bytes = 0;
      for (auto m : b.members) bytes += flats_[m]->layout().padded() * esize;
      sizes += fmt::format("{}{} flat(s) {:.2f} MiB", sizes.empty() ? "" : ", ", b.members.size(),
                           static_cast<double>(bytes) / 1048576);
    }
    log::debug(fmt::format("gradient buckets ({}, {}, up to {} B each, {} in flight): {}",
                           mode_ == Mode::AllReduce              ? "all-reduce"
                           : mode_ == Mode::ReduceScatterInPlace ? "reduce-scatter in place"
                                                                 : "reduce-scatter",
                           c10::toString(dtype_), bucket_bytes, in_flight, sizes));
  }
  marked_.assign(flats_.size(), 0);
  sums_.resize(flats_.size());
  results_.resize(flats_.size());
  for (const auto& b : buckets_) {
    std::int64_t out = 0;
    for (auto m : b.members) out += flats_[m]->layout().shard_size();
    largest_out_ = std::max(largest_out_, out);
  }

  // Node-shared gradient buffers, sized for the largest reduce-scatter input: a flat reduced alone in
  // the reduce dtype, or a bucket's staging copy. Every rank reaches the collective below or none
  // does: the flats, mode and group are the same on every rank.
  takes_buffer_.assign(flats_.size(), 0);
  std::int64_t most = 0;
  if (mode_ == Mode::ReduceScatter && shard_->size() > 1)
    for (const auto& b : buckets_) {
      sharding::FlatParam* f = flats_[b.members[0]];
      if (!f->full().is_cpu()) continue;
      if (b.members.size() == 1 && f->full().scalar_type() == dtype_) {
        takes_buffer_[b.members[0]] = 1;
        most = std::max(most, f->layout().padded());
      } else {
        std::int64_t per_rank = 0;
        for (auto m : b.members) per_rank += flats_[m]->layout().shard_size();
        most = std::max(most, per_rank * shard_->size());
      }
    }
  if (most == 0) return;
  const std::int64_t n = shard_->size();
  const std::int64_t capacity = (static_cast<std::int64_t>(in_flight_) + 1) * round_up(most);
  at::Tensor pool = shard_->node_shared_empty(n * capacity, dtype_, node_shared_grads);
  if (!pool.defined()) {
    takes_buffer_.assign(flats_.size(), 0);
    return;
  }
  shared_ = pool.narrow(0, shard_->rank() * capacity, capacity);
  pool_charge_ =
      std::make_shared<memory::ExternalCharge>(memory::Category::Gradients, static_cast<std::int64_t>(shared_.nbytes()),
                                               static_cast<std::int64_t>(pool.nbytes()));
}

at::Tensor GradReducer::grad_buffer(std::size_t i) {
  if (!takes_buffer_.at(i)) return {};
  return free_buffer(flats_[i]->layout().padded());
}

at::Tensor GradReducer::free_buffer(std::int64_t numel) {
  if (!shared_.defined() || numel <= 0) return {};
  // Pieces nothing else refers to any more are free again.
  pieces_.erase(std::remove_if(pieces_.begin(), pieces_.end(),
                               [](const Piece& p) { return p.memory.storage().use_count() == 1; }),
                pieces_.end());
  const std::int64_t need = round_up(numel);
  std::int64_t at = 0;
  std::size_t pos = 0;
  for (; pos < pieces_.size() && pieces_[pos].offset - at < need; ++pos) at = pieces_[pos].offset + pieces_[pos].numel;
  if (at + need > shared_.numel()) return {};
  // A storage of its own over the piece (each keeps the object mapped): its use count says when it is free.
  at::Tensor whole = shared_;
  at::Tensor memory = at::from_blob(
      static_cast<char*>(shared_.data_ptr()) + at * shared_.element_size(), {need}, [whole](void*) {},
      shared_.options());
  pieces_.insert(pieces_.begin() + static_cast<std::ptrdiff_t>(pos), Piece{at, need, memory});
  return memory.narrow(0, 0, numel);  // a view: it counts as a reference to the piece's storage
}

std::int64_t GradReducer::node_shared_grad_bytes() const {
  return shared_.defined() ? static_cast<std::int64_t>(shared_.nbytes()) : 0;
}

const at::Tensor& GradReducer::input(std::size_t m) const {
  return sums_[m].defined() ? sums_[m] : flats_[m]->grad_full();
}

void GradReducer::let_go_of_input(std::size_t m) {
  flats_[m]->free_grad();
  sums_[m] = at::Tensor();
}

void GradReducer::mark_ready(std::size_t i, at::Tensor sum) {
  if (marked_.at(i)) return;
  marked_[i] = 1;
  if (sum.defined()) {
    ACCEL_CHECK(sum.numel() == flats_[i]->layout().padded() && sum.is_contiguous() && sum.scalar_type() == dtype_ &&
                    !buckets_[bucket_of_[i]].buffer.defined(),
                "GradReducer: the sum of {} must be a contiguous {} tensor of {} elements, outside a fused bucket",
                flats_[i]->name(), c10::toString(dtype_), flats_[i]->layout().padded());
    sums_[i] = std::move(sum);
  }
  buckets_[bucket_of_[i]].ready++;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].members.size()) {
    // Back-pressure: at most in_flight buckets hold full gradients, the one being filled included.
    // Launching a staged bucket briefly holds it twice (its flats' gradients and the staging copy),
    // so the oldest finish first; what stays launched afterwards is at most in_flight - 1.
    const std::size_t before = in_flight_ >= 2 ? in_flight_ - 2 : 0;
    while (next_launch_ - next_finish_ > before) finish(buckets_[next_finish_++]);
    launch(buckets_[next_launch_++]);
    while (next_launch_ - next_finish_ > in_flight_ - 1) finish(buckets_[next_finish_++]);
  }
}

void GradReducer::launch(Bucket& b) {
  const int n = shard_->size();
  b.launched = true;
  // A group of one reduces nothing: each flat's own buffer is the result (averaged across the copies in
  // flush() where there are some), with no collective over a group of one.
  if (n == 1) return;
  const bool direct = b.members.size() == 1 && input(b.members[0]).scalar_type() == dtype_;
  if (mode_ == Mode::AllReduce) {
    if (b.buffer.defined()) {
      b.work = shard_->all_reduce_async(b.buffer, {comm::ReduceOp::Avg});
    } else if (direct) {
      b.work = shard_->all_reduce_async(input(b.members[0]), {comm::ReduceOp::Avg});
    } else {
      std::vector<at::Tensor> parts;
      for (auto m : b.members) parts.push_back(input(m));
      b.staging_in = at::cat(parts).to(dtype_);
      for (auto m : b.members) sums_[m] = at::Tensor();  // (the staging copy is the reduction's input)
      b.work = shard_->all_reduce_async(b.staging_in, {comm::ReduceOp::Avg});
    }
  } else if (direct) {
    sharding::FlatParam* f = flats_[b.members[0]];
    const at::Tensor& in = input(b.members[0]);
    auto [begin, end] = f->layout().shard_range(f->options().rank);
    b.staging_out =
        mode_ == Mode::ReduceScatterInPlace ? in.narrow(0, begin, end - begin) : output(b, end - begin, in.options());
    b.work = shard_->reduce_scatter_async(in, b.staging_out, {comm::ReduceOp::Avg});
  } else {
    // Rank-major staging: [flat0 chunk r, flat1 chunk r, ...] for r = 0..n-1.
    std::int64_t per_rank = 0;
    for (auto m : b.members) per_rank += flats_[m]->layout().shard_size();
    const bool shareable = mode_ == Mode::ReduceScatter && input(b.members[0]).is_cpu();
    b.staging_in = shareable ? free_buffer(per_rank * n) : at::Tensor();
    if (!b.staging_in.defined()) b.staging_in = at::empty({per_rank * n}, input(b.members[0]).options().dtype(dtype_));
    for (int r = 0; r < n; ++r) {
      std::int64_t at = r * per_rank;
      for (auto m : b.members) {
        std::int64_t k = flats_[m]->layout().shard_size();
        b.staging_in.narrow(0, at, k).copy_(input(m).narrow(0, r * k, k));
        at += k;
      }
    }
    // ZeRO-2/3: the staging copy is all the reduction needs; the full gradients can go now.
    if (mode_ == Mode::ReduceScatter)
      for (auto m : b.members) let_go_of_input(m);
    b.staging_out = output(b, per_rank, b.staging_in.options());
    b.work = shard_->reduce_scatter_async(b.staging_in, b.staging_out, {comm::ReduceOp::Avg});
  }
}

at::Tensor GradReducer::output(Bucket& b, std::int64_t numel, const at::TensorOptions& options) {
  auto fits = [&](const at::Tensor& t) {
    return t.defined() && t.numel() >= numel && t.dtype() == options.dtype() && t.device() == options.device();
  };
  // Nothing else refers to it: no view, no gradient pending or held by the user.
  auto unused = [](const at::Tensor& t) { return t.use_count() == 1 && t.storage().use_count() == 1; };
  const at::Tensor& k = b.kept_out;
  // A result the engine adds to the gradients pending from an earlier micro-step of the window as soon
  // as it is reduced (letting go of it) goes to a scratch, so that the window holds one shard of
  // gradients and not two: those pending gradients are most often the kept output itself.
  const bool added =
      !replicate_ && on_reduced_ && adds_to_pending_ &&
      std::all_of(b.members.begin(), b.members.end(), [&](std::size_t m) { return adds_to_pending_(m); });
  if (!added) {
    // Anything else (no accumulation; a kept output a user still refers to) gets the kept output when
    // it is free, else a new one, as a backward without accumulation does.
    b.out_is_kept = true;
    if (fits(k) && k.numel() == numel && unused(k)) return k;
    b.kept_out = at::empty({numel}, options);
    return b.kept_out;
  }
  // (A kept output nothing refers to here, left by the flush of a backward that failed while a window
  // was kept, goes: the pending gradients hold the window.)
  if (k.defined() && unused(k)) b.kept_out = at::Tensor();
  b.out_is_kept = false;
  for (const auto& t : scratch_)
    if (fits(t) && unused(t)) return t.narrow(0, 0, numel);
  // (Past in_flight of them, which back-pressure does not reach: one for the once.)
  const bool pooled = scratch_.size() < in_flight_;
  at::Tensor t = at::empty({pooled ? std::max(largest_out_, numel) : numel}, options);
  if (pooled) scratch_.push_back(t);
  return t.narrow(0, 0, numel);
}

namespace {
// a's dtype holds b's values and more (fp32 against bf16/fp16).
bool wider(c10::ScalarType a, c10::ScalarType b) { return a != b && c10::promoteTypes(a, b) == a; }
bool wider(const at::Tensor& a, const at::Tensor& b) { return wider(a.scalar_type(), b.scalar_type()); }
}  // namespace

void GradReducer::finish(Bucket& b) {
  if (!b.work) {  // a group of one rank: the flat's own gradient (a sum is in the reduce dtype already)
    ACCEL_CHECK(shard_->size() == 1, "GradReducer: bucket finished without a reduction in a group of {}",
                shard_->size());
    for (auto m : b.members) {
      const at::Tensor& in = input(m);
      const bool convert = wider(dtype_, in.scalar_type());
      results_[m] = convert ? in.to(dtype_) : in;
      if (mode_ == Mode::AllReduce && sums_[m].defined()) flats_[m]->grad_full().copy_(in);  // what .grad shows
      // ZeRO-2/3: the converted copy is the result; the gradient buffer can go.
      if (convert && mode_ == Mode::ReduceScatter) let_go_of_input(m);
    }
    notify(b);
    return;
  }
  b.work->wait();
  b.work.reset();
  if (mode_ == Mode::AllReduce && !b.staging_in.defined()) {
    for (auto m : b.members) {
      results_[m] = input(m);
      if (sums_[m].defined()) flats_[m]->grad_full().copy_(sums_[m]);  // what .grad shows
    }
  } else if (mode_ == Mode::AllReduce) {
    std::int64_t at = 0;
    for (auto m : b.members) {
      const at::Tensor& g = flats_[m]->grad_full();
      at::Tensor piece = b.staging_in.narrow(0, at, g.numel());
      g.copy_(piece);  // what the parameters' .grad shows
      // Reduced in a wider dtype than the gradients (bf16 compute, fp32 reduction): the result
      // stays in it, so the master is not fed a rounded copy.
      results_[m] = wider(piece, g) ? piece : g;
      at += g.numel();
    }
  } else if (b.members.size() == 1 && !b.staging_in.defined()) {
    const std::size_t m = b.members[0];
    // ZeRO-1 reduced a sum in place: its own slice, copied, so that the rest of the sum can go.
    results_[m] = mode_ == Mode::ReduceScatterInPlace && sums_[m].defined() ? b.staging_out.clone() : b.staging_out;
    // ZeRO-2/3: reduce-scattered straight from the full gradient, which nothing needs any more.
    if (mode_ == Mode::ReduceScatter) let_go_of_input(m);
  } else {
    std::int64_t at = 0;
    for (auto m : b.members) {
      sharding::FlatParam* f = flats_[m];
      std::int64_t k = f->layout().shard_size();
      at::Tensor piece = b.staging_out.narrow(0, at, k);
      if (mode_ == Mode::ReduceScatterInPlace && !wider(piece, f->grad_full())) {
        auto [begin, end] = f->layout().shard_range(f->options().rank);
        at::Tensor own = f->grad_full().narrow(0, begin, end - begin);
        own.copy_(piece);
        results_[m] = own;
      } else {
        results_[m] = piece;  // views of the bucket's output: no copy
      }
      at += k;
    }
  }
  b.staging_in = at::Tensor();
  b.staging_out = at::Tensor();
  notify(b);
}

void GradReducer::notify(Bucket& b) {
  if (!on_reduced_ || replicate_) return;  // with a replicate group the result is final in flush()
  bool all = true;
  for (auto m : b.members)
    if (take(m, results_[m]))
      results_[m] = at::Tensor();
    else
      all = false;
  if (all) let_go_of_output(b);
}

void GradReducer::let_go_of_output(Bucket& b) {
  // Every member's result went elsewhere: the bucket's output is not kept for the next backward (a
  // scratch stays, for the next bucket).
  if (b.out_is_kept) b.kept_out = at::Tensor();
}

bool GradReducer::take(std::size_t m, const at::Tensor& g) {
  if (!on_reduced_(m, g) || mode_ != Mode::ReduceScatter) return false;
  // A group of one reduces nothing: its result was the flat's own full gradient.
  if (g.is_alias_of(input(m)) || g.is_alias_of(flats_[m]->grad_full())) let_go_of_input(m);
  return true;
}

void GradReducer::reset() {
  for (auto& b : buckets_) {
    b.staging_in = at::Tensor();
    b.staging_out = at::Tensor();
    b.ready = 0;
    b.launched = false;
  }
  marked_.assign(flats_.size(), 0);
  sums_.assign(flats_.size(), at::Tensor());
  results_.assign(flats_.size(), at::Tensor());
  next_launch_ = 0;
  next_finish_ = 0;
}

void GradReducer::abandon() {
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {  // the backward is being abandoned already; its first error is what propagates
    }
    b.work.reset();
  }
  reset();
}

std::vector<at::Tensor> GradReducer::flush() {
  for (std::size_t i = 0; i < flats_.size(); ++i)
    ACCEL_CHECK(marked_[i], "GradReducer::flush: flat parameter {} not marked ready", flats_[i]->name());
  while (next_finish_ < buckets_.size()) finish(buckets_[next_finish_++]);
  std::vector<at::Tensor> out = std::move(results_);
  if (replicate_) {
    // HYBRID_SHARD: the node-group averages are averaged across nodes (equal node sizes: the global mean).
    std::vector<comm::WorkPtr> works;
    for (auto& t : out) works.push_back(replicate_->all_reduce_async(t, {comm::ReduceOp::Avg}));
    for (auto& w : works) w->wait();
    if (on_reduced_) {
      for (std::size_t i = 0; i < out.size(); ++i)
        if (take(i, out[i])) out[i] = at::Tensor();
      for (auto& b : buckets_) {
        bool all = true;
        for (auto m : b.members) all = all && !out[m].defined();
        if (all) let_go_of_output(b);
      }
    }
  }
  reset();
  return out;
}

}  // namespace accel::zero
