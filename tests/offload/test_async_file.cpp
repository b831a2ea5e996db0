// accel::offload::AsyncFile, check_offload_dir and measure_disk: data round-trips against what plain
// pread/pwrite see, every fault's message, on both engines (io_uring and the thread pool) and with and
// without O_DIRECT. Faults use real conditions: RLIMIT_FSIZE (EFBIG), a full 1 MiB tmpfs (ENOSPC),
// ramfs (refuses O_DIRECT), a read-only tmpfs and /sys (not writable), a seccomp filter that blocks
// io_uring_setup. The mounts need root with mount permission; without it those tests skip, saying so.
#include "offload/async_file.h"
#include "support/errors.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

using accel::test::message_of;
namespace off = accel::offload;

namespace {

constexpr std::size_t kA = off::kAlignment;

std::string make_temp_dir(const char* stem) {
  std::string tmpl = std::string("/tmp/") + stem + "_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

void remove_dir_contents(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") ::unlink((dir + "/" + n).c_str());
    }
    ::closedir(d);
  }
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// What the file holds, read with plain pread (independent of AsyncFile).
std::vector<unsigned char> file_bytes(const std::string& path) {
  std::vector<unsigned char> out;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  struct stat st {};
  ::fstat(fd, &st);
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

void fill_random(void* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

// A tmpfs or ramfs mounted on a fresh directory for one test; unmounted (lazily) and removed after.
// ok() is false, with why() saying so, where mounting is not permitted (not root, no CAP_SYS_ADMIN).
class Mount {
 public:
  Mount(const char* fstype, const std::string& data, unsigned long flags = 0) : dir_(make_temp_dir("accel_aio_mnt")) {
    if (dir_.empty()) {
      why_ = std::string("mkdtemp: ") + std::strerror(errno);
      return;
    }
    if (::mount(fstype, dir_.c_str(), fstype, flags, data.empty() ? nullptr : data.c_str()) != 0) {
      why_ = std::string("mounting a ") + fstype + " needs root with mount permission: " + std::strerror(errno);
      ::rmdir(dir_.c_str());
      return;
    }
    mounted_ = true;
  }
  ~Mount() {
    if (!mounted_) return;
    ::umount2(dir_.c_str(), MNT_DETACH);
    ::rmdir(dir_.c_str());
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

struct Variant {
  bool kernel_aio;
  bool direct;
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) {
  return std::string(info.param.kernel_aio ? "IoUring" : "ThreadPool") + (info.param.direct ? "Direct" : "Buffered");
}

// A fixture (over gtest's Test or TestWithParam) with a fresh directory per test, removed after.
template <class Base>
class WithTempDir : public Base {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir("accel_aio");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    remove_dir_contents(dir_);
    ::rmdir(dir_.c_str());
  }
  // The end of a death-test child (which ran SetUp, never TearDown): its directory goes, then exit 0 for good.
  [[noreturn]] void exit_removing_dir(bool good) {
    TearDown();
    std::exit(good ? 0 : 1);
  }
  std::string dir_;
};

class AsyncFileTest : public WithTempDir<::testing::TestWithParam<Variant>> {
 protected:
  off::AioOptions options(std::size_t block = 64 << 10, int depth = 4) const {
    off::AioOptions o;
    o.block_size = block;
    o.queue_depth = depth;
    o.kernel_aio = GetParam().kernel_aio;
    return o;
  }
};

// Many requests of sizes spanning several blocks in flight at once, written then read back in another
// order into another buffer; the file's bytes (plain pread) equal what was written.
TEST_P(AsyncFileTest, RoundTripManyRequestsInFlight) {
  const std::string path = dir_ + "/state.bin";
  off::AsyncFile f(path, true, options(), GetParam().direct);
  EXPECT_EQ(std::string(f.engine()), GetParam().kernel_aio ? "io_uring" : "thread pool");
  if (GetParam().direct) EXPECT_TRUE(f.direct()) << "/tmp is ext4 here; O_DIRECT should open";

  std::mt19937 rng(7);
  struct Piece {
    std::size_t bytes;
    std::uint64_t offset;
  };
  std::vector<Piece> pieces;
  std::uint64_t offset = 0;
  for (int i = 0; i < 40; ++i) {
    // 1 page .. 5 blocks plus a page (aligned, so that O_DIRECT takes it); never a whole block only.
    const std::size_t bytes = kA * (1 + rng() % 80);
    pieces.push_back({bytes, offset});
    offset += bytes;
  }
  off::AlignedBuffer out(offset), in(offset);
  fill_random(out.data(), offset, 11);
  std::vector<off::AsyncFile::Ticket> tickets;
  for (const Piece& p : pieces)
    tickets.push_back(f.write_async(static_cast<char*>(out.data()) + p.offset, p.bytes, p.offset));
  f.wait_all();
  EXPECT_EQ(f.bytes_written(), offset);

  std::vector<std::size_t> order(pieces.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  tickets.clear();
  for (std::size_t i : order)
    tickets.push_back(
        f.read_async(static_cast<char*>(in.data()) + pieces[i].offset, pieces[i].bytes, pieces[i].offset));
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) f.wait(*it);  // waited in reverse: any order works
  EXPECT_EQ(f.bytes_read(), offset);
  EXPECT_EQ(std::memcmp(out.data(), in.data(), offset), 0);

  const auto on_disk = file_bytes(path);
  ASSERT_EQ(on_disk.size(), offset);
  EXPECT_EQ(std::memcmp(on_disk.data(), out.data(), offset), 0);
}

// Synchronous calls between asynchronous ones, overwriting part of what is in flight only after it
// completed; waiting twice is a no-op, a ticket never issued is an error.
TEST_P(AsyncFileTest, SyncAndAsyncMix) {
  const std::string path = dir_ + "/mix.bin";
  off::AsyncFile f(path, true, options(16 << 10, 2), GetParam().direct);
  const std::size_t n = 64 * kA;
  off::AlignedBuffer a(n), b(n), c(n);
  fill_random(a.data(), n, 1);
  fill_random(b.data(), n, 2);
  const auto ta = f.write_async(a.data(), n, 0);
  f.write(b.data(), n, n);  // synchronous, while `ta` may be in flight
  f.wait(ta);
  f.wait(ta);  // again: no-op
  f.read(c.data(), n, 0);
  EXPECT_EQ(std::memcmp(c.data(), a.data(), n), 0);
  const auto tb = f.read_async(c.data(), n, n);
  f.wait(tb);
  EXPECT_EQ(std::memcmp(c.data(), b.data(), n), 0);
  EXPECT_EQ(f.bytes_written(), 2 * n);
  EXPECT_EQ(f.bytes_read(), 2 * n);
  const std::string msg = message_of<std::invalid_argument>([&] { f.wait(tb + 100); });
  EXPECT_NE(msg.find("never issued"), std::string::npos) << msg;
  // An existing file opened without create keeps its bytes.
  f.sync();
  off::AsyncFile g(path, false, options(), GetParam().direct);
  off::AlignedBuffer d(2 * n);
  g.read(d.data(), 2 * n, 0);
  EXPECT_EQ(std::memcmp(d.data(), a.data(), n), 0);
  EXPECT_EQ(std::memcmp(static_cast<char*>(d.data()) + n, b.data(), n), 0);
}

// Queued requests progress while the caller does something else: with nothing but sleeping after
// write_async (no wait, no other call), the whole request reaches the file, watched through another
// descriptor. (A queue that only moved when waited on would stop after queue_depth blocks.)
TEST_P(AsyncFileTest, RequestsProgressWithoutWaiting) {
  const std::string path = dir_ + "/background.bin";
  const std::size_t n = 16 << 20;
  off::AlignedBuffer out(n);
  fill_random(out.data(), n, 6);
  off::AsyncFile f(path, true, options(1 << 20, 2), GetParam().direct);
  const auto ticket = f.write_async(out.data(), n, 0);
  bool arrived = false;
  for (int i = 0; i < 2000 && !arrived; ++i) {  // up to 20 s
    ::usleep(10000);
    const auto on_disk = file_bytes(path);
    arrived = on_disk.size() == n && std::memcmp(on_disk.data(), out.data(), n) == 0;
  }
  EXPECT_TRUE(arrived) << "the write did not complete without a call to wait()";
  f.wait(ticket);
}

// A read past the end of the file is an error naming the file, not a silently short buffer.
TEST_P(AsyncFileTest, ReadPastEndIsAnError) {
  const std::string path = dir_ + "/short.bin";
  off::AsyncFile f(path, true, options(), GetParam().direct);
  off::AlignedBuffer buf(8 * kA);
  f.write(buf.data(), 4 * kA, 0);
  const std::string msg = message_of<std::runtime_error>([&] { f.read(buf.data(), 8 * kA, 0); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("the file ends before offset 16384 (short read; the request runs to offset 32768)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(32768 bytes) at offset 0"), std::string::npos) << msg;
}

// The destructor waits for writes still in flight: after it, every byte is in the file.
TEST_P(AsyncFileTest, DestructorWaitsForWritesInFlight) {
  const std::string path = dir_ + "/late.bin";
  const std::size_t n = 32 << 20;
  off::AlignedBuffer out(n);
  fill_random(out.data(), n, 5);
  {
    off::AsyncFile f(path, true, options(1 << 20, 2), GetParam().direct);
    for (std::size_t pos = 0; pos < n; pos += 4 << 20)
      f.write_async(static_cast<char*>(out.data()) + pos, 4 << 20, pos);
  }  // no wait
  const auto on_disk = file_bytes(path);
  ASSERT_EQ(on_disk.size(), n);
  EXPECT_EQ(std::memcmp(on_disk.data(), out.data(), n), 0);
}

// reserve() allocates the blocks (st_blocks) and sets the size; an impossible reservation names the
// file and the bytes.
TEST_P(AsyncFileTest, Reserve) {
  const std::string path = dir_ + "/reserved.bin";
  off::AsyncFile f(path, true, options(), GetParam().direct);
  const std::uint64_t want = 10 << 20;
  f.reserve(want);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<std::uint64_t>(st.st_size), want);
  EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, want);
  const std::uint64_t huge = std::uint64_t(1) << 60;  // beyond ext4's largest file and this disk
  const std::string msg = message_of<std::runtime_error>([&] { f.reserve(huge); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("(1152921504606846976 bytes)"), std::string::npos) << msg;
}

// RLIMIT_FSIZE with SIGXFSZ ignored: a write across the limit stops short there, and continuing it
// fails with EFBIG, which must surface naming the file and where it stopped (the limit sits inside the
// last 256 KiB request, so only the continued short transfer can see the error). Run in a child
// process (gtest's death-test machinery), so that the limit never applies to this one.
TEST_P(AsyncFileTest, FileSizeLimitIsAnErrorNamingTheFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = dir_ + "/efbig.bin";
  const Variant v = GetParam();
  const off::AioOptions o = options(256 << 10, 4);
  const std::size_t limit = (1 << 20) + (64 << 10), n = 5 * (256 << 10);
  auto run = [&] {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {
      limit, limit
    };
    ::setrlimit(RLIMIT_FSIZE, &lim);
    off::AlignedBuffer buf(n);
    fill_random(buf.data(), n, 8);
    std::string msg;
    {
      off::AsyncFile f(path, true, o, v.direct);
      msg = message_of<std::runtime_error>([&] { f.write(buf.data(), n, 0); });
    }
    std::cerr << "message: " << msg << "\n";
    const auto on_disk = file_bytes(path);  // everything up to the limit was written
    return msg.find(path) != std::string::npos && msg.find("File too large") != std::string::npos &&
           msg.find("RLIMIT_FSIZE") != std::string::npos && on_disk.size() == limit &&
           std::memcmp(on_disk.data(), buf.data(), limit) == 0;
  };
  auto child = [&] { exit_removing_dir(run()); };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0),
              "message: accel offload: writing 1.3 MB \\(1310720 bytes\\) at offset 0 of .*efbig.bin failed at offset "
              "1114112: File too large");
}

// A real full disk: a 1 MiB tmpfs. The write fails with ENOSPC, said as the disk being full, naming
// the file; reserve() there fails the same way, naming the bytes.
TEST_P(AsyncFileTest, FullDiskIsAnErrorNamingTheFile) {
  Mount m("tmpfs", "size=1m");
  if (!m.ok()) GTEST_SKIP() << m.why();
  const std::string path = m.dir() + "/full.bin";
  off::AsyncFile f(path, true, options(256 << 10, 4), GetParam().direct);
  off::AlignedBuffer buf(4 << 20);
  std::string msg = message_of<std::runtime_error>([&] { f.write(buf.data(), 4 << 20, 0); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the disk is full"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4194304 bytes) at offset 0"), std::string::npos) << msg;
  const std::string path2 = m.dir() + "/reserve.bin";
  ::unlink(path.c_str());
  off::AsyncFile g(path2, true, options(), GetParam().direct);
  msg = message_of<std::runtime_error>([&] { g.reserve(8 << 20); });
  EXPECT_NE(msg.find(path2), std::string::npos) << msg;
  EXPECT_NE(msg.find("8.4 MB (8388608 bytes)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the disk is full"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Engines, AsyncFileTest,
                         ::testing::Values(Variant{true, true}, Variant{true, false}, Variant{false, true},
                                           Variant{false, false}),
                         variant_name);

class OffloadFiles : public WithTempDir<::testing::Test> {};

// Under O_DIRECT a misaligned buffer, offset or byte count is refused before anything is queued,
// naming which; without O_DIRECT the same calls work.
TEST_F(OffloadFiles, MisalignmentUnderDirectNamesWhich) {
  off::AsyncFile f(dir_ + "/aligned.bin", true);
  ASSERT_TRUE(f.direct());
  off::AlignedBuffer buf(4 * kA);
  char* p = static_cast<char*>(buf.data());
  std::string msg = message_of<std::invalid_argument>([&] { f.write(p + 8, kA, 0); });
  EXPECT_NE(msg.find("buffer address"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aligned.bin"), std::string::npos) << msg;
  msg = message_of<std::invalid_argument>([&] { f.read(p, kA, 100); });
  EXPECT_NE(msg.find("offset must be a multiple of 4096 bytes (got 100)"), std::string::npos) << msg;
  msg = message_of<std::invalid_argument>([&] { f.write(p, 1000, 0); });
  EXPECT_NE(msg.find("byte count must be a multiple of 4096 bytes (got 1000"), std::string::npos) << msg;
  EXPECT_EQ(f.bytes_written(), 0u);

  off::AsyncFile g(dir_ + "/buffered.bin", true, {}, /*direct=*/false);
  EXPECT_FALSE(g.direct());
  fill_random(p, 4 * kA, 3);
  g.write(p + 8, 1000, 100);
  std::vector<char> back(1000);
  g.read(back.data(), 1000, 100);
  EXPECT_EQ(std::memcmp(back.data(), p + 8, 1000), 0);
}

// A file system that refuses O_DIRECT (ramfs) gives a buffered file: direct() false, data intact.
TEST_F(OffloadFiles, DirectRefusedFallsBackToBuffered) {
  Mount m("ramfs", "");
  if (!m.ok()) GTEST_SKIP() << m.why();
  const std::string path = m.dir() + "/ram.bin";
  off::AsyncFile f(path, true);
  EXPECT_FALSE(f.direct());
  off::AlignedBuffer out(256 * kA), in(256 * kA);
  fill_random(out.data(), out.size(), 9);
  f.write(out.data(), out.size(), 0);
  f.read(in.data(), in.size(), 0);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
  const auto bw = off::measure_disk(m.dir(), 4 << 20);
  EXPECT_FALSE(bw.direct);
  EXPECT_GT(bw.write_gbps, 0);
}

// Where io_uring_setup is blocked (here by a seccomp filter, as in containers' default profiles), the
// thread pool takes over, the log says so once, and the data still round-trips.
TEST_F(OffloadFiles, IoUringBlockedFallsBackToThreadPool) {
#if defined(__x86_64__)
  const std::uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  const std::uint32_t arch = AUDIT_ARCH_AARCH64;
#else
  GTEST_SKIP() << "the seccomp filter here knows x86_64 and aarch64 only";
  const std::uint32_t arch = 0;
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = dir_ + "/fallback.bin";
  auto run = [&] {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      return false;
    off::AioOptions o;
    o.block_size = 64 << 10;
    off::AsyncFile f(path, true, o);
    off::AsyncFile g(path + ".2", true, o);
    off::AlignedBuffer out(1 << 20), in(1 << 20);
    fill_random(out.data(), out.size(), 4);
    f.write(out.data(), out.size(), 0);
    f.read(in.data(), in.size(), 0);
    return std::string(f.engine()) == "thread pool" && std::string(g.engine()) == "thread pool" &&
           std::memcmp(in.data(), out.data(), out.size()) == 0;
  };
  auto child = [&] { exit_removing_dir(run()); };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0),
              "io_uring is not available here \\(io_uring_queue_init: Operation not permitted.*pool of 8 threads");
}

TEST(DescribeBytes, DecimalUnitsAndTheExactCount) {
  EXPECT_EQ(off::describe_bytes(0), "0 bytes");
  EXPECT_EQ(off::describe_bytes(999), "999 bytes");
  EXPECT_EQ(off::describe_bytes(1000), "1.0 kB (1000 bytes)");
  EXPECT_EQ(off::describe_bytes(48000000000ull), "48.0 GB (48000000000 bytes)");
  EXPECT_EQ(off::describe_bytes(999999999ull), "1.0 GB (999999999 bytes)");
  EXPECT_EQ(off::describe_bytes(1536ull << 20), "1.6 GB (1610612736 bytes)");
}

// check_offload_dir: each bad directory has its own message, naming the key, the path and the bytes.
TEST_F(OffloadFiles, CheckOffloadDirMissing) {
  const std::string missing = dir_ + "/nope";
  const std::string msg = message_of<std::runtime_error>(
      [&] { off::check_offload_dir(missing, 48000000000ull, "offload_optimizer.nvme_path"); });
  EXPECT_NE(msg.find("offload_optimizer.nvme_path: the directory " + missing + " does not exist"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("48.0 GB (48000000000 bytes)"), std::string::npos) << msg;
}

TEST_F(OffloadFiles, CheckOffloadDirNotADirectory) {
  const std::string file = dir_ + "/plain";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0644));
  const std::string msg =
      message_of<std::runtime_error>([&] { off::check_offload_dir(file, 5000000, "offload_param.nvme_path"); });
  EXPECT_NE(msg.find("offload_param.nvme_path: " + file + " is not a directory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5.0 MB (5000000 bytes)"), std::string::npos) << msg;
}

// Root writes through permissions, so chmod cannot make a directory unwritable here: /sys refuses new
// files even to root (EACCES), and a read-only tmpfs refuses them (EROFS).
TEST_F(OffloadFiles, CheckOffloadDirNotWritable) {
  const std::string msg =
      message_of<std::runtime_error>([&] { off::check_offload_dir("/sys", 1000, "offload_param.nvme_path"); });
  EXPECT_NE(msg.find("offload_param.nvme_path: the directory /sys is not writable"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1.0 kB (1000 bytes)"), std::string::npos) << msg;
}

TEST_F(OffloadFiles, CheckOffloadDirReadOnlyMount) {
  Mount m("tmpfs", "size=1m", MS_RDONLY);
  if (!m.ok()) GTEST_SKIP() << m.why();
  const std::string msg =
      message_of<std::runtime_error>([&] { off::check_offload_dir(m.dir(), 1000, "offload_optimizer.nvme_path"); });
  EXPECT_NE(msg.find("offload_optimizer.nvme_path: the directory " + m.dir() + " is not writable"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Read-only file system"), std::string::npos) << msg;
}

// Room: statvfs's free bytes, read here independently; asking for more than that fails naming both.
TEST_F(OffloadFiles, CheckOffloadDirNotEnoughRoom) {
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir_.c_str(), &vfs), 0);
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const std::uint64_t want = free_bytes + (std::uint64_t(1) << 40);  // 1 TiB more than is free
  const std::string msg =
      message_of<std::runtime_error>([&] { off::check_offload_dir(dir_, want, "offload_optimizer.nvme_path"); });
  EXPECT_NE(msg.find("offload_optimizer.nvme_path: not enough room in " + dir_), std::string::npos) << msg;
  EXPECT_NE(msg.find("(" + std::to_string(want) + " bytes)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" free"), std::string::npos) << msg;
  // The free figure in the message is statvfs's, give or take what other writers did meanwhile.
  const auto open_paren = msg.rfind('(');
  const std::uint64_t said = std::stoull(msg.substr(open_paren + 1));
  EXPECT_NEAR(static_cast<double>(said), static_cast<double>(free_bytes), 1e9) << msg;

  // A directory that passes leaves nothing behind (the probe file is removed).
  EXPECT_NO_THROW(off::check_offload_dir(dir_, 1 << 20, "offload_optimizer.nvme_path"));
  EXPECT_TRUE(list_dir(dir_).empty());
}

// measure_disk: positive figures, O_DIRECT on this ext4, its file removed.
TEST_F(OffloadFiles, MeasureDisk) {
  off::AioOptions o;
  o.block_size = 256 << 10;
  const auto bw = off::measure_disk(dir_, 16 << 20, o);
  EXPECT_TRUE(bw.direct);
  EXPECT_GT(bw.write_gbps, 0);
  EXPECT_GT(bw.read_gbps, 0);
  EXPECT_TRUE(list_dir(dir_).empty());
}

}  // namespace
