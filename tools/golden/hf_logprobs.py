#!/usr/bin/env python3
"""Reference log-probabilities of Hugging Face transformers for the logprobs
that Metronome reports (sampling_params::logprobs).

Runs where torch and transformers are (the GPU machine; float32 on its CPU).
For each model folder: the three prompts of hf_reference.py, each generated
greedily for STEPS tokens by transformers' own `generate`, which returns the
raw logits of every step; the log-softmax of those is what OpenAI's and
vLLM's logprobs report. Writes per prompt and step the chosen token and its
log-probability and the TOP most likely tokens with theirs.

    python3 tools/golden/hf_logprobs.py --model DIR --name tiny-llama3 \
        --out tools/golden/tiny-llama3-logprobs.json
"""
import argparse
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import load_float32, prompts_for  # noqa: E402  (the same prompts and loading)

STEPS = 8
TOP = 5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    model = load_float32(args.model)
    cfg = model.config
    runs = []
    for ids in prompts_for(cfg.vocab_size, getattr(cfg, "bos_token_id", None)):
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=STEPS, min_new_tokens=STEPS,
                             output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None)
        generated = out.sequences[0, len(ids):].tolist()
        steps = []
        for token, logits in zip(generated, out.logits):
            lp = torch.log_softmax(logits[0].float(), dim=-1)
            top = torch.topk(lp, TOP)
            steps.append({"token": int(token), "logprob": float(lp[token]),
                          "top_ids": top.indices.tolist(),
                          "top_logprobs": [float(x) for x in top.values.tolist()]})
        runs.append({"prompt": ids, "steps": steps})
    doc = {
        "name": args.name,
        "reference": "transformers %s generate(output_logits=True), torch %s, float32 on CPU, "
                     "log_softmax of the raw logits" % (transformers.__version__, torch.__version__),
        "steps": STEPS,
        "top": TOP,
        "runs": runs,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print("%s: wrote %s" % (args.name, args.out))


if __name__ == "__main__":
    main()
