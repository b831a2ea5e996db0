#!/usr/bin/env python3
"""The scaling report's plots: reads the JSONL that `accel bench` writes and draws three PNGs.

    python benchmarks/plot_scaling.py OUT/scaling.jsonl OUT_DIR

  scaling_throughput.png  samples/s (all ranks) and scaling efficiency against ranks
  scaling_memory.png      model states per rank (parameters + gradients + optimizer state, measured by
                          the counting allocator) against ranks, each with its ZeRO formula as a dashed line
  scaling_traffic.png     bytes moved per rank per step (bus bytes) against ranks, with the formula's line

One line per strategy and precision. Records come from step_bench through `accel bench`; this script
only draws them (matplotlib, the Agg backend: no display needed).
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def series(records):
    """{(strategy, precision): [record, ...] sorted by ranks}, in the order first seen."""
    out = defaultdict(list)
    for r in records:
        out[(r["strategy"], r["precision"])].append(r)
    for v in out.values():
        v.sort(key=lambda r: r["ranks"])
    return out


def label(key, groups):
    s, p = key
    return s if len({k[1] for k in groups}) == 1 and p == "fp32" else f"{s} {p}"


def rank_axis(ax, records):
    ranks = sorted({r["ranks"] for r in records})
    nodes = {r["ranks"]: r.get("nodes", 1) for r in records}
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks)
    ax.set_xticklabels([f"{n}" + (f"\n({nodes[n]} nodes)" if nodes[n] > 1 else "") for n in ranks])
    ax.set_xlabel("ranks")
    ax.grid(True, alpha=0.3)


def title(records):
    r = records[0]
    m = r["model"]
    return (f"GPT {r['params'] / 1e6:.2f}M params (d {m['d_model']}, {m['layers']} layers, seq {m['seq']}), "
            f"batch {r['batch_per_rank']}/rank, {r['device']}")


def main(jsonl, out_dir):
    records = load(jsonl)
    if not records:
        sys.exit(f"plot_scaling: {jsonl} has no records")
    groups = series(records)
    colors = {k: f"C{i}" for i, k in enumerate(groups)}
    mib = 1024.0 * 1024.0

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, rs in groups.items():
        x = [r["ranks"] for r in rs]
        a1.plot(x, [r["samples_per_s"] for r in rs], "o-", color=colors[k], label=label(k, groups))
        a2.plot(x, [r["efficiency"] for r in rs], "o-", color=colors[k], label=label(k, groups))
    a2.axhline(1.0, color="gray", ls=":", lw=1)
    a1.set_ylabel("samples/s (all ranks)")
    a1.set_title("throughput")
    a2.set_ylabel("per-rank samples/s / 1-rank samples/s")
    a2.set_title("scaling efficiency (weak scaling)")
    a1.set_ylim(bottom=0)
    a2.set_ylim(bottom=0)
    for a in (a1, a2):
        rank_axis(a, records)
        a.legend(fontsize=8)
    fig.suptitle(title(records), fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/scaling_throughput.png", dpi=80)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for k, rs in groups.items():
        x = [r["ranks"] for r in rs]
        ax.plot(x, [r["model_states_bytes"] / mib for r in rs], "o-", color=colors[k],
                label=f"{label(k, groups)} measured")
        ax.plot(x, [r["model_states_formula_bytes"] / mib for r in rs], "--", color=colors[k], alpha=0.7,
                label=f"{label(k, groups)} formula")
    ax.set_ylabel("MiB per rank")
    ax.set_title("model states per rank: peak params + grads + optimizer (measured), ZeRO formula (dashed)", fontsize=9)
    rank_axis(ax, records)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title(records), fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/scaling_memory.png", dpi=80)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for k, rs in groups.items():
        x = [r["ranks"] for r in rs]
        ax.plot(x, [r["moved_bytes"] / mib for r in rs], "o-", color=colors[k], label=f"{label(k, groups)} measured")
        f = [(r["ranks"], r["moved_formula_bytes"] / mib) for r in rs if r.get("moved_formula_bytes") is not None]
        if f:
            ax.plot([p[0] for p in f], [p[1] for p in f], "--", color=colors[k], alpha=0.7,
                    label=f"{label(k, groups)} formula")
    ax.set_ylabel("MiB moved per rank per step (bus bytes)")
    ax.set_title("communication: 2Ψ (DDP, ZeRO-1/2) and 3Ψ (ZeRO-3) × (N-1)/N", fontsize=10)
    rank_axis(ax, records)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title(records), fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/scaling_traffic.png", dpi=80)
    plt.close(fig)
    print(f"plot_scaling: wrote {out_dir}/scaling_throughput.png, scaling_memory.png, scaling_traffic.png")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_scaling.py SCALING.jsonl OUT_DIR")
    main(sys.argv[1], sys.argv[2])
