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
// dtype. At most kMaxInFlight buckets are in flight: launching another first finishes the oldest,
// which bounds staging memory (where waiting is allowed; otherwise only once it has completed). A group of one rank
// (and no replicate group) reduces nothing.
#pragma once

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
  // may_wait_in_backward: false when ranks depend on each other during backward (ZeRO-3 gathers):
  // a rank whose gradients became ready earlier must then never block on a reduction the others
  // launch only at the end of their backward.
  GradReducer(std::vector<sharding::FlatParam*> flats, Mode mode, c10::ScalarType reduce_dtype,
              std::shared_ptr<comm::Communicator> shard, std::shared_ptr<comm::Communicator> replicate,
              std::int64_t bucket_bytes, bool may_wait_in_backward);

  // Flat i (index into flats) has all its gradients in grad_full(): launch what is launchable.
  void mark_ready(std::size_t i);
  // Launches every bucket not launched yet (all flats must be marked ready first), waits for all,
  // finishes the replicate-group averaging and resets for the next backward. Returns, per flat, the
  // reduced gradient: grad_full() (AllReduce), its own-slice view (ReduceScatterInPlace) or a fresh
  // shard tensor in the reduce dtype (ReduceScatter).
  std::vector<at::Tensor> flush();

  // Forgets a backward that did not finish (it threw): waits for what was launched, drops it all.
  void abandon();

  std::size_t num_buckets() const { return buckets_.size(); }
  // Collectives one sync backward issues: on the shard group and on the replicate group.
  std::size_t collectives_per_backward() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<std::size_t> members;  // indices into flats_
    std::size_t ready = 0;
    bool launched = false;
    at::Tensor buffer;  // all-reduce fusion: the members' contiguous gradient buffer
    at::Tensor staging_in, staging_out;
    comm::WorkPtr work;
  };
  static constexpr std::size_t kMaxInFlight = 2;
  void launch(Bucket& b);
  void reset();  // ready for the next backward
  void finish(Bucket& b);

  std::vector<sharding::FlatParam*> flats_;
  Mode mode_;
  bool may_wait_ = true;
  c10::ScalarType dtype_;
  std::shared_ptr<comm::Communicator> shard_, replicate_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<char> marked_;
  std::vector<at::Tensor> results_;
  std::size_t next_launch_ = 0, next_finish_ = 0;
};

}  // namespace accel::zero
