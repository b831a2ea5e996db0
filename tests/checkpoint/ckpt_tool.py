"""An independent reader of accel checkpoints (index.json + shard_<r>.bin), with numpy only.

  ckpt_tool.py same A B      every tensor (parameters, optimizer moments, buffers) reassembled from
                             its slices is bitwise equal in A and B, and so are step and the loaders
  ckpt_tool.py summary A     what A holds
  ckpt_tool.py export A M    the safetensors weights in directory M (save_model, read by Python's
                             safetensors) equal A's parameters bit for bit
Exit status 0 when the check holds; 1 with the differences otherwise.
"""
import json
import sys
import zlib

import numpy as np

DTYPES = {"Float": np.float32, "Double": np.float64, "Half": np.float16, "Long": np.int64, "Int": np.int32,
          "Short": np.int16, "Char": np.int8, "Byte": np.uint8, "Bool": np.bool_}


def load(d):
    with open(f"{d}/index.json") as f:
        index = json.load(f)
    assert index["format"] == "accel-checkpoint", index.get("format")
    tensors = {}
    for key, e in index["tensors"].items():
        dt = DTYPES[e["dtype"]]
        n = int(np.prod(e["shape"])) if e["shape"] else 1
        flat = np.zeros(n, dtype=dt)
        covered = np.zeros(n, dtype=bool)
        for s in e["slices"]:
            with open(f"{d}/{s['file']}", "rb") as f:
                f.seek(s["offset"])
                raw = f.read(s["bytes"])
            assert len(raw) == s["bytes"], f"{s['file']} truncated"
            assert zlib.crc32(raw) == s["crc32"], f"{key}: crc mismatch in {s['file']}"
            flat[s["begin"]:s["end"]] = np.frombuffer(raw, dtype=dt)
            covered[s["begin"]:s["end"]] = True
        if not key.startswith("optim/"):
            assert covered.all(), f"{key}: not every element is in a slice"
        tensors[key] = (flat.reshape(e["shape"]), covered)
    return index, tensors


def export_matches(ckpt, model_dir):
    import glob
    from safetensors.numpy import load_file
    _, tensors = load(ckpt)
    exported = {}
    for f in sorted(glob.glob(f"{model_dir}/*.safetensors")):
        exported.update(load_file(f))
    params = {k[len("param/"):]: v for k, (v, _) in tensors.items() if k.startswith("param/")}
    bad = [k for k in params if k not in exported or not np.array_equal(exported[k], params[k])]
    print(f"{len(exported)} exported tensors, {len(params)} checkpoint parameters, {len(bad)} differ")
    for k in bad[:10]:
        print("  " + k)
    return 1 if bad or not params else 0


def main():
    if sys.argv[1] == "export":
        return export_matches(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "summary":
        index, tensors = load(sys.argv[2])
        print(f"world {index['world_size']} {index['strategy']} step {index['training']['step']}: "
              f"{len(tensors)} tensors, optimizer {index['optimizer']['type']}")
        return 0
    ia, ta = load(sys.argv[2])
    ib, tb = load(sys.argv[3])
    bad = []
    if set(ta) != set(tb):
        bad.append(f"keys differ: only in A {sorted(set(ta) - set(tb))[:5]}, only in B {sorted(set(tb) - set(ta))[:5]}")
    for k in sorted(set(ta) & set(tb)):
        (a, ca), (b, cb) = ta[k], tb[k]
        if a.shape != b.shape or a.dtype != b.dtype or not np.array_equal(ca, cb) or not np.array_equal(a, b):
            bad.append(f"{k}: differs")
    for field in ("step", "loaders"):
        if ia["training"][field] != ib["training"][field]:
            bad.append(f"training.{field}: {ia['training'][field]} vs {ib['training'][field]}")
    n_optim = sum(k.startswith("optim/") for k in ta)
    print(f"A: world {ia['world_size']} {ia['strategy']}, B: world {ib['world_size']} {ib['strategy']}: "
          f"{len(ta)} tensors ({n_optim} optimizer moments) compared, {len(bad)} differences")
    for b in bad[:20]:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
