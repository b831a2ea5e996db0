// accel::memory — a counting CPU allocator: current and peak bytes per process (= per rank), and
// bytes by category (parameters, gradients, optimizer state, gathered buffers, activations, other).
//
// install_counting_allocator() puts it in front of libtorch's default CPU allocator (once; tensors
// allocated before that are not counted). A CategoryScope on the allocating thread says what the
// allocations inside it are for; the category travels with the allocation, so a free is credited
// back to the category that allocated it, whichever thread frees it. Thread-safe (atomics).
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
  const Usage& operator[](Category c) const { return by_category[static_cast<int>(c)]; }
  std::string to_string() const;  // "total 1.2 MiB (peak 3.4 MiB), parameters ..."
};

// Installs the counting allocator as libtorch's CPU allocator. Idempotent.
void install_counting_allocator();
bool counting_installed();
Snapshot snapshot();
// Sets every peak to the current value (total and per category).
void reset_peaks();

// Asks glibc to keep freed memory in the heap: blocks up to 32 MiB come from the heap rather than
// fresh mmaps, and the heap is not trimmed. Buffers freed and re-allocated every step (a unit's
// gathered parameters) then reuse warm pages. Process-wide, idempotent; returns false where it has
// no effect (not glibc).
bool keep_freed_cpu_memory();

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
