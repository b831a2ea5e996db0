// Hostfiles for `accel launch --hostfile`: DeepSpeed's format, which is also Open MPI's:
//
//   # comment
//   worker-1 slots=4
//   worker-2 slots=4   # trailing comments too
//
// One host per line with `slots=N` (the ranks it may run); Open MPI's `max_slots=N` is accepted and
// ignored. Pure text processing: no MPI, no torch.
#pragma once

#include "base/error.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace accel::cli {

class HostfileError : public accel::InvalidArgumentError {
 public:
  using accel::InvalidArgumentError::InvalidArgumentError;
};

struct HostSlots {
  std::string host;
  int slots = 0;
};

// Throws HostfileError naming `source`, the line number and what is wrong: a line without slots=N,
// slots not a positive integer, an unknown key, a host listed twice, no hosts at all.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& source);
// Reads and parses `path`; a missing or unreadable file is a HostfileError too.
std::vector<HostSlots> read_hostfile(const std::string& path);

}  // namespace accel::cli
