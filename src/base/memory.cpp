#include "base/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <new>
#include <vector>

namespace accel::memory {
namespace {

struct Counter {
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};
  void add(std::int64_t n) {
    std::int64_t now = current.fetch_add(n) + n;
    std::int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void sub(std::int64_t n) { current.fetch_sub(n); }
  Usage read() const { return {current.load(), peak.load()}; }
  void reset_peak() { peak.store(current.load()); }
};

Counter g_total;
std::array<Counter, kNumCategories> g_by_cat;
Counter g_node_shared;
thread_local Category t_category = Category::Other;
thread_local bool t_forward = false;

// Every allocation through accel's CPU allocator is laid out as [Header | data]: the header, in the
// first kHeader bytes (which keeps the inner allocator's 64-byte alignment), holds the inner allocation
// and what to credit back. The DataPtr's context is the data pointer itself, as raw_allocate() (used by
// oneDNN) requires.
struct Header {
  c10::DataPtr inner;
  std::int64_t bytes;
  Category category;
  bool counted;  // charged to the counters (counting was on when it was handed out)
};
constexpr std::size_t kHeader = 64;
static_assert(sizeof(Header) <= kHeader);

std::atomic<bool> g_counting{false};
std::atomic<bool> g_caching{false};

// The large-block cache (keep_freed_cpu_memory): blocks of at least kCacheMin bytes, which glibc would
// hand back to the kernel on free (they are mmapped), are kept and handed out again to a request of the
// same size, so a buffer freed and allocated again every step (a unit's gathered parameters, its full
// gradient) reuses warm pages instead of page-faulting fresh ones. The cache never makes the process
// hold more than the most it has had in use at once plus one block: `in_use + cached <= high_water +
// largest` (largest: the biggest block of kCacheMin or more ever handed out), blocks evicted oldest
// first when an allocation would break that. The one block of room matters at a step's peak: there a
// unit's freed autograd gradients (one size) wait for the next unit while its flat gradient (another
// size) is allocated, and with no room above the mark they were evicted and page-faulted again for
// every unit (a 0.59B ZeRO-3 step: about 300 MB of fresh pages per rank).
constexpr std::int64_t kCacheMin = std::int64_t{32} << 20;

struct BlockCache {
  std::mutex mu;
  std::vector<Header*> blocks;          // oldest first
  std::atomic<std::int64_t> cached{0};  // bytes held in `blocks`
  std::atomic<std::int64_t> in_use{0};  // bytes handed out and not yet freed (every size)
  std::atomic<std::int64_t> high_water{0};
  std::atomic<std::int64_t> largest{0};  // the biggest cacheable block ever handed out
};
// Never destroyed: tensors freed during static destruction still come back here.
BlockCache& cache() {
  static auto* c = new BlockCache;
  return *c;
}

void destroy(Header* h) {
  c10::DataPtr inner = std::move(h->inner);
  h->~Header();
  // `inner` frees the block on leaving scope.
}

// Takes blocks out of the cache, oldest first, until in_use + cached <= high_water + largest (or it is empty);
// the caller frees them outside the lock.
void evict_over_high_water(BlockCache& c, std::vector<Header*>& out) {
  std::size_t k = 0;
  while (k < c.blocks.size() && c.in_use.load() + c.cached.load() > c.high_water.load() + c.largest.load()) {
    c.cached.fetch_sub(c.blocks[k]->bytes);
    out.push_back(c.blocks[k++]);
  }
  c.blocks.erase(c.blocks.begin(), c.blocks.begin() + static_cast<std::ptrdiff_t>(k));
}

void charge(Header* h) {
  h->counted = g_counting.load();
  if (!h->counted) return;
  g_total.add(h->bytes);
  g_by_cat[static_cast<int>(h->category)].add(h->bytes);
}

void release(void* data) {
  if (!data) return;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  if (h->counted) {
    g_total.sub(h->bytes);
    g_by_cat[static_cast<int>(h->category)].sub(h->bytes);
  }
  BlockCache& c = cache();
  c.in_use.fetch_sub(h->bytes);
  if (g_caching.load() && h->bytes >= kCacheMin) {
    std::lock_guard<std::mutex> lock(c.mu);
    c.blocks.push_back(h);
    c.cached.fetch_add(h->bytes);
    return;
  }
  destroy(h);
}

class CpuAllocator final : public c10::Allocator {
 public:
  explicit CpuAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    const auto bytes = static_cast<std::int64_t>(n);
    const Category cat = t_forward && t_category == Category::Other ? Category::Activations : t_category;
    BlockCache& c = cache();
    const std::int64_t now = c.in_use.fetch_add(bytes) + bytes;
    std::int64_t hw = c.high_water.load();
    while (now > hw && !c.high_water.compare_exchange_weak(hw, now)) {
    }
    if (bytes >= kCacheMin) {
      std::int64_t big = c.largest.load();
      while (bytes > big && !c.largest.compare_exchange_weak(big, bytes)) {
      }
    }
    Header* h = nullptr;
    if (c.cached.load() > 0) {
      std::vector<Header*> evicted;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        if (bytes >= kCacheMin)
          for (auto it = c.blocks.begin(); it != c.blocks.end(); ++it)
            if ((*it)->bytes == bytes) {
              h = *it;
              c.blocks.erase(it);
              c.cached.fetch_sub(bytes);
              break;
            }
        evict_over_high_water(c, evicted);
      }
      for (Header* e : evicted) destroy(e);
    }
    if (h) {
      h->category = cat;
    } else {
      c10::DataPtr d = inner_->allocate(n + kHeader);
      void* base = d.get();
      h = new (base) Header{std::move(d), bytes, cat, false};
    }
    charge(h);
    void* data = reinterpret_cast<char*>(h) + kHeader;
    return c10::DataPtr(data, data, &release, h->inner.device());
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner_->copy_data(dest, src, count); }

 private:
  c10::Allocator* inner_;
};

// Puts accel's allocator in front of libtorch's default CPU allocator (once; tensors allocated before
// keep their own deleter).
void install_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CpuAllocator allocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
}

std::string human(std::int64_t b) {
  return b >= (1 << 20) ? fmt::format("{:.2f} MiB", b / 1048576.0) : fmt::format("{} B", b);
}

}  // namespace

const char* to_string(Category c) {
  switch (c) {
    case Category::Other: return "other";
    case Category::Parameters: return "parameters";
    case Category::Gradients: return "gradients";
    case Category::OptimizerState: return "optimizer_state";
    case Category::Gathered: return "gathered";
    case Category::Activations: return "activations";
  }
  return "?";
}

void install_counting_allocator() {
  install_cpu_allocator();
  g_counting = true;
}

bool keep_freed_cpu_memory() {
  install_cpu_allocator();
  g_caching = true;
#if defined(__GLIBC__)
  static const bool ok = mallopt(M_MMAP_THRESHOLD, kCacheMin) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return ok;
#else
  return false;
#endif
}

bool keeping_freed_cpu_memory() { return g_caching.load(); }

void empty_cpu_cache() {
  BlockCache& c = cache();
  std::vector<Header*> blocks;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    blocks.swap(c.blocks);
    c.cached.store(0);
  }
  for (Header* h : blocks) destroy(h);
}

CpuCacheStats cpu_cache_stats() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.in_use.load(), c.cached.load(), c.high_water.load(), c.largest.load()};
}

bool counting_installed() { return g_counting.load(); }

Snapshot snapshot() {
  Snapshot s;
  s.total = g_total.read();
  for (int i = 0; i < kNumCategories; ++i) s.by_category[i] = g_by_cat[i].read();
  s.node_shared = g_node_shared.read();
  return s;
}

void reset_peaks() {
  g_total.reset_peak();
  for (auto& c : g_by_cat) c.reset_peak();
  g_node_shared.reset_peak();
}

ExternalCharge::ExternalCharge(Category c, std::int64_t rank_bytes, std::int64_t node_bytes)
    : c_(c), rank_bytes_(rank_bytes), node_bytes_(node_bytes), counted_(g_counting.load()) {
  if (!counted_) return;
  g_total.add(rank_bytes_);
  g_by_cat[static_cast<int>(c_)].add(rank_bytes_);
  g_node_shared.add(node_bytes_);
}

ExternalCharge::~ExternalCharge() {
  if (!counted_) return;
  g_total.sub(rank_bytes_);
  g_by_cat[static_cast<int>(c_)].sub(rank_bytes_);
  g_node_shared.sub(node_bytes_);
}

std::string Snapshot::to_string() const {
  std::string out = fmt::format("total {} (peak {})", human(total.current), human(total.peak));
  for (int i = 0; i < kNumCategories; ++i)
    out += fmt::format(", {} {} (peak {})", memory::to_string(static_cast<Category>(i)), human(by_category[i].current),
                       human(by_category[i].peak));
  if (node_shared.peak > 0)
    out += fmt::format("; node-shared {} (peak {}), this rank's share counted above", human(node_shared.current),
                       human(node_shared.peak));
  return out;
}

void set_forward_active(bool on) { t_forward = on; }
bool forward_active() { return t_forward; }

CategoryScope::CategoryScope(Category c) : saved_(t_category) { t_category = c; }
CategoryScope::~CategoryScope() { t_category = saved_; }

}  // namespace accel::memory
