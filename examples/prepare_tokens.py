"""Turn local text files into token files for training (accel::data::TokenWindows, src/data/).

  python examples/prepare_tokens.py --out DIR [--vocab_size 512 | --tokenizer tokenizer.json]
                                    [--val_fraction 0.1] [--format bin|npy] TEXT [TEXT ...]

Each text file is split into documents at blank lines; each document is tokenized and followed by
the end-of-text token (<|endoftext|>). Without --tokenizer, a byte-level BPE of --vocab_size is
trained on the texts themselves (the `tokenizers` package, nothing downloaded); with it, that
tokenizer.json is used as it is. Writes, into DIR:
  train.bin / val.bin    the tokens, uint16 (uint32 when the vocabulary needs it), flat, as nanoGPT
                         writes them (or train.npy / val.npy with --format npy); the last
                         --val_fraction of the documents (at least one) go to val
  tokenizer.json         the tokenizer (Transformers' PreTrainedTokenizerFast opens it)
  meta.json              vocab_size, dtype, eos_token_id, pad_token_id, the token and document counts
and prints one line per file.
"""
import argparse
import json
import os
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def documents(paths):
    docs = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        docs += [d.strip() for d in text.split("\n\n") if d.strip()]
    return docs


def train_tokenizer(docs, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return tok


def write(path, tokens, fmt):
    if fmt == "npy":
        np.save(path, tokens)
    else:
        tokens.tofile(path)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("texts", nargs="+", help="local text files")
    ap.add_argument("--out", required=True, help="directory for train/val token files, tokenizer.json, meta.json")
    ap.add_argument("--vocab_size", type=int, default=512, help="the BPE to train (without --tokenizer)")
    ap.add_argument("--tokenizer", help="a tokenizer.json to use instead of training one")
    ap.add_argument("--val_fraction", type=float, default=0.1, help="the last documents held out for evaluation")
    ap.add_argument("--format", choices=["bin", "npy"], default="bin")
    a = ap.parse_args(argv)
    for p in a.texts:
        if not os.path.isfile(p):
            ap.error(f"{p}: not a file")
    if not 0 < a.val_fraction < 1:
        ap.error("--val_fraction must be between 0 and 1")
    docs = documents(a.texts)
    if len(docs) < 2:
        ap.error(f"{len(docs)} document(s) in the texts: need two or more (documents are split at blank lines)")
    tok = Tokenizer.from_file(a.tokenizer) if a.tokenizer else train_tokenizer(docs, a.vocab_size)
    eos = tok.token_to_id(EOS)
    if eos is None:
        ap.error(f"the tokenizer has no {EOS} token")
    pad = tok.token_to_id(PAD)
    vocab = tok.get_vocab_size()
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    n_val = max(1, int(round(len(docs) * a.val_fraction)))
    os.makedirs(a.out, exist_ok=True)
    counts = {}
    for split, part in (("train", docs[:-n_val]), ("val", docs[-n_val:])):
        ids = []
        for enc in tok.encode_batch(part):
            ids += enc.ids + [eos]
        tokens = np.asarray(ids, dtype=dtype)
        path = os.path.join(a.out, f"{split}.{a.format}")
        write(path, tokens, a.format)
        counts[split] = {"documents": len(part), "tokens": int(tokens.size)}
        print(f"{path}: {len(part)} documents, {tokens.size} tokens ({np.dtype(dtype).name})")
    tok.save(os.path.join(a.out, "tokenizer.json"))
    meta = {"vocab_size": vocab, "dtype": np.dtype(dtype).name, "eos_token_id": eos, "pad_token_id": pad,
            "format": a.format, "splits": counts}
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"{a.out}/tokenizer.json: vocabulary of {vocab}; meta.json written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
