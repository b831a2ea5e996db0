#!/usr/bin/env bash
# The comm_bench table of docs/performance.md: accel's collectives beside Open MPI's (blocking and
# non-blocking, measured in the same comm_bench run, size by size) and torch.distributed gloo's
# (benchmarks/gloo_bench.py, same sizes and method), float32, at 2 and 4 ranks.
#   bash benchmarks/run_comm_bench.sh [NP...]          # default: 2 4
# Environment: COMM_BENCH (default build/bin/comm_bench), PYTHON (a Python with torch; default
# the accel venv), BENCH_ARGS (extra arguments for both, e.g. "-e 67108864").
# Cells: busbw in GB/s (nccl-tests' definition); the 1 KiB row is latency in µs. "best other" is the
# best of Open MPI blocking, non-blocking and gloo; "accel/best" > 1 means accel is faster.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${COMM_BENCH:-$ROOT/build/bin/comm_bench}
PY=${PYTHON:-/root/.cache/accel/venv-torch-2.11.0/bin/python}
NPS=("$@")
[ ${#NPS[@]} -gt 0 ] || NPS=(2 4)
read -r -a EXTRA <<< "${BENCH_ARGS:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for np in "${NPS[@]}"; do
  mpirun --oversubscribe --bind-to none -np "$np" "$BIN" "${EXTRA[@]}" > "$tmp/accel_$np.txt"
  mpirun --oversubscribe --bind-to none -np "$np" "$PY" "$ROOT/benchmarks/gloo_bench.py" "${EXTRA[@]}" > "$tmp/gloo_$np.txt"
  echo "## $np ranks"
  head -n 1 "$tmp/accel_$np.txt"
  grep '^# overlap' "$tmp/accel_$np.txt" || true
  "$PY" - "$tmp/accel_$np.txt" "$tmp/gloo_$np.txt" <<'PYEOF'
import sys
rows = {}  # (op, size) -> {impl: (us, busbw)}
order = []
for path in sys.argv[1:]:
    op = None
    for line in open(path):
        s = line.split()
        if line.startswith("# ") and len(s) == 2:
            op = s[1]
        elif not line.startswith("#") and len(s) == 7 and op:
            impl, size, us, busbw = s[0], int(s[1]), float(s[4]), float(s[6])
            if (op, size) not in rows:
                rows[(op, size)] = {}
                order.append((op, size))
            rows[(op, size)][impl] = (us, busbw)
impls = ["accel", "mpi", "mpi_nb", "gloo"]
def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for op in dict.fromkeys(o for o, _ in order):
    print(f"\n{op}\n")
    print("| size | accel | Open MPI blocking | Open MPI non-blocking | gloo | accel / best other |")
    print("|---|---:|---:|---:|---:|---:|")
    for o, size in order:
        if o != op:
            continue
        r = rows[(o, size)]
        lat = size <= 1024
        cell = lambda i: "-" if i not in r else (f"{r[i][0]:.1f} µs" if lat else f"{r[i][1]:.2f}")
        others = [r[i] for i in impls[1:] if i in r]
        ratio = "-"
        if "accel" in r and others:
            ratio = (min(o[0] for o in others) / r["accel"][0]) if lat else (r["accel"][1] / max(o[1] for o in others))
            ratio = f"{ratio:.2f}"
        print(f"| {size_name(size)}{' (latency)' if lat else ''} | " + " | ".join(cell(i) for i in impls) + f" | {ratio} |")
PYEOF
  echo
done
