// The sanitizer canary: one deliberate bug per sanitizer, built with the same flags as accel
// (cmake/AccelSanitize.cmake) and run by scripts/sanitize.sh under the same runtime options and
// suppressions as the tests. The script requires a report from it, so a clean test run means
// "the sanitizer looked and found nothing", never "the options silenced it".
//   canary race      two threads write one int without synchronization (ThreadSanitizer)
//   canary overflow  a read one past the end of a heap array (AddressSanitizer)
//   canary shift     a shift by more than the width of int (UBSan)
//   canary leak      a heap block whose last pointer is dropped (LeakSanitizer)
#include <cstdio>
#include <cstring>
#include <thread>

namespace {
int g_shared = 0;
int* volatile g_pointer = nullptr;
}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (std::strcmp(mode, "race") == 0) {
    std::thread t([] { g_shared = 1; });
    g_shared = 2;
    t.join();
    return g_shared == 3 ? 1 : 0;  // read, so that neither write is optimized away
  }
  if (std::strcmp(mode, "overflow") == 0) {
    volatile int n = 8;
    int* a = new int[n];
    int v = a[n];  // one past the end
    delete[] a;
    return v == 12345 ? 1 : 0;
  }
  if (std::strcmp(mode, "shift") == 0) {
    volatile int s = 40;
    volatile int v = 1 << s;
    return v == 12345 ? 1 : 0;
  }
  if (std::strcmp(mode, "leak") == 0) {
    g_pointer = new int[64];
    g_pointer = nullptr;
    return 0;
  }
  std::fprintf(stderr, "usage: canary race|overflow|shift|leak\n");
  return 2;
}
