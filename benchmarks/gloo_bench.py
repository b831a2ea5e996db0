#!/usr/bin/env python3
"""gloo_bench — the collectives of comm_bench over torch.distributed's gloo backend, printed in
comm_bench's row format (impl "gloo"), so benchmarks/run_comm_bench.sh can put them side by side.

Same measurement as comm_bench: for each size, a one-call probe sets the iterations (about --budget
seconds), then warm-up calls, a barrier, the timed calls; the time is the slowest rank's mean.
busbw as nccl-tests defines it (all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n of the
larger buffer). Launch under mpirun (rank and size from Open MPI's environment) or torchrun:

  mpirun --oversubscribe --bind-to none -np 2 $VENV/bin/python benchmarks/gloo_bench.py
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def rank_and_size():
    for r, n in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("RANK", "WORLD_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    return 0, 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-b", "--min-bytes", type=int, default=1 << 10)
    p.add_argument("-e", "--max-bytes", type=int, default=256 << 20)
    p.add_argument("-f", "--step-factor", type=int, default=4)
    p.add_argument("-w", "--warmup", type=int, default=2)
    p.add_argument("-n", "--max-iters", type=int, default=20)
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--ops", nargs="+", default=["all_reduce", "reduce_scatter", "all_gather"])
    a = p.parse_args()

    rank, size = rank_and_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    root = rank == 0

    def measure(op, nbytes, warmup, iters):
        count = nbytes // 4
        if op != "all_reduce":
            count = count // size * size
        big, small = torch.ones(count), torch.ones(count // size)

        def once():
            if op == "all_reduce":
                dist.all_reduce(big)
            elif op == "reduce_scatter":
                dist.reduce_scatter_tensor(small, big)
            else:
                dist.all_gather_into_tensor(big, small)

        for _ in range(warmup):
            once()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            once()
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t = t.item()
        algbw = count * 4 / t / 1e9
        factor = 2.0 * (size - 1) / size if op == "all_reduce" else (size - 1) / size
        return t * 1e6, algbw, algbw * factor

    if root:
        print(f"# gloo_bench: {size} ranks, torch {torch.__version__} gloo, dtype float32, "
              f"sizes {a.min_bytes}..{a.max_bytes} B x{a.step_factor}")
    for op in a.ops:
        if root:
            print(f"#\n# {op}")
            print(f"# {'impl':<8} {'size(B)':>12} {'count':>12} {'iters':>6} {'time(us)':>12} {'algbw(GB/s)':>10} "
                  f"{'busbw(GB/s)':>10}")
        nbytes = a.min_bytes
        while nbytes <= a.max_bytes:
            probe_us, _, _ = measure(op, nbytes, 1, 1)
            iters = int(min(max(a.budget / (probe_us * 1e-6), 1), a.max_iters))
            us, algbw, busbw = measure(op, nbytes, a.warmup, iters)
            if root:
                print(f"  {'gloo':<8} {nbytes:>12} {nbytes // 4:>12} {iters:>6} {us:>12.1f} {algbw:>10.3f} {busbw:>10.3f}",
                      flush=True)
            nbytes *= a.step_factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
