// accel::memory — accel's CPU allocator: it counts current and peak bytes per process (= per rank)
// and by category (parameters, gradients, optimizer state, gathered buffers, activations, other), and
// can cache large freed blocks for reuse (keep_freed_cpu_memory).
//
// install_counting_allocator() puts accel's CPU allocator in front of libtorch's default one (once;
// tensors allocated before that are not counted) and turns counting on. A CategoryScope on the
// allocating thread says what the allocations inside it are for; the category travels with the
// allocation, so a free is credited back to the category that allocated it, whichever thread frees
// it. Thread-safe (atomics; the cache under a mutex).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace accel::memory {

// Activations: what a forward allocates that no other category claims (the tensors autograd saves
// for backward, and the forward's temporaries), charged while forward_active() on the allocating
// thread, and what an activation-checkpointed unit allocates when it recomputes its forward.
enum class Category { Other, Parameters, Gradients, OptimizerState, Gathered, Activations };
constexpr int kNumCategories = 6;
const char* to_string(Category c);

struct Usage {
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

struct Snapshot {
  Usage total;
  std::array<Usage, kNumCategories> by_category{};
  // Shared memory this process maps with the other ranks of its node (ExternalCharge's node_bytes):
  // what the node holds once, whichever rank counts it. Not part of `total`, which holds this rank's
  // share of it.
  Usage node_shared;
  const Usage& operator[](Category c) const { return by_category[static_cast<int>(c)]; }
  std::string to_string() const;  // "total 1.2 MiB (peak 3.4 MiB), parameters ..."
};

// Memory the counting allocator never sees because it was not allocated through it: shared memory the
// ranks of a node map (node-shared parameters, the shared gradient pool). While a charge lives, this
// rank's share of the object (`rank_bytes`: its shard, its part of the pool) counts in category `c` and
// in the total as an allocation would, and the whole object (`node_bytes`) in Snapshot::node_shared.
// Charged only when counting is on when it is made, as allocations are; credited back when destroyed.
class ExternalCharge {
 public:
  ExternalCharge(Category c, std::int64_t rank_bytes, std::int64_t node_bytes);
  ~ExternalCharge();
  ExternalCharge(const ExternalCharge&) = delete;
  ExternalCharge& operator=(const ExternalCharge&) = delete;

 private:
  Category c_;
  std::int64_t rank_bytes_, node_bytes_;
  bool counted_;
};

// Installs the counting allocator as libtorch's CPU allocator. Idempotent.
void install_counting_allocator();
bool counting_installed();
Snapshot snapshot();
// Sets every peak to the current value (total and per category).
void reset_peaks();

// Keeps freed CPU memory for reuse: glibc serves blocks under 32 MiB from the heap rather than fresh
// mmaps and does not trim it, and accel's CPU allocator (installed in front of libtorch's, as the
// counting one is) keeps freed blocks of 32 MiB and more and hands them out again to a request of the
// same size. Buffers freed and allocated again every step (a unit's gathered parameters, its full
// gradient) then reuse warm pages instead of page-faulting fresh ones. The cache only holds what keeps
// the process within the most it has had in use at once plus one block (in use + cached <= high-water
// mark + the largest block of 32 MiB or more handed out; the oldest blocks are freed first when an
// allocation would pass it), so a peak grows by at most that one block because of it. Process-wide,
// idempotent; the counters (snapshot) count blocks in use, not cached ones. Returns false where glibc's part has no
// effect (not glibc, or mallopt refused).
bool keep_freed_cpu_memory();
// True once keep_freed_cpu_memory() has been called in this process.
bool keeping_freed_cpu_memory();
// accel's CPU allocator now: bytes handed out and not freed, bytes the cache holds for reuse (0 until
// keep_freed_cpu_memory), the most ever handed out at once, and the largest block of 32 MiB or more
// handed out (the cache's room above the high-water mark; all 0 until it is installed).
struct CpuCacheStats {
  std::int64_t in_use = 0, cached = 0, high_water = 0, largest_block = 0;
};
CpuCacheStats cpu_cache_stats();
// Frees every block the cache holds (torch.cuda.empty_cache for the CPU); the cache stays on.
void empty_cpu_cache();

// While on, allocations on this thread that no CategoryScope claims (Other) are charged to
// Activations. The engine turns it on at the first unit of a forward and off when backward or the
// step begins.
void set_forward_active(bool on);
bool forward_active();

// Allocations made on this thread while the scope lives are charged to `c` (scopes nest).
class CategoryScope {
 public:
  explicit CategoryScope(Category c);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  Category saved_;
};

}  // namespace accel::memory
