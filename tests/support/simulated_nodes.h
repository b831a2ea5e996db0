// The node sizes a test expects, read from ACCEL_RANKS_PER_NODE as ctest sets it ("k": nodes of k
// ranks; "k0,k1,...": those sizes in rank order), or one node of every rank where it is unset (a
// machine's own ranks). The tests' own reading, apart from comm::apply_node_override.
#pragma once

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace accel::test {

inline std::vector<int> simulated_node_sizes(int world_size) {
  const char* env = std::getenv("ACCEL_RANKS_PER_NODE");
  std::vector<int> sizes;
  std::stringstream spec(env ? env : "");
  for (std::string part; std::getline(spec, part, ',');) sizes.push_back(std::stoi(part));
  if (sizes.empty()) return {world_size};
  if (sizes.size() == 1) sizes.assign(world_size / sizes[0], sizes[0]);
  return sizes;
}

inline bool nodes_of_one_size(const std::vector<int>& sizes) {
  for (int k : sizes)
    if (k != sizes.front()) return false;
  return true;
}

}  // namespace accel::test
