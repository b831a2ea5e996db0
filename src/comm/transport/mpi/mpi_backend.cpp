// MPI transport. One progress thread (the Engine) makes every MPI call after MPI_Init_thread, so
// non-blocking collectives advance while callers compute, and MPI needs only MPI_THREAD_SERIALIZED.
#include "comm/transport/mpi/mpi_backend.h"

#include "base/env.h"
#include "comm/dtype.h"
#include "comm/signature.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <mpi.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <string_view>
#include <thread>

#include <sys/prctl.h>

namespace accel::comm {
namespace {

[[noreturn]] void mpi_fail(const char* call, int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  throw CommError(fmt::format("{} failed: {}", call, std::string_view(buf, len)));
}
#define ACCEL_MPI_CHECK(call)                     \
  do {                                            \
    int rc_ = (call);                             \
    if (rc_ != MPI_SUCCESS) mpi_fail(#call, rc_); \
  } while (0)

std::atomic<bool> g_broken{false};
std::atomic<bool> g_engine_alive{false};

// One group of ranks: three duplicates of one MPI communicator (see mpi_backend.h).
struct Group {
  MPI_Comm data = MPI_COMM_NULL, check = MPI_COMM_NULL, control = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

struct Op {
  Request req;
  std::shared_ptr<Group> group;
  enum class State { Checking, Ready, Running } state = State::Ready;
  long long sig[2 * kNumSig] = {};  // [max-fields | negated fields]: one MPI_MAX gives max and -min
  long long sig_all[2 * kNumSig] = {};
  MPI_Request check_req = MPI_REQUEST_NULL;
  MPI_Request data_req = MPI_REQUEST_NULL;
  at::Tensor send, recv;       // the buffers handed to MPI (staging copies where needed)
  bool in_place = false;       // MPI_IN_PLACE: send is unused
  std::function<void()> post;  // on the engine after completion: copy back, divide for avg
  // On the engine as the collective starts (its `after` and `ready` done): the fp32 staging copy of a
  // 16-bit input, which may not be read sooner (a copy from a GPU still landing, an earlier step's output).
  std::function<void()> stage;
};

MPI_Datatype reduce_type(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble: return MPI_DOUBLE;
    case c10::kFloat: return MPI_FLOAT;
    case c10::kInt: return MPI_INT32_T;
    case c10::kLong: return MPI_INT64_T;
    case c10::kByte: return MPI_UINT8_T;
    default: throw InvalidArgument(fmt::format("mpi: no reduction type for {}", dtype_name(t)));
  }
}

MPI_Op reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

int checked_count(long long n, const char* what) {
  if (n > INT_MAX)
    throw InvalidArgument(fmt::format("mpi: {} of {} exceeds MPI's int count limit; split the tensor", what, n));
  return static_cast<int>(n);
}

// The progress thread. Owns every MPI call between MPI_Init_thread and MPI_Finalize.
class Engine {
 public:
  static Engine& get() {
    static Engine engine;
    return engine;
  }

  void submit(std::unique_ptr<Op> op) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      incoming_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

  // Runs f on the engine thread and waits for it (blocking MPI calls: split, control broadcasts).
  template <class F>
  auto call(F f) -> decltype(f()) {
    using R = decltype(f());
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(f));
    auto fut = task->get_future();
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.emplace_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return fut.get();
  }

  const Group& world_group() const { return world_; }

 private:
  Engine() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      ACCEL_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      if (provided < MPI_THREAD_SERIALIZED)
        throw CommError(fmt::format(
            "mpi: the MPI library provides thread level {}; accel needs MPI_THREAD_SERIALIZED or better", provided));
      owns_mpi_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world_.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_.size);
    world_.data = MPI_COMM_WORLD;
    check_enabled_ = env::get_int("ACCEL_COMM_CHECK") != 0;
    g_engine_alive = true;
    thread_ = std::thread([this] { loop(); });
  }

  ~Engine() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    g_engine_alive = false;
    if (!owns_mpi_) return;
    if (g_broken || !active_.empty()) {
      // A collective timed out or never finished: finalizing would hang on the missing peers. (Plain
      // stderr, not the logger: this runs while the process exits, possibly after the logger is gone.)
      std::fprintf(stderr, "accel: rank %d aborting the MPI job: a collective did not complete\n", world_.rank);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
  }

  // Polls without progress before yielding the core, and before sleeping between polls.
  static constexpr int kSpinPolls = 64, kYieldPolls = 2000;

  void loop() {
    // Sleeps of a few microseconds, not the default 50 us timer slack.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    int empty_polls = 0;
    for (;;) {
      std::deque<std::unique_ptr<Op>> fresh;
      std::deque<std::function<void()>> tasks;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (active_.empty()) cv_.wait(lk, [&] { return stop_ || !incoming_.empty() || !tasks_.empty(); });
        if (stop_ && incoming_.empty() && tasks_.empty()) {
          // At exit: finish what is in flight, but never wait longer than one collective timeout.
          if (stop_deadline_ == Clock::time_point{}) stop_deadline_ = Clock::now() + exit_grace_;
          if (active_.empty() || g_broken) return;
          if (Clock::now() > stop_deadline_) {
            g_broken = true;  // the destructor aborts the job instead of finalizing
            return;
          }
        }
        fresh.swap(incoming_);
        tasks.swap(tasks_);
      }
      for (auto& t : tasks) t();
      for (auto& op : fresh) begin(std::move(op));
      if (advance()) {
        empty_polls = 0;
      } else if (++empty_polls > kSpinPolls + kYieldPolls) {
        // Nothing moved for a while: sleep so waiting ranks leave the cores to working ones.
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      } else if (empty_polls > kSpinPolls) {
        std::this_thread::yield();
      }
    }
  }

  // (A request of a non-blocking collective may not be freed or cancelled; failures happen only
  // before one starts or after it completed.)
  void fail(Op& op, std::exception_ptr e) { complete(op, std::move(e)); }

  // Drops every tensor reference the op holds, then finishes its Work: once wait() returns, the
  // progress thread frees nothing of the caller's behind its back (memory counts stay exact).
  void complete(Op& op, std::exception_ptr e = nullptr) {
    WorkPtr work = std::move(op.req.work);
    op.req.input = at::Tensor();
    op.req.output = at::Tensor();
    op.req.then = nullptr;
    op.req.after.clear();
    op.send = at::Tensor();
    op.recv = at::Tensor();
    op.post = nullptr;
    op.stage = nullptr;
    work->finish(std::move(e));
  }

  void begin(std::unique_ptr<Op> op) {
    if (check_enabled_ && op->group->size > 1 && !op->req.skip_check) {
      op->state = Op::State::Checking;
      int rc =
          MPI_Iallreduce(op->sig, op->sig_all, 2 * kNumSig, MPI_LONG_LONG, MPI_MAX, op->group->check, &op->check_req);
      if (rc != MPI_SUCCESS) {
        try {
          mpi_fail("MPI_Iallreduce (argument check)", rc);
        } catch (...) {
          fail(*op, std::current_exception());
        }
        return;
      }
    }
    active_.push_back(std::move(op));
  }

  // One pass over the active collectives; true when anything changed state.
  bool advance() {
    bool progressed = false;
    std::vector<const Group*> blocked;  // groups with an earlier collective not yet started
    auto is_blocked = [&](const Group* g) { return std::find(blocked.begin(), blocked.end(), g) != blocked.end(); };
    for (auto it = active_.begin(); it != active_.end();) {
      Op& op = **it;
      bool remove = false;
      try {
        if (op.state == Op::State::Checking) {
          int flag = 0;
          ACCEL_MPI_CHECK(MPI_Test(&op.check_req, &flag, MPI_STATUS_IGNORE));
          if (flag) {
            progressed = true;
            verify_signature(op);  // throws MismatchError on every rank alike
            op.state = Op::State::Ready;
          }
        }
        if (op.state == Op::State::Ready) {
          bool deps_done = true;
          std::exception_ptr dep_error = dependency_error(op.req, deps_done);
          if (dep_error) std::rethrow_exception(dep_error);
          if (is_blocked(op.group.get()) || !deps_done) {
            // started later, in issue order
          } else if (op.req.check_only) {
            complete(op);
            remove = true;
            progressed = true;
          } else {
            start(op);
            op.state = Op::State::Running;
            progressed = true;
          }
        }
        if (!remove && op.state == Op::State::Running) {
          int flag = 0;
          ACCEL_MPI_CHECK(MPI_Test(&op.data_req, &flag, MPI_STATUS_IGNORE));
          if (flag) {
            progressed = true;
            if (op.post) op.post();
            if (op.req.then) op.req.then();
            complete(op);
            remove = true;
          }
        }
      } catch (...) {
        fail(op, std::current_exception());
        remove = true;
        progressed = true;
      }
      if (!remove && op.state != Op::State::Running) blocked.push_back(op.group.get());
      it = remove ? active_.erase(it) : std::next(it);
    }
    return progressed;
  }

  void verify_signature(const Op& op) {
    long long lo[kNumSig], hi[kNumSig];
    for (int f = 0; f < kNumSig; ++f) {
      hi[f] = op.sig_all[f];
      lo[f] = -op.sig_all[kNumSig + f];
    }
    comm::verify_signature(op.sig, lo, hi, op.req.work->what(), op.group->rank, op.group->size);
  }

  void start(Op& op) {
    if (op.stage) {
      op.stage();
      op.stage = nullptr;
    }
    const Request& r = op.req;
    MPI_Comm comm = op.group->data;
    void* send = op.in_place ? MPI_IN_PLACE : (op.send.defined() ? op.send.data_ptr() : nullptr);
    switch (r.kind) {
      case Collective::AllReduce: {
        int n = checked_count(op.recv.numel(), "element count");
        ACCEL_MPI_CHECK(MPI_Iallreduce(send, op.recv.data_ptr(), n, reduce_type(op.recv.scalar_type()), reduce_op(r.op),
                                       comm, &op.data_req));
        break;
      }
      case Collective::ReduceScatter: {
        int n = checked_count(op.recv.numel(), "element count");
        ACCEL_MPI_CHECK(MPI_Ireduce_scatter_block(send, op.recv.data_ptr(), n, reduce_type(op.recv.scalar_type()),
                                                  reduce_op(r.op), comm, &op.data_req));
        break;
      }
      case Collective::AllGather: {
        int n = checked_count(static_cast<long long>(r.input.nbytes()), "byte count");
        ACCEL_MPI_CHECK(MPI_Iallgather(send, n, MPI_BYTE, op.recv.data_ptr(), n, MPI_BYTE, comm, &op.data_req));
        break;
      }
      case Collective::Broadcast: {
        int n = checked_count(static_cast<long long>(op.recv.nbytes()), "byte count");
        ACCEL_MPI_CHECK(MPI_Ibcast(op.recv.data_ptr(), n, MPI_BYTE, r.root, comm, &op.data_req));
        break;
      }
      case Collective::Barrier: ACCEL_MPI_CHECK(MPI_Ibarrier(comm, &op.data_req)); break;
    }
  }

  using Clock = std::chrono::steady_clock;
  Group world_;
  Duration exit_grace_ = default_timeout();
  Clock::time_point stop_deadline_{};
  bool owns_mpi_ = false;
  bool check_enabled_ = true;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::unique_ptr<Op>> incoming_;
  std::deque<std::function<void()>> tasks_;
  std::list<std::unique_ptr<Op>> active_;  // issue order
  std::thread thread_;
};

std::shared_ptr<Group> make_group(MPI_Comm base) {
  auto g = std::make_shared<Group>();
  ACCEL_MPI_CHECK(MPI_Comm_dup(base, &g->data));
  ACCEL_MPI_CHECK(MPI_Comm_dup(base, &g->check));
  ACCEL_MPI_CHECK(MPI_Comm_dup(base, &g->control));
  MPI_Comm_rank(g->data, &g->rank);
  MPI_Comm_size(g->data, &g->size);
  return g;
}

}  // namespace

struct MpiBackend::Impl {
  std::shared_ptr<Group> group;
};

MpiBackend::MpiBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MpiBackend::~MpiBackend() {
  if (!impl_ || !g_engine_alive) return;
  auto g = impl_->group;
  try {
    Engine::get().call([g] {
      for (MPI_Comm* c : {&g->data, &g->check, &g->control})
        if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
      return 0;
    });
  } catch (...) {
  }
}

std::unique_ptr<MpiBackend> MpiBackend::world() {
  Engine& e = Engine::get();
  auto impl = std::make_unique<Impl>();
  impl->group = e.call([] { return make_group(MPI_COMM_WORLD); });
  return std::unique_ptr<MpiBackend>(new MpiBackend(std::move(impl)));
}

int MpiBackend::rank() const { return impl_->group->rank; }
int MpiBackend::size() const { return impl_->group->size; }
int MpiBackend::world_rank() {
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void MpiBackend::mark_broken() { g_broken = true; }
bool MpiBackend::is_broken() { return g_broken; }

void MpiBackend::enqueue(Request r) {
  auto op = std::make_unique<Op>();
  op->group = impl_->group;
  const int n = op->group->size;
  // The signature every rank must agree on.
  long long sig[kNumSig];
  make_signature(r, sig);
  for (int f = 0; f < kNumSig; ++f) {
    op->sig[f] = sig[f];
    op->sig[kNumSig + f] = -sig[f];
  }
  if (r.check_only) {
    op->req = std::move(r);
    Engine::get().submit(std::move(op));
    return;
  }
  const bool half = r.input.defined() && classify(r.input.scalar_type()) == DtypeClass::HalfFloat;
  const bool avg = r.op == ReduceOp::Avg;
  at::Tensor out = r.output;
  switch (r.kind) {
    case Collective::AllReduce:
      if (half) {
        op->recv = at::empty_like(r.input, r.input.options().dtype(at::kFloat));  // fp32 in transit, rounded once
        op->in_place = true;
        op->stage = [wire = op->recv, in = r.input] { wire.copy_(in); };
      } else {
        op->recv = out;
        op->in_place = r.input.data_ptr() == out.data_ptr();
        op->send = r.input;
      }
      break;
    case Collective::ReduceScatter:
      if (half) {
        op->send = at::empty_like(r.input, r.input.options().dtype(at::kFloat));
        op->recv = at::empty({out.numel()}, out.options().dtype(at::kFloat));
        op->stage = [wire = op->send, in = r.input] { wire.copy_(in); };
      } else {
        op->send = r.input;
        op->recv = overlaps(r.input, out) ? at::empty_like(out) : out;
      }
      break;
    case Collective::AllGather:
      op->recv = out;
      op->send = r.input;
      op->in_place = r.input.nbytes() > 0 &&
                     r.input.data_ptr() == static_cast<char*>(out.data_ptr()) + op->group->rank * r.input.nbytes();
      break;
    case Collective::Broadcast: op->recv = out; break;
    case Collective::Barrier: break;
  }
  if ((r.kind == Collective::AllReduce || r.kind == Collective::ReduceScatter) && (avg || !op->recv.is_same(out))) {
    at::Tensor wire = op->recv;
    op->post = [wire, out, avg, n] {
      if (avg && wire.is_same(out)) {
        out.div_(n);
      } else if (avg) {
        out.copy_(wire.view(out.sizes()).div(n));
      } else {
        out.copy_(wire.view(out.sizes()));
      }
    };
  }
  // Integer avg is rejected by the Communicator; float avg divides in the accumulation dtype.
  op->req = std::move(r);
  Engine::get().submit(std::move(op));
}

std::unique_ptr<MpiBackend> MpiBackend::split(int color, int key) {
  auto g = impl_->group;
  auto sub = Engine::get().call([g, color, key]() -> std::shared_ptr<Group> {
    MPI_Comm c = MPI_COMM_NULL;
    ACCEL_MPI_CHECK(MPI_Comm_split(g->control, color < 0 ? MPI_UNDEFINED : color, key, &c));
    if (c == MPI_COMM_NULL) return nullptr;
    auto s = make_group(c);
    MPI_Comm_free(&c);
    return s;
  });
  if (!sub) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->group = std::move(sub);
  return std::unique_ptr<MpiBackend>(new MpiBackend(std::move(impl)));
}

void MpiBackend::allgather_bytes(const void* mine, std::size_t n, void* all) {
  auto g = impl_->group;
  int count = checked_count(static_cast<long long>(n), "byte count");
  Engine::get().call([&] {
    ACCEL_MPI_CHECK(MPI_Allgather(mine, count, MPI_BYTE, all, count, MPI_BYTE, g->control));
    return 0;
  });
}

void MpiBackend::broadcast_bytes(void* data, std::size_t n, int root) {
  auto g = impl_->group;
  int count = checked_count(static_cast<long long>(n), "byte count");
  Engine::get().call([&] {
    ACCEL_MPI_CHECK(MPI_Bcast(data, count, MPI_BYTE, root, g->control));
    return 0;
  });
}

Topology MpiBackend::read_topology() {
  auto g = impl_->group;
  Topology t = Engine::get().call([g] {
    Topology t;
    t.rank = g->rank;
    t.world_size = g->size;
    MPI_Comm node = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    ACCEL_MPI_CHECK(MPI_Comm_split_type(g->control, MPI_COMM_TYPE_SHARED, g->rank, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &t.local_rank);
    MPI_Comm_size(node, &t.local_world_size);
    ACCEL_MPI_CHECK(MPI_Comm_split(g->control, t.local_rank == 0 ? 0 : MPI_UNDEFINED, g->rank, &leaders));
    int info[2] = {0, 0};  // node rank, number of nodes: known to the node's leader
    if (leaders != MPI_COMM_NULL) {
      MPI_Comm_rank(leaders, &info[0]);
      MPI_Comm_size(leaders, &info[1]);
      MPI_Comm_free(&leaders);
    }
    ACCEL_MPI_CHECK(MPI_Bcast(info, 2, MPI_INT, 0, node));
    MPI_Comm_free(&node);
    t.node_rank = info[0];
    t.num_nodes = info[1];
    return t;
  });
  try {
    return apply_node_override(t, env::get("ACCEL_RANKS_PER_NODE").c_str());
  } catch (const std::invalid_argument& e) {
    throw InvalidArgument(e.what());
  }
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, len);
  auto nl = s.find_first_of("\n,");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace accel::comm
