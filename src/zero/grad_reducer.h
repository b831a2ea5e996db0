// accel::zero::GradReducer — the one path every gradient reduction takes: fixed-order buckets of
// flat gradient buffers, launched asynchronously as soon as they (and every bucket before them) are
// ready, so reduction overlaps the rest of backward; flush() launches the rest and waits.
//
// Buckets launch in the same fixed order on every rank whatever order backward makes gradients ready
// in (a collective order that depended on timing could deadlock). Modes:
//   AllReduce           grad_full averaged in place (DDP / NO_SHARD)
//   ReduceScatterInPlace this rank's slice of grad_full := its average; the rest of grad_full is left
//                        unreduced (ZeRO-1: the optimizer needs only its slice)
//   ReduceScatter       a separate shard_size() tensor := the average of this rank's slice
//                        (ZeRO-2/3, FSDP); grad_full may then be freed
// With a replicate group (HYBRID_SHARD), the reduced shards are then averaged across it.
// Fusion: all-reduce buckets keep their flats' gradients in one contiguous buffer (bound at
// construction) and reduce it in place; a bucket of one flat in the reduce dtype reduces it
// directly; otherwise through one staging buffer (rank-major for reduce-scatter), cast to the reduce
// dtype. Back-pressure: at most `in_flight` buckets hold full gradients at once, counting the one
// being filled, so launching a bucket first finishes (waits for) the oldest while more than
// in_flight - 1 would stay launched. That bounds the full gradients and staging buffers alive during
// backward to in_flight buckets (ReduceScatter frees each bucket's full gradients when it finishes or,
// when staged, at launch). Node-shared gradient buffers (ReduceScatter on one node's shared memory,
// `node_shared_grads`): each rank has room for in_flight + 1 of the largest reduce-scatter inputs in one
// shared-memory object of the group. A flat reduced alone (a direct bucket) takes its full gradient from
// it (grad_buffer), a bucket of several its staging copy, so the reduce-scatter's peers read it where it
// lies instead of through the transport's buffers. Each piece is taken first-fit and is free again once
// nothing refers to it (its bucket finished); where none fits, the gradient or staging copy is
// allocated privately. Waiting inside backward is safe only if every rank launches the same
// buckets at the same point of its backward relative to the other collectives it issues there: the
// engine guarantees that (under sharded parameters it marks flats ready only at each unit's end of
// backward, never earlier). A group of one rank reduces nothing inside the group: its flats' own
// gradients are the results (averaged across the copies in flush() where there is a replicate group).
#pragma once

#include "base/memory.h"
#include "comm/communicator.h"
#include "sharding/flat_param.h"

#include <functional>
#include <memory>
#include <vector>

namespace accel::zero {

class GradReducer {
 public:
  enum class Mode { AllReduce, ReduceScatterInPlace, ReduceScatter };

  // flats: the flat parameters whose gradients are reduced, in launch order. reduce_dtype: the wire
  // dtype. shard: the group the layouts split over; replicate: null or the cross-node group.
  // in_flight: buckets alive at once, counting the one being filled (>= 1).
  // node_shared_grads: this rank asks for node-shared gradient buffers (collective: they exist only
  // where every rank of the shard group asks and the group shares a node's memory; CPU, ReduceScatter).
  GradReducer(std::vector<sharding::FlatParam*> flats, Mode mode, c10::ScalarType reduce_dtype,
              std::shared_ptr<comm::Communicator> shard, std::shared_ptr<comm::Communicator> replicate,
              std::int64_t bucket_bytes, int in_flight, bool node_shared_grads = false);

  // Flat i (index into flats) has all its gradients in grad_full(), or in `sum`: launch what is
  // launchable. sum: the flat's whole gradient, in the reduce dtype, where it is not grad_full() (a
  // window of micro-steps summed wider than the gradients, in fp32 under bf16/fp16 compute); it is
  // reduced instead, as
  // grad_full() would be, and held until its bucket's reduction needs it no more. The parameters'
  // .grad (AllReduce) then show the average copied back into grad_full(). (Not for flats of a fused
  // all-reduce bucket: their gradients are in the reduce dtype already.)
  void mark_ready(std::size_t i, at::Tensor sum = {});
  c10::ScalarType reduce_dtype() const { return dtype_; }
  // A free node-shared buffer for flat i's full gradient (FlatParam::alloc_grad(in)), or undefined:
  // none exist, flat i is not reduced alone in the reduce dtype, or every buffer is in use.
  at::Tensor grad_buffer(std::size_t i);
  // Bytes of node-shared gradient buffers of this rank (0: none).
  std::int64_t node_shared_grad_bytes() const;
  // Launches every bucket not launched yet (all flats must be marked ready first), waits for all,
  // finishes the replicate-group averaging and resets for the next backward. Returns, per flat, the
  // reduced gradient: grad_full() or the sum reduced in its place (AllReduce), its own-slice view
  // (ReduceScatterInPlace; a copy of it from a sum) or a fresh shard tensor in the reduce dtype
  // (ReduceScatter). Reduced in a wider dtype than the gradients (staged), the result stays in that
  // dtype; a group of one gives its gradient converted to the reduce dtype where that is wider.
  std::vector<at::Tensor> flush();

  // Forgets a backward that did not finish (it threw): waits for what was launched, drops it all.
  void abandon();

  // Called with (flat index, reduced gradient) as soon as a flat's result is final, in launch order,
  // before flush() returns it: inside backward for the buckets that back-pressure finishes early
  // (after the replicate-group averaging under HYBRID_SHARD, inside flush()). The engine starts the
  // device-to-host copy of a gradient whose master lives in host memory there, and adds it to a
  // gradient pending from an earlier micro-step. Returning true takes the gradient (ReduceScatter
  // only): the reducer then lets go of its memory at once (the flat's full gradient, or the bucket's
  // output once every member is taken), and flush() returns an undefined tensor for it. So under
  // optimizer offload no reduced gradient stays on the device, and a window of micro-steps that reduce
  // holds one shard of gradients.
  void set_on_reduced(std::function<bool(std::size_t, const at::Tensor&)> f) { on_reduced_ = std::move(f); }
  // Whether on_reduced will add flat i's result to a gradient pending from an earlier micro-step (and
  // take it), asked at launch: a bucket all of whose members will reduces into a scratch instead of
  // an output of its own (the pending gradients are most often its kept output).
  void set_adds_to_pending(std::function<bool(std::size_t)> f) { adds_to_pending_ = std::move(f); }

  // Lets go of the scratch outputs (the window of micro-steps is over: the next forward need not hold
  // them; the next window allocates them again).
  void release_scratch() { scratch_.clear(); }
  // A replicate group of more than one rank: results are final only after its averages, in flush().
  bool averages_across() const { return replicate_ != nullptr; }

  std::size_t num_buckets() const { return buckets_.size(); }
  // Flat i's bucket has been launched in this backward (its gradients are no longer to be added to).
  bool launched(std::size_t i) const { return buckets_[bucket_of_[i]].launched; }
  // Collectives one sync backward issues: on the shard group and on the replicate group.
  std::size_t collectives_per_backward() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<std::size_t> members;  // indices into flats_
    std::size_t ready = 0;
    bool launched = false;
    at::Tensor buffer;  // all-reduce fusion: the members' contiguous gradient buffer
    at::Tensor staging_in, staging_out;
    // The last backward's reduce-scatter output, kept to be written again by the next one when
    // nothing refers to it any more (the step consumed it and zero_grad dropped it): a fresh buffer
    // every step cost page faults and zeroing of its pages, 20% of a 0.59B ZeRO-2 step's CPU time.
    // It is the sharded gradient ZeRO's formulas count as resident (4Ψ/N).
    at::Tensor kept_out;
    bool out_is_kept = false;  // this backward's output is kept_out (not a scratch)
    comm::WorkPtr work;
  };
  void launch(Bucket& b);
  void reset();  // ready for the next backward
  void finish(Bucket& b);
  void notify(Bucket& b);                         // on_reduced_ for its members
  bool take(std::size_t m, const at::Tensor& g);  // on_reduced_ for one flat; true: taken (memory let go)
  // a scratch where the engine adds the result to a pending gradient; else kept_out when free, or a
  // new kept_out
  at::Tensor output(Bucket& b, std::int64_t numel, const at::TensorOptions& options);
  void let_go_of_output(Bucket& b);  // every member's result went elsewhere
  // Flat m's full gradient as it is reduced: the sum mark_ready was given, else grad_full().
  const at::Tensor& input(std::size_t m) const;
  void let_go_of_input(std::size_t m);  // ReduceScatter: the reduction needs it no more
  // A view of free node-shared memory, or undefined.
  at::Tensor free_buffer(std::int64_t numel);

  std::vector<sharding::FlatParam*> flats_;
  Mode mode_;
  std::size_t in_flight_ = 2;
  c10::ScalarType dtype_;
  std::shared_ptr<comm::Communicator> shard_, replicate_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<char> marked_;
  std::vector<at::Tensor> sums_;  // per flat: mark_ready's sum (undefined: grad_full())
  std::vector<at::Tensor> results_;
  std::size_t next_launch_ = 0, next_finish_ = 0;
  std::function<bool(std::size_t, const at::Tensor&)> on_reduced_;
  std::function<bool(std::size_t)> adds_to_pending_;
  // Outputs for buckets whose kept_out is still referenced by the gradients pending from an earlier
  // micro-step, which their results are added to as each bucket is reduced (adds_to_pending_), the
  // output then let go of. Each as large as the largest bucket's output; at most in_flight of them are
  // kept, reused once nothing refers to them, until release_scratch(). (Not under a replicate group,
  // whose results are held until flush(): the engine adds them at the end of backward.)
  std::vector<at::Tensor> scratch_;
  std::int64_t largest_out_ = 0;
  // Node-shared gradient buffers: this rank's part of the group's object, the pieces handed out (each with a storage of
  // its own: free once nothing else refers to it), by offset, and which flats may take one.
  struct Piece {
    std::int64_t offset, numel;
    at::Tensor memory;
  };
  at::Tensor shared_;
  std::shared_ptr<memory::ExternalCharge>
      pool_charge_;  // this rank's part counted as gradients, the pool as the node's
  std::vector<Piece> pieces_;
  std::vector<char> takes_buffer_;
};

}  // namespace accel::zero
