"""Writes the token files tests/data/test_token_windows.cpp reads, with NumPy (an independent writer):
token i of every file is (i * 7 + 3) % modulus.
  write_tokens.py DIR N
DIR/u16.npy, DIR/u32.npy (modulus 100003: values past 65535), DIR/i32.npy, DIR/i64.npy, DIR/u16.bin
(raw, as nanoGPT writes), DIR/u32.bin, DIR/two_d.npy (shape (2, N/2): refused), DIR/f32.npy (refused)."""
import os
import sys

import numpy as np


def tokens(n, modulus, dtype):
    return ((np.arange(n, dtype=np.int64) * 7 + 3) % modulus).astype(dtype)


def main(d, n):
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "u16.npy"), tokens(n, 50000, np.uint16))
    np.save(os.path.join(d, "u32.npy"), tokens(n, 100003, np.uint32))
    np.save(os.path.join(d, "i32.npy"), tokens(n, 100003, np.int32))
    np.save(os.path.join(d, "i64.npy"), tokens(n, 100003, np.int64))
    tokens(n, 50000, np.uint16).tofile(os.path.join(d, "u16.bin"))
    tokens(n, 100003, np.uint32).tofile(os.path.join(d, "u32.bin"))
    np.save(os.path.join(d, "two_d.npy"), tokens(n, 50000, np.uint16).reshape(2, -1))
    np.save(os.path.join(d, "f32.npy"), tokens(n, 50000, np.float32))
    print(f"wrote {d}: {n} tokens per file")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
