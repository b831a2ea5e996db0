#include <accel/comm/communicator.h>
#include <accel/version.h>

#include <ATen/ops/ones.h>

#include <cstdio>

int main() {
  auto world = accel::comm::Communicator::world();
  at::Tensor t = at::ones({3});
  world->all_reduce(t);
  std::printf("accel %s: rank %d of %d, sum %g\n", ACCEL_VERSION, world->rank(), world->size(), t[0].item<double>());
  return t[0].item<double>() == world->size() ? 0 : 1;
}
