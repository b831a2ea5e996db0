// Communicator: local argument checks, traffic counters and the choice of backend by device; the
// backends (mpi_backend.cpp, nccl_backend.cpp) move the bytes.
#include "comm/communicator.h"
#include "base/log.h"

#include "comm/cuda_comm.h"
#include "comm/dtype.h"
#include "comm/transport/backend.h"
#include "comm/transport/hierarchical.h"
#include "comm/transport/mpi/mpi_backend.h"
#include "comm/transport/nccl/nccl_backend.h"
#include "comm/transport/staged/staged_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace accel::comm {
namespace {

std::string describe(Collective kind, const at::Tensor& t, ReduceOp op, int root) {
  std::string s = fmt::format("{}(", to_string(kind));
  if (t.defined()) s += fmt::format("{}[{}]", dtype_name(t.scalar_type()), t.numel());
  if (kind == Collective::AllReduce || kind == Collective::ReduceScatter) s += fmt::format(", {}", to_string(op));
  if (kind == Collective::Broadcast) s += fmt::format(", root {}", root);
  s += ")";
  return s;
}

[[noreturn]] void bad(Collective kind, const std::string& msg) {
  throw InvalidArgument(fmt::format("{}: {}", to_string(kind), msg));
}

void check_tensor(Collective kind, const at::Tensor& t, const char* role) {
  if (!t.defined()) bad(kind, fmt::format("{} tensor is undefined", role));
  if (!t.is_contiguous())
    bad(kind, fmt::format("{} tensor is not contiguous (sizes {}, strides {}); call .contiguous() first", role,
                          c10::str(t.sizes()), c10::str(t.strides())));
  if (classify(t.scalar_type()) == DtypeClass::Unsupported)
    bad(kind, fmt::format("{} dtype {} is not supported; supported: {}", role, dtype_name(t.scalar_type()),
                          supported_dtypes()));
}

}  // namespace

std::shared_ptr<Communicator> Communicator::world() {
  // One world per process while someone holds it; created again (collectively) after release.
  static std::mutex mu;
  static std::weak_ptr<Communicator> cached;
  std::lock_guard<std::mutex> lk(mu);
  if (auto w = cached.lock()) return w;
  auto mpi = MpiBackend::world();
  auto topo = std::make_shared<const Topology>(mpi->read_topology());
  std::shared_ptr<Communicator> w(
      new Communicator(std::move(mpi), std::move(topo), std::make_shared<std::atomic<bool>>(false)));
  cached = w;
  log::set_rank(w->rank(), w->size());  // every library log line names its rank from now on
  return w;
}

Communicator::Communicator(std::unique_ptr<MpiBackend> mpi, std::shared_ptr<const Topology> topo,
                           std::shared_ptr<std::atomic<bool>> broken)
    : mpi_(std::move(mpi)), topo_(std::move(topo)), broken_(std::move(broken)) {
  rank_ = mpi_->rank();
  size_ = mpi_->size();
  cpu_ = make_cpu_transport(*mpi_, *topo_);  // collective over the group
}

Communicator::~Communicator() {
  cuda_.reset();  // before the MPI group it was bootstrapped from and the CPU transport it may stage over
  cpu_.reset();
}

const Topology& Communicator::topology() const { return *topo_; }

Backend& Communicator::backend_for(const at::Tensor& t) {
  if (!t.defined() || t.is_cpu()) return cpu_ ? *cpu_ : static_cast<Backend&>(*mpi_);
  if (t.is_cuda()) {
    int dev = t.get_device();
    if (!cuda_) {
      cuda_ = make_cuda_backend(t);
      cuda_device_ = dev;
    } else if (dev != cuda_device_) {
      throw InvalidArgument(fmt::format(
          "tensor on cuda:{} but this communicator's CUDA collectives ({}) use cuda:{} (one device per rank)", dev,
          cuda_->name(), cuda_device_));
    }
    return *cuda_;
  }
  throw InvalidArgument(fmt::format("no backend for device {} (CPU: shm/mpi, CUDA: nccl/host)", t.device().str()));
}

std::unique_ptr<Backend> Communicator::make_cuda_backend(const at::Tensor& t) {
  // Every rank's GPU and wish, so that all ranks decide alike (a bad value on one rank fails them all).
  struct Mine {
    char uuid[16];
    int wish;      // CudaComm, or -1: ACCEL_CUDA_COMM is bad here
    int by_count;  // ranks_sharing_by_count (a rank that does not know its UUID)
  } mine{};
  const std::string uuid = cuda_device_uuid(t.get_device());
  std::memcpy(mine.uuid, uuid.data(), std::min(uuid.size(), sizeof mine.uuid));
  mine.by_count = ranks_sharing_by_count(topology(), cuda_device_count(), uuid);
  std::string bad;
  try {
    mine.wish = static_cast<int>(cuda_comm_requested());
  } catch (const InvalidArgument& e) {
    mine.wish = -1;
    bad = e.what();
  }
  std::vector<Mine> all(size_);
  mpi_->allgather_bytes(&mine, sizeof mine, all.data());
  std::string uuids;
  for (int q = 0; q < size_; ++q) {
    if (all[q].wish != all[0].wish)
      throw InvalidArgument(
          fmt::format("ACCEL_CUDA_COMM differs between ranks 0 and {}: set it alike on every rank", q));
    uuids.append(all[q].uuid, sizeof all[q].uuid);
  }
  int sharing = ranks_sharing_a_gpu(uuids);
  for (const Mine& m : all) sharing = std::max(sharing, m.by_count);
  if (all[0].wish < 0) throw InvalidArgument(bad.empty() ? "ACCEL_CUDA_COMM is not one of auto, nccl, host" : bad);
  const CudaCommChoice choice = choose_cuda_comm(static_cast<CudaComm>(all[0].wish), nccl_compiled(), sharing);
  std::unique_ptr<Backend> b;
  if (choice.comm == CudaComm::Nccl)
    b = make_nccl_backend(*mpi_, t.get_device());
  else
    b = make_staged_backend(cpu_ ? *cpu_ : static_cast<Backend&>(*mpi_), t.device());
  if (rank_ == 0)
    log::info(fmt::format("collectives on CUDA tensors of a group of {}: {} ({})", size_, b->name(), choice.why));
  return b;
}

const char* Communicator::backend_name(const at::Tensor& t) { return backend_for(t).name(); }

WorkPtr Communicator::submit(Collective kind, const at::Tensor& input, const at::Tensor& output, ReduceOp op, int root,
                             Duration timeout, bool blocking) {
  if (broken_->load())
    throw CommError(fmt::format("{} on rank {}: the communicator is broken by an earlier timeout; the job must restart",
                                to_string(kind), rank_));
  const long long n = size_;
  if (kind != Collective::Barrier) {
    check_tensor(kind, input, "input");
    check_tensor(kind, output, "output");
    if (input.scalar_type() != output.scalar_type())
      bad(kind, fmt::format("input dtype {} differs from output dtype {}", dtype_name(input.scalar_type()),
                            dtype_name(output.scalar_type())));
    if (input.device() != output.device())
      bad(kind, fmt::format("input on {} but output on {}", input.device().str(), output.device().str()));
  }
  const DtypeClass cls = input.defined() ? classify(input.scalar_type()) : DtypeClass::Integer;
  switch (kind) {
    case Collective::AllReduce:
    case Collective::ReduceScatter:
      if (cls == DtypeClass::Fp8)
        bad(kind, fmt::format("{} cannot be reduced: fp8 travels as bytes (all_gather, broadcast); reduce in bf16/fp32",
                              dtype_name(input.scalar_type())));
      if (op == ReduceOp::Avg && cls == DtypeClass::Integer)
        bad(kind, fmt::format("avg needs a floating dtype, got {}", dtype_name(input.scalar_type())));
      if (kind == Collective::AllReduce) {
        if (input.numel() != output.numel())
          bad(kind, fmt::format("input has {} elements but output {}", input.numel(), output.numel()));
        if (!input.is_same(output) && input.data_ptr() != output.data_ptr() && overlaps(input, output))
          bad(kind, "input and output overlap partially");
      } else {
        if (input.numel() != n * output.numel())
          bad(kind, fmt::format("input must have world_size ({}) x output elements: input {}, output {}", n,
                                input.numel(), output.numel()));
        const char* own = static_cast<const char*>(input.data_ptr()) + rank_ * output.nbytes();
        if (overlaps(input, output) && output.data_ptr() != own)
          bad(kind, "output overlaps input but is not this rank's slice of it");
      }
      break;
    case Collective::AllGather: {
      if (output.numel() != n * input.numel())
        bad(kind, fmt::format("output must have world_size ({}) x input elements: input {}, output {}", n,
                              input.numel(), output.numel()));
      const char* own = static_cast<const char*>(output.data_ptr()) + rank_ * input.nbytes();
      if (overlaps(input, output) && input.data_ptr() != own)
        bad(kind, "input overlaps output but is not this rank's slice of it");
      break;
    }
    case Collective::Broadcast:
      if (root < 0 || root >= size_)
        bad(kind, fmt::format("root {} is not a rank of this group (0..{})", root, size_ - 1));
      break;
    case Collective::Barrier: break;
  }

  Backend& backend = backend_for(input);
  if (timeout <= Duration::zero()) timeout = default_timeout();
  auto work = std::make_shared<Work>(describe(kind, input, op, root), rank_, size_, timeout);
  if (log::enabled(log::Level::Debug))  // (every collective of every rank: ACCEL_LOG_LEVEL=debug only)
    log::debug(fmt::format("{} over {} in a group of {}", work->what(), backend.name(), size_));
  work->keep_alive(std::make_shared<std::pair<at::Tensor, at::Tensor>>(input, output));
  work->set_wait_sink(wait_ns_);
  std::weak_ptr<std::atomic<bool>> broken = broken_;
  work->set_on_timeout([broken] {
    if (auto b = broken.lock()) b->store(true);
    MpiBackend::mark_broken();
  });

  {
    std::lock_guard<std::mutex> lk(counters_mu_);
    CollectiveCount& c = counters_[kind];
    c.calls += 1;
    const std::uint64_t in = input.defined() ? input.nbytes() : 0, out = output.defined() ? output.nbytes() : 0;
    if (kind == Collective::Broadcast) {
      (rank_ == root ? c.bytes_sent : c.bytes_received) += in;
    } else {
      c.bytes_sent += in;
      c.bytes_received += out;
    }
  }

  Request r;
  r.kind = kind;
  r.input = input;
  r.output = output;
  r.op = op;
  r.root = root;
  r.work = work;
  r.caller_waits = blocking;
  backend.enqueue(std::move(r));
  return work;
}

WorkPtr Communicator::all_reduce_async(const at::Tensor& t, const AllReduceOptions& o) {
  return submit(Collective::AllReduce, t, t, o.op, 0, o.timeout);
}
WorkPtr Communicator::all_reduce_async(const at::Tensor& in, const at::Tensor& out, const AllReduceOptions& o) {
  return submit(Collective::AllReduce, in, out, o.op, 0, o.timeout);
}
void Communicator::all_reduce(const at::Tensor& t, const AllReduceOptions& o) {
  submit(Collective::AllReduce, t, t, o.op, 0, o.timeout, true)->wait();
}
void Communicator::all_reduce(const at::Tensor& in, const at::Tensor& out, const AllReduceOptions& o) {
  submit(Collective::AllReduce, in, out, o.op, 0, o.timeout, true)->wait();
}

WorkPtr Communicator::reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, const ReduceScatterOptions& o) {
  return submit(Collective::ReduceScatter, in, out, o.op, 0, o.timeout);
}
void Communicator::reduce_scatter(const at::Tensor& in, const at::Tensor& out, const ReduceScatterOptions& o) {
  submit(Collective::ReduceScatter, in, out, o.op, 0, o.timeout, true)->wait();
}

WorkPtr Communicator::all_gather_async(const at::Tensor& in, const at::Tensor& out, const AllGatherOptions& o) {
  return submit(Collective::AllGather, in, out, ReduceOp::Sum, 0, o.timeout);
}
void Communicator::all_gather(const at::Tensor& in, const at::Tensor& out, const AllGatherOptions& o) {
  submit(Collective::AllGather, in, out, ReduceOp::Sum, 0, o.timeout, true)->wait();
}

WorkPtr Communicator::broadcast_async(const at::Tensor& t, const BroadcastOptions& o) {
  return submit(Collective::Broadcast, t, t, ReduceOp::Sum, o.root, o.timeout);
}
void Communicator::broadcast(const at::Tensor& t, const BroadcastOptions& o) {
  submit(Collective::Broadcast, t, t, ReduceOp::Sum, o.root, o.timeout, true)->wait();
}

WorkPtr Communicator::barrier_async(const BarrierOptions& o) {
  return submit(Collective::Barrier, at::Tensor(), at::Tensor(), ReduceOp::Sum, 0, o.timeout);
}
void Communicator::barrier(const BarrierOptions& o) {
  submit(Collective::Barrier, at::Tensor(), at::Tensor(), ReduceOp::Sum, 0, o.timeout, true)->wait();
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  if (broken_->load()) throw CommError("split: the communicator is broken by an earlier timeout");
  auto sub = mpi_->split(color, key);
  if (!sub) return nullptr;
  return std::shared_ptr<Communicator>(new Communicator(std::move(sub), topo_, broken_));
}

std::shared_ptr<Communicator> Communicator::node_local() {
  if (size_ != topo_->world_size) throw InvalidArgument("node_local: only the world communicator knows nodes");
  if (!node_local_) node_local_ = split(topo_->node_rank, topo_->local_rank);
  return node_local_;
}

std::shared_ptr<Communicator> Communicator::cross_node() {
  if (size_ != topo_->world_size) throw InvalidArgument("cross_node: only the world communicator knows nodes");
  if (!cross_node_) cross_node_ = split(topo_->local_rank, topo_->node_rank);
  return cross_node_;
}

void Communicator::make_blocks(int n) {
  if (size_ != topo_->world_size) throw InvalidArgument("block: only the world communicator cuts itself into blocks");
  if (n < 1 || size_ % n != 0)
    throw InvalidArgument(fmt::format("block: {} ranks do not cut into blocks of {}", size_, n));
  if (blocks_.count(n)) return;
  auto mine = split(rank_ / n, rank_);
  auto across = split(rank_ % n, rank_);
  blocks_.emplace(n, std::make_pair(std::move(mine), std::move(across)));
}

std::shared_ptr<Communicator> Communicator::block(int n) {
  make_blocks(n);
  return blocks_.at(n).first;
}

std::shared_ptr<Communicator> Communicator::across_blocks(int n) {
  make_blocks(n);
  return blocks_.at(n).second;
}

void Communicator::abandon(const std::string& why) {
  log::error(fmt::format("{}: this rank cannot follow its peers any more; the job ends when this process exits", why));
  broken_->store(true);
  MpiBackend::mark_broken();
}

Counters Communicator::counters() const {
  std::lock_guard<std::mutex> lk(counters_mu_);
  Counters c = counters_;
  c.wait_seconds = static_cast<double>(wait_ns_->load()) * 1e-9;
  return c;
}

void Communicator::reset_counters() {
  std::lock_guard<std::mutex> lk(counters_mu_);
  counters_ = Counters{};
  wait_ns_->store(0);
}

}  // namespace accel::comm
