#!/usr/bin/env python3
# torch_anchor: step_bench's training step in PyTorch itself, the anchor accel's step times are held
# against. The same GPT as step_bench (examples/models/gpt.h: pre-norm blocks, causal attention
# written out with matmul + masked_fill + softmax or fused in scaled_dot_product_attention, --attention
# auto|eager|sdpa with step_bench's default, sdpa on CUDA; exact GELU, no qkv bias, head tied to the token
# embedding, positions randn * 0.1), the same sizes (vocab 4096, width 384, 6 heads, 10 layers,
# seq 64), AdamW(lr 1e-4, PyTorch's and libtorch's defaults otherwise: betas 0.9/0.999, eps 1e-8,
# weight decay 0.01), the same batch (4 sequences per rank) and synthetic data (uniform token ids,
# seeded per rank), and the same timing: a barrier, then forward + loss + backward + step +
# zero_grad, the slowest rank's time, the median of --steps after --warmup.
#
#   --strategy plain             the model alone (1 rank), step_bench --strategy plain's twin
#              DDP               DistributedDataParallel (default buckets)
#              FSDP2             fully_shard per block, then the root (reshard_after_forward=True):
#                                accel FULL_SHARD's twin
#              FSDP2_NO_RESHARD  the same with reshard_after_forward=False: SHARD_GRAD_OP's twin
#
# Launch (gloo on CPU, NCCL on CUDA):
#   accel launch -n 2 $PY benchmarks/torch_anchor.py --strategy DDP      # as run_step_bench.sh does
#   mpirun -np 2 $PY benchmarks/torch_anchor.py --strategy FSDP2         # OMPI_COMM_WORLD_* read
#   torchrun --nproc-per-node 2 benchmarks/torch_anchor.py --strategy DDP
# The rendezvous is MASTER_ADDR:MASTER_PORT when set, else 127.0.0.1 and a port derived from the job
# (accel launch's status directory or Open MPI's job id), so concurrent jobs do not collide.
# --device auto (the default) picks CUDA when present, as step_bench does; each rank takes
# cuda:LOCAL_RANK. Intra-op threads: OMP_NUM_THREADS when set (accel launch sets each rank's share),
# else the machine's cores over the ranks on it, as step_bench does.
# --precision bf16 is step_bench --precision bf16's twin: the model computes in bf16 and AdamW steps fp32
# masters. plain keeps the masters by hand (bf16 gradients copied into fp32 ones, the step, the bf16
# parameters copied back: DeepSpeed's bf16 recipe); FSDP2 and FSDP2_NO_RESHARD use
# MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32). DDP has no such recipe (autocast over fp32
# parameters is another computation) and refuses it. The loss is computed in fp32, as step_bench does.
# --precision fp8 is step_bench --precision fp8's twin in torchao's float8 training: bf16 with fp32 masters
# as above, every nn.Linear of the blocks converted by torchao.float8.convert_to_float8_training
# (--fp8-recipe tensorwise or rowwise, torchao's recipe names, as fp8_config.recipe), the embedding,
# norms and attention in bf16. --compile wraps the model in torch.compile, which is how torchao fuses
# its amax/scale/cast kernels (its published speed-ups are with it). plain, FSDP2 and FSDP2_NO_RESHARD
# (without torchao's float8 all-gather). Needs torchao (scripts/setup.sh installs it; exit 77 without).
# --profile: after the timed steps, 3 more under torch.profiler; rank 0 prints the top ops by device
# time (CPU time on the CPU) on stderr, and the share of the step the device was busy.
# Output: one table row like step_bench's (strategy, precision, ranks, step ms, peak RSS MiB), or with
# --json one line {"strategy", "ranks", "step_ms", "params", ...}.
import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, sdpa=False):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa  # one fused scaled_dot_product_attention, as step_bench --attention sdpa
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        hd = d // self.heads
        # split, then views by head (as step_bench's model: one cat in backward, not unbind's stack and copy)
        q, k, v = (t.view(B, T, self.heads, hd).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(d, -1))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.matmul(torch.softmax(att.masked_fill(mask, -1e9), -1), v)
        y = y.transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq, sdpa=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.1)
        self.blocks = nn.ModuleList(Block(d, heads, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos[: tokens.size(1)]
        for b in self.blocks:
            x = b(x)
        return torch.matmul(self.ln_f(x), self.tok.weight.t())


def lm_loss(logits, targets):
    return F.nll_loss(F.log_softmax(logits.reshape(-1, logits.size(-1)), -1), targets.reshape(-1))


def first_env(*names):
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


def rendezvous():
    """rank, world, local rank, local world from torchrun, accel launch (accel-rank) or Open MPI, and
    the init_method for init_process_group (None: env://, MASTER_ADDR and MASTER_PORT)."""
    rank = int(first_env("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK") or 0)
    world = int(first_env("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE") or 1)
    local_rank = int(first_env("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK") or rank)
    local_world = int(first_env("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE") or world)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    status_dir = os.environ.get("ACCEL_LAUNCH_STATUS_DIR")
    if "MASTER_PORT" not in os.environ and "MASTER_ADDR" not in os.environ and status_dir and local_world == world:
        # One machine under accel launch: the ranks meet in a file of the launch's own folder, so no
        # port is picked that another program may hold (a clash failed a run now and then).
        return rank, world, local_rank, local_world, "file://" + os.path.join(status_dir, "torch_anchor_store")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        job = first_env("ACCEL_LAUNCH_STATUS_DIR", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri") or "anchor"
        os.environ["MASTER_PORT"] = str(20000 + zlib.crc32(job.encode()) % 30000)
    return rank, world, local_rank, local_world, None


def profile(step, use_cuda, distributed, rank, step_ms, steps=3):
    """steps more steps under torch.profiler; rank 0 prints the top ops by device (or CPU) time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    if use_cuda:
        torch.cuda.synchronize()
    with torch_profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            if distributed:
                dist.barrier()
            step()
        if use_cuda:
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - t0
    if rank != 0:
        return
    avgs = prof.key_averages()
    key = "self_device_time_total" if use_cuda else "self_cpu_time_total"
    print(avgs.table(sort_by=key, row_limit=30), file=sys.stderr)
    # The device's busy share as step_bench --profile computes it (benchmarks/step_profile.cpp): the union
    # of its kernels', copies' and memsets' intervals (streams overlap; a record_function range, such as
    # Optimizer.step#AdamW.step, shows on the device as an annotation and is not work) over the profiled
    # steps' wall time.
    if use_cuda:
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
        busy_us, end = 0.0, float("-inf")
        for s, e in spans:
            if s > end:
                busy_us, end = busy_us + (e - s), e
            elif e > end:
                busy_us, end = busy_us + (e - end), e
        busy_ms = busy_us / 1e3 / steps
        print(f"profile: device busy {busy_ms:.1f} ms a step (kernels, copies and memsets, their union) of a "
              f"{wall_s * 1e3 / steps:.1f} ms profiled step ({100 * busy_us / 1e6 / wall_s:.0f}%); unprofiled step "
              f"{step_ms:.1f} ms", file=sys.stderr)
    else:
        busy_ms = sum(e.self_cpu_time_total for e in avgs) / 1e3 / steps
        print(f"profile: {busy_ms:.1f} ms of CPU time (all threads' ops, self time) per step against a "
              f"{step_ms:.1f} ms step ({100 * busy_ms / step_ms:.0f}%)", file=sys.stderr)


def check_args_file(suffix, text):
    """ACCEL_CHECK_ARGS=DIR (accel's dry run of a script's commands, src/base/check_args.h): DIR/<pid>.start
    with the command line as it starts, DIR/<pid>.ok once the arguments are checked."""
    d = os.environ.get("ACCEL_CHECK_ARGS")
    if d:
        if suffix == ".start":  # (an earlier process of this pid passed; this one has not yet)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(d, f"{os.getpid()}.ok"))
        with open(os.path.join(d, f"{os.getpid()}{suffix}"), "w") as f:
            f.write(text)
    return bool(d)


def main():
    check_args_file(".start", "\n".join(sys.argv) + "\n")
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--strategy", default="DDP", choices=["plain", "DDP", "FSDP2", "FSDP2_NO_RESHARD"])
    ap.add_argument("--steps", type=int, default=6, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--d-model", "--d_model", dest="d", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--attention", default="auto", choices=["auto", "eager", "sdpa"],
                    help="written out or F.scaled_dot_product_attention (auto: sdpa on CUDA), as step_bench's")
    ap.add_argument("--backend", default=None, help="gloo (CPU default) or nccl (CUDA default)")
    ap.add_argument("--show-loss", action="store_true", help="rank 0's loss of every step on stderr")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the table row")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp8"])
    ap.add_argument("--fp8-recipe", "--fp8_recipe", dest="fp8_recipe", default="tensorwise",
                    choices=["tensorwise", "rowwise"], help="torchao's float8 recipe (with --precision fp8)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (fuses torchao's casts)")
    ap.add_argument("--profile", action="store_true", help="3 more steps under torch.profiler (see above)")
    a = ap.parse_args()
    fp8 = a.precision == "fp8"
    bf16 = a.precision in ("bf16", "fp8")  # fp8: bf16 compute, products in fp8
    if bf16 and a.strategy == "DDP":
        sys.exit(f"torch_anchor: --precision {a.precision} runs with plain, FSDP2 or FSDP2_NO_RESHARD "
                 "(DDP has no fp32 masters)")
    if a.d % a.heads:
        sys.exit(f"torch_anchor: --heads {a.heads} does not divide --d-model {a.d}")
    if check_args_file(".ok", "ok\n"):
        print("torch_anchor: arguments checked (ACCEL_CHECK_ARGS); stopping before any work", file=sys.stderr)
        sys.exit(0)
    if fp8:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as e:
            print(f"SKIP: torch_anchor --precision fp8 needs torchao ({e}); scripts/setup.sh installs it",
                  file=sys.stderr)
            sys.exit(77)

    rank, world, local_rank, local_world, init_method = rendezvous()
    if a.strategy == "plain" and world != 1:
        sys.exit("torch_anchor: --strategy plain runs on 1 rank")
    use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    threads = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(threads) if threads else max(1, (os.cpu_count() or 1) // local_world))
    if a.compile:
        # torch.compile builds code on the machine (a C compiler and Python's headers; on CUDA, Triton's
        # driver module): one tiny function first, so a machine without them is a SKIP, not a failure
        # after the model is built.
        try:
            torch.compile(lambda t: t * 2 + 1)(torch.ones(8, device=device))
        except Exception as e:  # (whatever inductor raises: a missing compiler, headers, Triton)
            print(f"SKIP: torch.compile does not run here: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}",
                  file=sys.stderr)
            sys.exit(77)

    distributed = a.strategy != "plain"
    if distributed:
        dist.init_process_group(a.backend or ("nccl" if use_cuda else "gloo"), init_method=init_method, rank=rank,
                                world_size=world, device_id=device if use_cuda else None)

    torch.manual_seed(0)
    sdpa = a.attention == "sdpa" or (a.attention == "auto" and use_cuda)
    model = GPT(a.vocab, a.d, a.heads, a.layers, a.seq, sdpa).to(device)
    params = sum(p.numel() for p in model.parameters())
    if fp8:  # the blocks' linear layers (the head is the tied embedding), as accel's GPT with GPTConfig::fp8
        convert_to_float8_training(model.blocks, config=Float8LinearConfig.from_recipe_name(a.fp8_recipe))
    if a.strategy == "DDP":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if use_cuda else None)
    elif a.strategy.startswith("FSDP2"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        kw = {"mesh": mesh, "reshard_after_forward": a.strategy == "FSDP2"}
        if bf16:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, **kw)
        fully_shard(model, **kw)
    masters = None
    if bf16 and a.strategy == "plain":  # fp32 masters by hand; the model computes in bf16
        masters = [p.detach().clone() for p in model.parameters()]
        for m in masters:
            m.grad = torch.zeros_like(m)
        model.to(torch.bfloat16)
    if a.compile:  # after the wrapping and the dtype: what runs is compiled
        model = torch.compile(model)
    opt = torch.optim.AdamW(masters if masters is not None else model.parameters(), lr=1e-4)

    def step():
        logits = model(x)
        loss = lm_loss(logits.float() if bf16 else logits, y)
        loss.backward()
        if masters is not None:
            bf = [p for p in model.parameters()]
            torch._foreach_copy_([m.grad for m in masters], [p.grad for p in bf])
            opt.step()
            torch._foreach_copy_([p.data for p in bf], masters)
            model.zero_grad()
        else:
            opt.step()
            opt.zero_grad()
        return loss

    torch.manual_seed(100 + rank)
    x = torch.randint(a.vocab, (a.batch, a.seq)).to(device)
    y = torch.randint(a.vocab, (a.batch, a.seq)).to(device)
    times = []
    for s in range(a.warmup + a.steps):
        if distributed:
            dist.barrier()
        if use_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        if use_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if a.show_loss and rank == 0:
            print(f"step {s:>2} {a.strategy:<13} loss {loss.item():.5f}", file=sys.stderr)
        if s >= a.warmup:
            if distributed:  # the slowest rank's time
                tt = torch.tensor([t], dtype=torch.float64, device=device)
                dist.all_reduce(tt, op=dist.ReduceOp.MAX)
                t = tt.item()
            times.append(t)
    step_ms = statistics.median_high(times) * 1e3  # step_bench's median: v[n / 2] of the sorted times
    if a.profile:
        profile(step, use_cuda, distributed, rank, step_ms)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    if distributed:
        r = torch.tensor([rss], dtype=torch.float64, device=device)
        dist.all_reduce(r, op=dist.ReduceOp.MAX)
        rss = r.item()
    if rank == 0:
        name = "torch " + a.strategy
        if a.json:
            print(json.dumps({"strategy": name, "precision": a.precision, "ranks": world, "device": device.type,
                              "params": params, "vocab": a.vocab, "d_model": a.d, "heads": a.heads,
                              "layers": a.layers, "seq": a.seq, "batch": a.batch, "threads": torch.get_num_threads(),
                              "step_ms": round(step_ms, 1), "peak_rss": round(rss)}))
        else:
            print(f"| {name:<22} | {a.precision:<9} | {world} | {step_ms:>8.1f} | peak RSS {rss / 1048576:.1f} MiB |")
    if distributed:
        # Leave without tearing gloo down: DDP's reducer and gloo's threads at interpreter exit end in
        # "terminate called without an active exception" (SIGABRT) here, after the work is done.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
