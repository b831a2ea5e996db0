// The world communicator the test main created (shared by every test of the binary).
#pragma once

#include "comm/communicator.h"

#include <memory>

namespace accel::test {
std::shared_ptr<comm::Communicator> world();
}  // namespace accel::test
