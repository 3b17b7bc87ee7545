#!/usr/bin/env python3
"""Writes the default model's held-out paragraphs without training.

    default_model_held_out.py --corpora ../shared/testdata/corpora --out held_out.json

The file tools/train_default_model.py writes as OUT/held_out.json: per corpus,
the validation paragraphs and the test paragraphs (the last paragraphs of each
corpus holding 2% of its characters; never trained on, never seen by the
tokenizer trainer). It calls the training script's own load_corpora, so the
split is the one the shipped model was trained around (docs/default-model.md,
"How it was made"). `metronome eval-quality --held-out` reads its "test"
object. Standard library only: no torch needed.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_default_model as t  # noqa: E402 (stdlib imports only at its top)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", required=True, help="folder with the four corpora")
    ap.add_argument("--out", required=True, help="the held_out.json to write")
    args = ap.parse_args()
    for name in t.CORPORA:
        if not os.path.isfile(os.path.join(args.corpora, name)):
            t.die(f"--corpora {args.corpora}: {name} is missing")
    data = t.load_corpora(args.corpora)
    for name, (tr, va, te) in data.items():
        print(f"{name}: {len(tr)} train / {len(va)} validation / {len(te)} test paragraphs "
              f"({sum(map(len, te)):,} test chars)")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"validation": {n: d[1] for n, d in data.items()},
                   "test": {n: d[2] for n, d in data.items()}}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
