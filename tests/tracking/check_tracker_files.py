"""Checks what a gpt_lm run with log_with [tensorboard, jsonl, csv] left in its logging directory,
reading the event file with the real tensorboard package (EventAccumulator):

  * one event file (rank 0 alone wrote; a second writer would add its own file), whose scalars have
    exactly the JSONL's steps and values (as float32: TensorBoard's simple_value), and whose CRCs the
    reader checks (a copy with one flipped byte loses its records);
  * the JSONL's steps are 1..N once each, its losses those of the example's own --log_file;
  * the CSV holds the JSONL: same rows, same values (empty cell = key absent from that record);
  * the config as text (tag "config") and in config.json; histograms when asked;
  * the step metrics agree with each other (tokens/s = samples/s x seq; samples/s x step time = batch).

usage: check_tracker_files.py DIR --steps N --loss_log FILE --seq S --batch B
                              [--memory] [--histogram_every K] [--groups world,replicate]
"""
import argparse
import csv
import glob
import json
import math
import os
import shutil
import struct
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

p = argparse.ArgumentParser()
p.add_argument("dir")
p.add_argument("--steps", type=int, required=True)
p.add_argument("--loss_log", required=True)
p.add_argument("--seq", type=int, required=True)
p.add_argument("--batch", type=int, required=True)
p.add_argument("--memory", action="store_true")
p.add_argument("--histogram_every", type=int, default=0)
p.add_argument("--groups", default="world")
a = p.parse_args()

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def same(x, y):
    return (math.isnan(x) and math.isnan(y)) or x == y


events = glob.glob(os.path.join(a.dir, "events.out.tfevents.*"))
check(len(events) == 1, f"expected one event file (rank 0 only), found {events}")

records = [json.loads(line) for line in open(os.path.join(a.dir, "metrics.jsonl"))]
check(open(os.path.join(a.dir, "metrics.jsonl")).read().endswith("\n"), "the JSONL's last line is incomplete")
steps = [r["step"] for r in records]
check(steps == list(range(1, a.steps + 1)), f"JSONL steps {steps}, expected 1..{a.steps} once each")

# The example's own loss log (an independent path: LossLog, %.17g).
losses = {}
for line in open(a.loss_log):
    _, s, _, x = line.split()
    losses[int(s)] = float(x)
for r in records:
    check(r["loss"] == losses[r["step"]], f"step {r['step']}: JSONL loss {r['loss']} != loss log {losses[r['step']]}")

# Expected metric names.
later = records[1:]
for key in ["optimizer_step", "loss", "lr", "grad_norm"]:
    check(all(key in r for r in records), f"'{key}' missing from some record")
for key in ["step_time_s", "samples_per_s", "tokens_per_s"] + [
        f"comm/{g}/{d}_bytes_per_step" for g in a.groups.split(",") for d in ("sent", "received")]:
    check(all(key in r for r in later), f"'{key}' missing from a record after the first")
for r in later:
    check(abs(r["tokens_per_s"] - r["samples_per_s"] * a.seq) <= 1e-9 * r["tokens_per_s"], "tokens_per_s != samples_per_s x seq")
    check(abs(r["samples_per_s"] * r["step_time_s"] - a.batch) <= 1e-9 * a.batch, "samples_per_s x step_time_s != batch")
    check(r["comm/world/sent_bytes_per_step"] > 0, "no world traffic counted")
    check(r["optimizer_step"] == r["step"], "optimizer_step != step")
mem = [k for k in records[0] if k.startswith("memory/")]
if a.memory:
    check("memory/rank0/parameters_peak_mib" in mem and "memory/rank1/parameters_peak_mib" in mem,
          f"per-rank memory missing: {mem}")
    check(all(records[-1][k] >= 0 for k in mem), "negative memory")
    check(records[-1]["memory/rank0/parameters_peak_mib"] > 0, "no parameter memory counted")
else:
    check(not mem, f"memory keys without the counting allocator: {mem}")

# CSV == JSONL.
with open(os.path.join(a.dir, "metrics.csv"), newline="") as f:
    rows = list(csv.DictReader(f))
check(len(rows) == len(records), f"CSV has {len(rows)} rows, JSONL {len(records)}")
keys = set().union(*[r.keys() for r in records])
check(set(rows[0].keys()) == keys if rows else False, "CSV columns != JSONL keys")
for r, row in zip(records, rows):
    for k in keys:
        if k == "wall_time":
            continue
        if k not in r:
            check(row[k] == "", f"step {r['step']}: CSV has '{row[k]}' for absent {k}")
            continue
        v = float("nan") if r[k] is None else float(r[k])
        check(same(float(row[k]), v), f"step {r['step']} {k}: CSV {row[k]} != JSONL {r[k]}")

# TensorBoard: the real reader.
ea = EventAccumulator(a.dir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
ea.Reload()
tags = ea.Tags()
numeric = sorted(k for k in keys if k not in ("step", "wall_time"))
check(sorted(tags["scalars"]) == numeric, f"TensorBoard scalars {sorted(tags['scalars'])} != JSONL keys {numeric}")
compared = 0
for k in numeric:
    if k not in tags["scalars"]:
        continue
    tb = [(e.step, e.value) for e in ea.Scalars(k)]
    js = [(r["step"], f32(float("nan") if r[k] is None else r[k])) for r in records if k in r]
    check(len(tb) == len(js) and all(s1 == s2 and same(v1, v2) for (s1, v1), (s2, v2) in zip(tb, js)),
          f"{k}: TensorBoard {tb[:3]}... != JSONL {js[:3]}...")
    compared += len(tb)
config_text = ea.Tensors("config")[0].tensor_proto.string_val[0].decode() if "config" in tags["tensors"] else ""
cfg = json.load(open(os.path.join(a.dir, "config.json")))
check(cfg.get("seq") == a.seq and cfg.get("processes") == 2, f"config.json {cfg}")
for k, v in cfg.items():
    check(f"| {k} | " in config_text, f"config text lacks {k}: {config_text!r}")
if a.histogram_every:
    hist = [t for t in tags["histograms"] if t.startswith("weights/")]
    check(len(hist) > 0, "no weight histograms")
    for t in hist:
        hs = ea.Histograms(t)
        check([h.step for h in hs] == list(range(a.histogram_every, a.steps + 1, a.histogram_every)),
              f"{t}: histogram steps {[h.step for h in hs]}")
        for h in hs:
            hv = h.histogram_value
            check(hv.num > 0 and sum(hv.bucket) == hv.num and hv.min <= hv.max, f"{t}: bad histogram {hv}")

# The reader checks the masked CRC32Cs: one flipped byte in the first summary loses the records.
tmp = tempfile.mkdtemp()
try:
    data = bytearray(open(events[0], "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(os.path.join(tmp, os.path.basename(events[0])), "wb").write(bytes(data))
    bad = EventAccumulator(tmp, size_guidance={"scalars": 0})
    bad.Reload()
    n_bad = sum(len(bad.Scalars(t)) for t in bad.Tags()["scalars"])
    check(n_bad < compared, f"a corrupted copy still gave all {n_bad} scalars: CRCs not checked?")
finally:
    shutil.rmtree(tmp)

if failures:
    print("FAIL\n  " + "\n  ".join(failures[:20]))
    sys.exit(1)
print(f"tracker files OK: {len(records)} records, {len(numeric)} scalar tags, {compared} TensorBoard values "
      f"equal to the JSONL's, CSV equal, config and histograms read back")
