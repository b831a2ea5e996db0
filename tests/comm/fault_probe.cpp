// A program that misbehaves on purpose, for tests/comm/fault_test.sh:
//   fault_probe timeout  rank 1 never joins; the others' all_reduce must raise TimeoutError naming
//                        the collective and the rank, and the job must then end non-zero.
//   fault_probe exit     rank 1 dies (exit code 7) before a collective; the others must not hang:
//                        under mpirun's default they are ended with the job; where the launcher
//                        leaves them running, their all_reduce raises TimeoutError within its 3 s
//                        timeout, naming the collective and the rank, and they exit 3.
//   fault_probe step     rank 1's optimizer step throws (its closure, under ZeRO-3) while its peers
//                        are inside the step's collectives; the program catches the error and returns,
//                        as a user's main would. The job must end at once, naming rank 1 and the
//                        error, not after the peers' collectives time out.
#include "comm/communicator.h"
#include "zero/sharded_optimizer.h"

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

using namespace accel::comm;

// The surviving ranks: an all_reduce that rank 1 never joins must raise TimeoutError.
int survivor(Communicator& world, int r, std::chrono::milliseconds timeout) {
  at::Tensor t = at::ones({4}, at::kFloat);
  try {
    world.all_reduce(t, {ReduceOp::Sum, timeout});
    std::printf("rank %d: all_reduce returned without rank 1\n", r);
    return 0;
  } catch (const TimeoutError& e) {
    std::printf("rank %d caught TimeoutError: %s\n", r, e.what());
    std::fflush(stdout);
    return 3;  // exiting with a broken communicator aborts the MPI job
  }
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  auto world = Communicator::world();
  const int r = world->rank();
  world->barrier();
  if (std::strcmp(mode, "timeout") == 0) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(120));  // never joins; killed by the abort
      return 0;
    }
    return survivor(*world, r, std::chrono::milliseconds(2000));
  }
  if (std::strcmp(mode, "exit") == 0) {
    if (r == 1) std::_Exit(7);
    return survivor(*world, r, std::chrono::milliseconds(3000));
  }
  if (std::strcmp(mode, "step") == 0) {
    auto model = std::make_shared<torch::nn::LinearImpl>(8, 8);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    auto p = accel::zero::prepare(model, opt, accel::zero::ShardingSpec::zero(3), world);
    try {
      p.engine->backward(model->forward(at::ones({2, 8})).sum());
      p.optimizer->step([&] {
        if (r == 1) throw std::runtime_error("injected failure in rank 1's closure");
        return at::Tensor();
      });
      std::printf("rank %d: the step returned\n", r);
      return 0;
    } catch (const std::exception& e) {
      std::printf("rank %d caught: %s\n", r, e.what());
      std::fflush(stdout);
      return 4;
    }
  }
  std::fprintf(stderr, "usage: fault_probe timeout|exit|step\n");
  return 2;
}
