// accel::files: the POSIX file helpers, each against what the OS reports (stat, readlink, reading the
// bytes back), in a fresh temporary directory per test.
#include "base/files.h"
#include "support/errors.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

using accel::test::message_of;

namespace {

namespace files = accel::files;

// Independent of the helpers under test: std::filesystem.
bool lexists(const std::string& p) { return std::filesystem::exists(std::filesystem::symlink_status(p)); }
bool is_directory(const std::string& p) { return std::filesystem::is_directory(p); }
std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void put(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/accel_base_files_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());  // not the function under test
  }
  std::string dir_;
};

TEST_F(Files, MakeDirsCreatesEveryLevelAndAcceptsExistingOnes) {
  const std::string deep = dir_ + "/a/b/c";
  files::make_dirs(deep);
  EXPECT_TRUE(is_directory(dir_ + "/a"));
  EXPECT_TRUE(is_directory(dir_ + "/a/b"));
  EXPECT_TRUE(is_directory(deep));
  files::make_dirs(deep);           // again: nothing to do, no error
  files::make_dirs(deep + "/");     // a trailing slash
  files::make_dirs(dir_ + "/a/d");  // a sibling under an existing level
  EXPECT_TRUE(is_directory(dir_ + "/a/d"));
}

TEST_F(Files, MakeDirsThroughAFileFailsNamingThePath) {
  put(dir_ + "/plain", "x");
  const std::string msg = message_of<std::runtime_error>([&] { files::make_dirs(dir_ + "/plain/sub"); });
  EXPECT_NE(msg.find(dir_ + "/plain/sub"), std::string::npos) << "'" << msg << "'";
}

TEST_F(Files, WriteFileSyncedWritesTheBytesAndTruncates) {
  const std::string p = dir_ + "/data.bin";
  const std::string bytes("ab\0cd\n\xff", 7);  // binary: an embedded NUL, a high byte
  files::write_file_synced(p, bytes.data(), bytes.size());
  EXPECT_EQ(slurp(p), bytes);
  files::write_file_synced(p, "z", 1);  // shorter: the old tail is gone
  EXPECT_EQ(slurp(p), "z");
  files::write_file_synced(p, "", 0);
  EXPECT_EQ(slurp(p), "");
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644 & ~mask);
}

TEST_F(Files, WriteFileSyncedIntoAMissingDirectoryFailsNamingThePath) {
  const std::string p = dir_ + "/missing/data.bin";
  const std::string msg = message_of<std::runtime_error>([&] { files::write_file_synced(p, "x", 1); });
  EXPECT_NE(msg.find(p), std::string::npos) << "'" << msg << "'";
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << "'" << msg << "'";
}

TEST_F(Files, RemoveTreeRemovesEverythingButFollowsNoLink) {
  // Outside the tree: a directory a link inside the tree points to. rm -rf removes the link only.
  const std::string outside = dir_ + "/outside";
  files::make_dirs(outside);
  put(outside + "/keep.txt", "keep");
  const std::string tree = dir_ + "/tree";
  files::make_dirs(tree + "/x/y");
  put(tree + "/top.txt", "1");
  put(tree + "/x/y/deep.txt", "2");
  put(tree + "/x/.hidden", "3");
  ASSERT_EQ(::symlink(outside.c_str(), (tree + "/x/link_to_outside").c_str()), 0);
  ASSERT_EQ(::symlink("/nonexistent/target", (tree + "/dangling").c_str()), 0);

  files::remove_tree(tree);
  EXPECT_FALSE(lexists(tree));
  EXPECT_EQ(slurp(outside + "/keep.txt"), "keep") << "remove_tree followed a symlink";

  files::remove_tree(tree);                   // missing: fine
  files::remove_tree(outside + "/keep.txt");  // a plain file
  EXPECT_FALSE(lexists(outside + "/keep.txt"));
  EXPECT_TRUE(is_directory(outside));
}

TEST_F(Files, AbsolutePathResolvesOrReturnsTheInput) {
  const std::string real = dir_ + "/real";
  files::make_dirs(real);
  ASSERT_EQ(::symlink(real.c_str(), (dir_ + "/alias").c_str()), 0);
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(::chdir(dir_.c_str()), 0);
  const std::string from_relative = files::absolute_path("alias/../real/.");
  const std::string via_link = files::absolute_path("alias");
  ASSERT_EQ(::chdir(cwd), 0);
  // mkdtemp's /tmp may itself be a link: compare with the kernel's own resolution.
  char resolved[4096];
  ASSERT_NE(::realpath(real.c_str(), resolved), nullptr);
  EXPECT_EQ(from_relative, resolved);
  EXPECT_EQ(via_link, resolved);
  EXPECT_EQ(via_link.front(), '/');
  EXPECT_EQ(files::absolute_path("no/such/path"), "no/such/path");
}

TEST_F(Files, SelfExePathIsThisTestBinary) {
  const std::string exe = files::self_exe_path();
  EXPECT_EQ(exe.front(), '/');
  EXPECT_EQ(exe.substr(exe.rfind('/') + 1), "base_tests");
  EXPECT_EQ(::access(exe.c_str(), X_OK), 0);
}

TEST_F(Files, ReadFileReturnsTheBytesOrFailsNamingThePath) {
  const std::string p = dir_ + "/r.bin";
  std::string big(200000, 'q');  // more than one read() chunk
  big[123456] = '\0';
  put(p, big);
  EXPECT_EQ(files::read_file(p), big);
  put(p, "");
  EXPECT_EQ(files::read_file(p), "");
  const std::string missing = dir_ + "/nope";
  const std::string msg = message_of<std::runtime_error>([&] { files::read_file(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << "'" << msg << "'";
}

TEST_F(Files, WriteFileAtomicReplacesAndLeavesNoTemporary) {
  const std::string p = dir_ + "/a.json";
  put(p, "old contents, longer than the new");
  files::write_file_atomic(p, "new", 3);
  EXPECT_EQ(slurp(p), "new");
  EXPECT_FALSE(lexists(p + ".tmp"));
  // Into a directory that does not exist: an error naming the path, nothing created.
  const std::string bad = dir_ + "/missing/a.json";
  EXPECT_NE(message_of<std::runtime_error>([&] { files::write_file_atomic(bad, "x", 1); }).find(bad),
            std::string::npos);
  EXPECT_FALSE(lexists(dir_ + "/missing"));
}

TEST_F(Files, ExistsIsFileIsDir) {
  put(dir_ + "/f", "x");
  files::make_dirs(dir_ + "/d");
  ASSERT_EQ(::symlink("/nonexistent/target", (dir_ + "/dangling").c_str()), 0);
  ASSERT_EQ(::symlink((dir_ + "/f").c_str(), (dir_ + "/link_to_f").c_str()), 0);
  EXPECT_TRUE(files::exists(dir_ + "/f") && files::is_file(dir_ + "/f") && !files::is_dir(dir_ + "/f"));
  EXPECT_TRUE(files::exists(dir_ + "/d") && files::is_dir(dir_ + "/d") && !files::is_file(dir_ + "/d"));
  EXPECT_TRUE(files::exists(dir_ + "/dangling"));  // lstat: the link itself exists
  EXPECT_FALSE(files::is_file(dir_ + "/dangling") || files::is_dir(dir_ + "/dangling"));
  EXPECT_TRUE(files::is_file(dir_ + "/link_to_f"));  // stat follows the link
  EXPECT_FALSE(files::exists(dir_ + "/none") || files::is_file(dir_ + "/none") || files::is_dir(dir_ + "/none"));
}

TEST(FilesParentDir, TheDirectoryPart) {
  EXPECT_EQ(files::parent_dir("a/b"), "a");
  EXPECT_EQ(files::parent_dir("/x/y/z.txt"), "/x/y");
  EXPECT_EQ(files::parent_dir("/b"), "/");
  EXPECT_EQ(files::parent_dir("b"), ".");
}

TEST(FilesExtension, OfTheFileNameOnly) {
  EXPECT_EQ(files::without_extension("a/b.yaml"), "a/b");
  EXPECT_EQ(files::extension("a/b.yaml"), ".yaml");
  EXPECT_EQ(files::without_extension("t.tar.gz"), "t.tar");
  EXPECT_EQ(files::without_extension("a.d/b"), "a.d/b");  // a dot in a directory is not an extension
  EXPECT_EQ(files::extension("a.d/b"), "");
  EXPECT_EQ(files::without_extension("b") + files::extension("b"), "b");
}

}  // namespace
