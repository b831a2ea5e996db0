#!/usr/bin/env python3
"""Checks what `accel bench` wrote, against expectations derived here, not read from accel:

    bench_check.py OUT_DIR --ranks 1,2,4 --strategies DDP,ZERO_2,ZERO_3 [--nodes 1,1,2] [--min-records K]

- OUT_DIR/scaling.jsonl holds one record per strategy x world size (or, with --min-records, at least K
  records, in the planned order: world size, then strategy), each with the columns the report promises;
- params equals the GPT's closed form from its shape: root (tok vocab*d + pos seq*d + ln_f 2d; the head
  is tied) + layers * (12 d^2 + 10 d);
- samples/s = batch * ranks / step time; efficiency = per-rank samples/s over the same strategy's
  at the fewest ranks;
- bytes moved per rank per step (nccl-tests' bus bytes) = the traffic test's formula (tests/zero/
  test_engine.cpp) within 1%: 2 Psi (N-1)/N * 4 B for DDP / ZeRO-1 / ZeRO-2, and for ZeRO-3, whose
  formula (3 Psi) the test asserts for models with every parameter in a unit, the same count with the
  GPT's root unit gathered once per step instead of twice: (3 Psi - root) (N-1)/N * 4 B. The record's
  own formula column must be the 2/3 Psi figure. A ZeRO-3 record of ranks on one node says its parameters
  were node-shared (the default there) and moved only its reduce-scatter, 1 Psi (N-1)/N * 4 B (its formula
  column too); one across nodes says they were not;
- nodes per record (--nodes) when given;
- the three PNGs exist, carry the PNG signature and an IHDR of a plausible size, and are not tiny.
"""
import argparse
import json
import struct
import sys

errors = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        errors.append(what)


def near(a, b, rel):
    return abs(a - b) <= rel * abs(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", required=True)
    ap.add_argument("--strategies", required=True)
    ap.add_argument("--nodes")
    ap.add_argument("--min-records", type=int)
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    strategies = a.strategies.split(",")
    nodes = dict(zip(ranks, [int(x) for x in a.nodes.split(",")])) if a.nodes else {}
    planned = [(n, s) for n in ranks for s in strategies]

    with open(f"{a.out}/scaling.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    if a.min_records is not None:
        check(a.min_records <= len(records) < len(planned),
              f"{len(records)} records kept (at least {a.min_records}, fewer than the {len(planned)} planned)")
    else:
        check(len(records) == len(planned), f"{len(records)} records, {len(planned)} planned")
    check([(r["ranks"], r["strategy"]) for r in records] == planned[: len(records)], "records in the planned order")

    base = {}
    for r in records:
        tag = f"{r['strategy']} {r['ranks']} ranks"
        for key in ("strategy", "precision", "ranks", "nodes", "params", "step_ms", "samples_per_s", "efficiency",
                    "peak_bytes", "model_states_bytes", "model_states_formula_bytes", "moved_bytes",
                    "moved_formula_bytes"):
            if key not in r:
                check(False, f"{tag}: column {key}")
        for cat in ("parameters", "gradients", "optimizer", "gathered", "activations", "total"):
            check(r["peak_bytes"].get(cat, -1) >= 0, f"{tag}: peak_bytes.{cat} present")
        m = r["model"]
        V, d, T, L = m["vocab"], m["d_model"], m["seq"], m["layers"]
        root = V * d + T * d + 2 * d
        psi = root + L * (12 * d * d + 10 * d)
        check(r["params"] == psi, f"{tag}: params {r['params']} = closed form {psi}")
        n = r["ranks"]
        sps = r["batch_per_rank"] * n / (r["step_ms"] / 1e3)
        check(near(r["samples_per_s"], sps, 1e-9), f"{tag}: samples/s {r['samples_per_s']:.2f} = batch*ranks/step")
        key = (r["strategy"], r["precision"])
        base.setdefault(key, r)
        b = base[key]
        eff = (r["samples_per_s"] / n) / (b["samples_per_s"] / b["ranks"])
        check(near(r["efficiency"], eff, 1e-9) and r["efficiency_base_ranks"] == b["ranks"],
              f"{tag}: efficiency {r['efficiency']:.3f} against {b['ranks']} rank(s)")
        f = (n - 1) / n
        sharded_params = r["strategy"] in ("ZERO_3", "FULL_SHARD")
        node_shared = sharded_params and n > 1 and r["nodes"] == 1
        check(r["node_shared_params"] == node_shared, f"{tag}: node-shared parameters {r['node_shared_params']}")
        k = 1 if node_shared else 3 if sharded_params else 2
        formula = k * psi * f * 4
        check(near(r["moved_formula_bytes"], formula, 1e-9) if n > 1 else r["moved_formula_bytes"] == 0,
              f"{tag}: formula column {r['moved_formula_bytes']:.0f} = {k} Psi (N-1)/N 4 B")
        want = (psi if node_shared else 3 * psi - root if sharded_params else 2 * psi) * f * 4
        if n == 1:
            check(r["moved_bytes"] == 0, f"{tag}: nothing moved on 1 rank")
        else:
            check(near(r["moved_bytes"], want, 0.01),
                  f"{tag}: moved {r['moved_bytes']:.0f} B = {want:.0f} B within 1% (ratio {r['moved_bytes'] / want:.4f})")
        if n in nodes:
            check(r["nodes"] == nodes[n], f"{tag}: nodes {r['nodes']} = {nodes[n]}")

    for name in ("scaling_throughput", "scaling_memory", "scaling_traffic"):
        path = f"{a.out}/{name}.png"
        try:
            data = open(path, "rb").read()
        except OSError as e:
            check(False, f"{path}: {e}")
            continue
        ok = data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        w, h = struct.unpack(">II", data[16:24]) if ok else (0, 0)
        check(ok and 300 <= w <= 2000 and 200 <= h <= 2000 and len(data) > 10000,
              f"{path}: PNG {w}x{h}, {len(data)} bytes")

    if errors:
        print(f"FAILED: {len(errors)} check(s)")
        sys.exit(1)
    print(f"PASSED: {len(records)} records and 3 PNGs")


if __name__ == "__main__":
    main()
