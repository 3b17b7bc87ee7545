#!/usr/bin/env python3
"""Reference logits of Hugging Face transformers for Metronome's golden tests.

Runs on a machine with torch and transformers (the GPU machine; the math runs
on its CPU in float32 so no TF32 or reduced-precision kernel is involved).
For each model folder: three prompts of different lengths, each prefilled and
then decoded greedily for 16 steps with the KV cache, one prompt at a time.
Writes, per prompt and step, the top-16 logits, the logits at 64 fixed probe
ids spread over the vocabulary, the largest absolute logit and the greedy id,
plus the SHA-256 of the weights file (the C++ side checks that make-model
wrote the same bytes here and there).

    python3 tools/golden/hf_reference.py --model DIR --name tiny-llama3 \
        --seed 7 --out tools/golden/tiny-llama3.json
"""
import argparse
import hashlib
import json
import os

import torch
import transformers
from transformers import AutoModelForCausalLM

STEPS = 16
TOP = 16
PROBES = 64
PROMPT_LENGTHS = (5, 13, 29)


def prompts_for(vocab_size, bos):
    """Deterministic prompts: a fixed LCG over the vocabulary, BOS first."""
    state = 12345
    out = []
    for n in PROMPT_LENGTHS:
        ids = [] if bos is None else [bos]
        while len(ids) < n:
            state = (state * 1103515245 + 12345) % (1 << 31)
            ids.append(state % min(vocab_size, 32000))
        out.append(ids)
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record(logits, probe_ids):
    top = torch.topk(logits, TOP)
    return {
        "top_ids": top.indices.tolist(),
        "top_logits": [float(x) for x in top.values.tolist()],
        "probe_logits": [float(logits[i]) for i in probe_ids],
        "max_abs": float(logits.abs().max()),
        "argmax": int(torch.argmax(logits)),
    }


def load_float32(path):
    """The model in float32 with eager attention, for inference (also used
    by hf_logprobs.py)."""
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    kwargs = {"attn_implementation": "eager"}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    except TypeError:  # transformers before `dtype`
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, **kwargs)
    model.eval()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    model = load_float32(args.model)
    cfg = model.config
    vocab = cfg.vocab_size
    probe_ids = [(i * vocab) // PROBES + 7 for i in range(PROBES)]
    prompts = prompts_for(vocab, getattr(cfg, "bos_token_id", None))

    runs = []
    for ids in prompts:
        steps = []
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        steps.append(record(logits, probe_ids))
        pos = len(ids)
        for _ in range(STEPS):
            nxt = int(torch.argmax(logits))
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True,
                        position_ids=torch.tensor([[pos]]),
                        cache_position=torch.tensor([pos]))
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            steps.append(record(logits, probe_ids))
            pos += 1
        runs.append({"prompt": ids, "steps": steps,
                     "greedy_ids": [s["argmax"] for s in steps]})

    weights = os.path.join(args.model, "model.safetensors")
    doc = {
        "name": args.name,
        "seed": args.seed,
        "reference": "transformers %s, torch %s, float32 on CPU, eager attention"
                     % (transformers.__version__, torch.__version__),
        "weights_sha256": sha256(weights),
        "probe_ids": probe_ids,
        "steps_per_prompt": STEPS + 1,
        "runs": runs,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print("%s: wrote %s (greedy %s)" % (args.name, args.out, [r["greedy_ids"][:4] for r in runs]))


if __name__ == "__main__":
    main()
