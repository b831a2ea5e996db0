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
thread_local Category t_category = Category::Other;
thread_local bool t_forward = false;

// Every counted allocation is laid out as [Header | data]: the header, in the first kHeader bytes
// (which keeps the inner allocator's 64-byte alignment), holds the inner allocation and what to credit
// back. The DataPtr's context is the data pointer itself, as raw_allocate() (used by oneDNN) requires.
struct Header {
  c10::DataPtr inner;
  std::int64_t bytes;
  Category category;
};
constexpr std::size_t kHeader = 64;
static_assert(sizeof(Header) <= kHeader);

void release(void* data) {
  if (!data) return;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  g_total.sub(h->bytes);
  g_by_cat[static_cast<int>(h->category)].sub(h->bytes);
  c10::DataPtr inner = std::move(h->inner);
  h->~Header();
  // `inner` frees the block on leaving scope.
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d = inner_->allocate(n + kHeader);
    char* base = static_cast<char*>(d.get());
    c10::Device dev = d.device();
    const Category c = t_forward && t_category == Category::Other ? Category::Activations : t_category;
    auto* h = new (base) Header{std::move(d), static_cast<std::int64_t>(n), c};
    g_total.add(h->bytes);
    g_by_cat[static_cast<int>(h->category)].add(h->bytes);
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &release, dev);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { inner_->copy_data(dest, src, count); }

 private:
  c10::Allocator* inner_;
};

std::atomic<bool> g_installed{false};

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
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator counting(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    g_installed = true;
  });
}

bool keep_freed_cpu_memory() {
#if defined(__GLIBC__)
  static const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return ok;
#else
  return false;
#endif
}

bool counting_installed() { return g_installed.load(); }

Snapshot snapshot() {
  Snapshot s;
  s.total = g_total.read();
  for (int i = 0; i < kNumCategories; ++i) s.by_category[i] = g_by_cat[i].read();
  return s;
}

void reset_peaks() {
  g_total.reset_peak();
  for (auto& c : g_by_cat) c.reset_peak();
}

std::string Snapshot::to_string() const {
  std::string out = fmt::format("total {} (peak {})", human(total.current), human(total.peak));
  for (int i = 0; i < kNumCategories; ++i)
    out += fmt::format(", {} {} (peak {})", memory::to_string(static_cast<Category>(i)), human(by_category[i].current),
                       human(by_category[i].peak));
  return out;
}

void set_forward_active(bool on) { t_forward = on; }
bool forward_active() { return t_forward; }

CategoryScope::CategoryScope(Category c) : saved_(t_category) { t_category = c; }
CategoryScope::~CategoryScope() { t_category = saved_; }

}  // namespace accel::memory
