#!/usr/bin/env python3
"""Trains a small Llama on the public-domain corpora of shared/testdata, for
measuring what the fp8 KV cache costs on a model whose attention was learned
(the random-weight presets attend almost uniformly, so their logit errors say
little about a real model's). Runs on the GPU machine (torch, transformers,
tokenizers); nothing here is used at run time.

Writes OUT/model (an unmodified Hugging Face folder: config.json,
model.safetensors in bf16, the tokenizer files) and OUT/windows.json: held-out
windows of token ids with transformers' own teacher-forced results on them
(the reference for bench/gpu/kv_quality.cpp), and OUT/held_out.txt, the
held-out text itself (for kv_quality --text, whose windows it cuts with the
folder's tokenizer):
  {"model": {...}, "train": {...}, "windows": [[ids]],
   "hf_nll": [[nll of ids[k] given ids[:k], k >= 1, index k - 1]],
   "hf_argmax": [[argmax after ids[:k], index k - 1]]}

  train_small_llama.py --corpora DIR --tokenizer DIR --out DIR [--seconds 150]
"""
import argparse
import json
import math
import os
import shutil
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM


def encode_file(tok, path, held_out_share):
    text = open(path, encoding="utf-8", errors="replace").read()
    cut = int(len(text) * (1 - held_out_share))
    cut = text.rfind("\n", 0, cut) + 1 or cut  # split at a line
    def enc(t):
        lines = t.splitlines(keepends=True)
        chunks = ["".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
        ids = []
        for e in tok.encode_batch(chunks, add_special_tokens=False):
            ids.extend(e.ids)
        return ids
    return enc(text[:cut]), enc(text[cut:]), text[cut:]


def make_config(vocab, args):
    kw = dict(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
              num_hidden_layers=args.layers, num_attention_heads=args.heads,
              num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
              max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=1, eos_token_id=2, attention_bias=False, mlp_bias=False)
    try:  # transformers 5 names the RoPE settings rope_parameters
        return LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    except TypeError:
        return LlamaConfig(**kw, rope_theta=10000.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpora", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dev = "cuda"

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    train, held, held_text = [], [], []
    for name in sorted(os.listdir(args.corpora)):
        if name.endswith(".txt"):
            a, b, t = encode_file(tok, os.path.join(args.corpora, name), 0.02)
            train.extend(a)
            held.extend(b)
            held_text.append(t)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "held_out.txt"), "w", encoding="utf-8") as f:
        f.write("".join(held_text))
    train_ids = torch.tensor(train, dtype=torch.long, device=dev)
    print(f"tokens: {len(train)} train, {len(held)} held out", flush=True)

    cfg = make_config(tok.get_vocab_size(), args)
    model = LlamaForCausalLM(cfg).to(dev)  # fp32 master weights, bf16 autocast
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.1f}M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    t0 = time.time()
    step, seen, loss_ema = 0, 0, None
    while True:
        frac = (time.time() - t0) / args.seconds
        if frac >= 1:
            break
        lr = 1e-3 * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,), device=dev)
        x = torch.stack([train_ids[s:s + args.seq + 1] for s in starts.tolist()])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += x[:, 1:].numel()
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        if step % 200 == 0:
            print(f"step {step} {time.time() - t0:.0f} s loss {loss_ema:.3f}", flush=True)
    train_s = time.time() - t0

    model = model.to(torch.bfloat16).eval()
    mdir = os.path.join(args.out, "model")
    os.makedirs(mdir, exist_ok=True)
    model.save_pretrained(mdir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(args.tokenizer, f)
        if os.path.exists(src):
            shutil.copy(src, mdir)

    # Held-out windows, teacher-forced through the saved bf16 weights.
    windows, nll, amax = [], [], []
    with torch.no_grad():
        for w in range(args.windows):
            ids = held[w * args.seq:(w + 1) * args.seq]
            if len(ids) < args.seq:
                break
            x = torch.tensor([ids], device=dev)
            lp = F.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)
            nll.append((-lp[:-1].gather(1, x[0, 1:, None])[:, 0]).tolist())
            amax.append(lp[:-1].argmax(-1).tolist())
            windows.append(ids)
    mean = sum(map(sum, nll)) / sum(map(len, nll))
    print(f"held-out: {len(windows)} windows of {args.seq}, transformers bf16 perplexity "
          f"{math.exp(mean):.2f}", flush=True)
    json.dump({"model": {"parameters": n_params, "hidden": args.hidden, "layers": args.layers,
                         "heads": args.heads, "kv_heads": args.kv_heads,
                         "vocab": tok.get_vocab_size()},
               "train": {"steps": step, "tokens": seen, "seconds": round(train_s, 1),
                         "final_loss": loss_ema, "train_tokens": len(train),
                         "held_out_tokens": len(held)},
               "hf_perplexity": math.exp(mean), "windows": windows, "hf_nll": nll,
               "hf_argmax": amax}, open(os.path.join(args.out, "windows.json"), "w"))


if __name__ == "__main__":
    main()
