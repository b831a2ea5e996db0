// The world communicator the test main created (shared by every test of the binary).
#pragma once

#include "comm/communicator.h"

#include <memory>
#include <string>

namespace accel::test {
std::shared_ptr<comm::Communicator> world();

// A fresh, empty directory `name` that every rank of this job agrees on: rank 0 makes it (removing
// what was there), the others wait, so every rank calls it. It lies under the job's own directory,
// $TMPDIR (or /tmp)/accel_test_np<N>_<rank 0's pid>, so two jobs at the same world size (a node-shared
// and a private run under `ctest -j`) never share one. The job's directory is removed at the end when
// every rank passed, else kept and named on stderr (kept also with ACCEL_KEEP_TEST_FILES set).
std::string scratch_dir(const std::string& name);
}  // namespace accel::test
