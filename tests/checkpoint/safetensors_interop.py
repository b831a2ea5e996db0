"""The Python side of the safetensors tests: the real `safetensors` package against accel's files.

  safetensors_interop.py write PATH        write the recipe tensors with safetensors.torch.save_file
  safetensors_interop.py check PATH        load a file accel wrote; compare with the recipe
  safetensors_interop.py compare A B       A: a file or a save_model directory (model.safetensors, or an
                                           index + shards); B: a reference file. Every tensor of B must be
                                           in A with the same dtype, shape and values, and nothing else;
                                           an index must list exactly the shards' tensors and total_size.
  safetensors_interop.py perturb SRC DST   DST := SRC's tensors, floating ones mapped x -> 0.5 x + 0.125,
                                           written by Python (what load_model tests load)

The recipe is closed-form (arange-based) and mirrored in test_safetensors.cpp: both sides build the
same tensors with the same torch kernels. Prints "OK ..." and exits 0, or prints what differs and
exits 1.
"""
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

# name, dtype, shape: keep in sync with kRecipe in test_safetensors.cpp.
RECIPE = [
    ("f64", torch.float64, [5]),
    ("f32.matrix", torch.float32, [3, 4]),
    ("f16", torch.float16, [2, 3, 2]),
    ("bf16", torch.bfloat16, [7]),
    ("i64", torch.int64, [4]),
    ("i32", torch.int32, [2, 2]),
    ("i16", torch.int16, [3]),
    ("i8", torch.int8, [5]),
    ("u8", torch.uint8, [6]),
    ("bool", torch.bool, [5]),
    ("f8_e4m3", torch.float8_e4m3fn, [4]),
    ("f8_e5m2", torch.float8_e5m2, [4]),
    ("u16", torch.uint16, [3]),
    ("u32", torch.uint32, [3]),
    ("u64", torch.uint64, [3]),
    ("scalar", torch.float32, []),
    ("scalar_i64", torch.int64, []),
    ("empty", torch.float32, [0]),
    ("empty2d", torch.int64, [2, 0]),
    ("layers.0.weight", torch.float32, [8, 3]),
]
METADATA = {"format": "pt", "written_by": "python"}


def make(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        t = torch.arange(n, dtype=torch.int64) % 3 == 0
    elif dtype in (torch.int64, torch.uint64):
        t = (torch.arange(n, dtype=torch.int64) * (1 << 40) + 7).to(dtype)
    elif dtype in (torch.int32, torch.uint32):
        t = (torch.arange(n, dtype=torch.int64) * 100003 + 5).to(dtype)
    elif dtype in (torch.int16, torch.int8, torch.uint8, torch.uint16):
        t = (torch.arange(n, dtype=torch.int64) * 7 - 3).remainder(100).to(dtype)
    else:
        t = (torch.arange(n, dtype=torch.float64) * 0.37 - 2.5).to(dtype)
    return t.reshape(shape)


def same(a, b):
    if a.dtype != b.dtype or list(a.shape) != list(b.shape):
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) if a.dim() > 0 else \
        torch.equal(a.reshape(1).view(torch.uint8), b.reshape(1).view(torch.uint8))


def load_any(path):
    """(tensors, files, index) of a file or a save_model directory."""
    if os.path.isfile(path):
        return load_file(path), [path], None
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(single):
        return load_file(single), [single], None
    with open(index) as f:
        idx = json.load(f)
    out, files = {}, []
    for shard in sorted(set(idx["weight_map"].values())):
        p = os.path.join(path, shard)
        files.append(p)
        part = load_file(p)
        for k, v in part.items():
            if idx["weight_map"].get(k) != shard:
                raise SystemExit(f"FAIL {k} is in {shard} but the index says {idx['weight_map'].get(k)}")
            out[k] = v
    total = sum(v.numel() * v.element_size() for v in out.values())
    if idx["metadata"]["total_size"] != total:
        raise SystemExit(f"FAIL index total_size {idx['metadata']['total_size']} != {total}")
    if set(idx["weight_map"]) != set(out):
        raise SystemExit("FAIL index weight_map names differ from the shards' tensors")
    return out, files, idx


def main():
    mode = sys.argv[1]
    if mode == "write":
        save_file({n: make(d, s) for n, d, s in RECIPE}, sys.argv[2], metadata=METADATA)
        print(f"OK wrote {len(RECIPE)} tensors")
        return 0
    if mode == "check":
        got = load_file(sys.argv[2])
        bad = []
        for n, d, s in RECIPE:
            if n not in got:
                bad.append(f"{n}: missing")
            elif not same(got[n], make(d, s)):
                bad.append(f"{n}: got {got[n].dtype}{list(got[n].shape)} {got[n].flatten()[:6].tolist()}, "
                           f"want {d}{s} {make(d, s).flatten()[:6].tolist()}")
        extra = set(got) - {n for n, _, _ in RECIPE}
        if extra:
            bad.append(f"unexpected tensors {sorted(extra)}")
        with safe_open(sys.argv[2], framework="pt") as f:
            md = f.metadata()
        if md != {"format": "pt", "written_by": "accel"}:
            bad.append(f"metadata {md}")
        if bad:
            print("FAIL\n" + "\n".join(bad))
            return 1
        print(f"OK {len(got)} tensors equal the recipe")
        return 0
    if mode == "compare":
        got, files, idx = load_any(sys.argv[2])
        ref = load_file(sys.argv[3])
        bad = []
        for k, v in ref.items():
            if k not in got:
                bad.append(f"{k}: missing")
            elif not same(got[k], v):
                diff = (got[k].double() - v.double()).abs().max().item() if got[k].shape == v.shape else "shape"
                bad.append(f"{k}: differs ({got[k].dtype}{list(got[k].shape)} vs {v.dtype}{list(v.shape)}, max diff {diff})")
        extra = set(got) - set(ref)
        if extra:
            bad.append(f"unexpected tensors {sorted(extra)}")
        if bad:
            print("FAIL\n" + "\n".join(bad))
            return 1
        print(f"OK {len(got)} tensors in {len(files)} file(s) equal the reference" + (" (index checked)" if idx else ""))
        return 0
    if mode == "perturb":
        src = load_file(sys.argv[2])
        out = {k: (v.double() * 0.5 + 0.125).to(v.dtype) if v.is_floating_point() else v.clone() for k, v in src.items()}
        save_file(out, sys.argv[3], metadata={"format": "pt"})
        print(f"OK wrote {len(out)} tensors")
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
