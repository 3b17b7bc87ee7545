#!/usr/bin/env python3
"""Reference figures of Hugging Face transformers for metronome-tiny, the
default model (models/metronome-tiny, trained by tools/train_default_model.py):
writes tools/golden/default-model.json, which tests/model/default_model_test.cpp
and docs/default-model.md read.

    default_model_reference.py --model DIR --held-out held_out.json \
        [--report training_report.json] --out default-model.json

The folder is loaded as any Hugging Face checkpoint (AutoTokenizer,
AutoModelForCausalLM, float32, eager attention, on the CPU so no TF32 or
reduced-precision kernel is involved). Every token stream is made here with
transformers' tokenizer from the test paragraphs that the training script held
out (each paragraph's tokens, then EOS; the corpora one after another):

- held_out: the test perplexity over windows of max_position_embeddings
  tokens (BOS, then the next tokens of a corpus's stream; every token scored),
  per corpus and in all;
- windows: the first windows of 256 tokens of each corpus, with transformers'
  log-probability of each token after BOS (the golden test's reference);
- tokenizer: texts with their ids (BOS added) and decoded text;
- chat: conversations rendered by the folder's chat template
  (apply_chat_template's text, encoded without adding special tokens, as
  apply_chat_template(tokenize=True) does);
- greedy: continuations of fixed prompts (EOS ignored), with the margin
  between the first and second logit at each step;
- samples / chat_samples: seeded continuations (temperature 0.8, top-p 0.95,
  up to EOS) for docs/default-model.md.

--smoke-without-transformers scores with the training script's own model and
byte tokenizer instead (for testing this script where transformers is
missing); its output is no reference.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time

GOLDEN_WINDOW = 256
GOLDEN_WINDOWS_PER_CORPUS = 2
GREEDY_TOKENS = 48
SAMPLE_TOKENS = 96
PROMPTS = [
    "The ship",
    "In the beginning",
    "Fellow-Citizens of the Senate and House of Representatives:",
    "ROMEO:\n",
    "The price of bread",
]
CHATS = [
    [{"role": "user", "content": "Hello! Who are you?"}],
    [{"role": "user", "content": "Tell me about the sea."}],
    [{"role": "system", "content": "Speak plainly."},
     {"role": "user", "content": "What is the duty of a citizen?"},
     {"role": "assistant", "content": "To serve the country."},
     {"role": "user", "content": "And of the Congress?"}],
]
TOKENIZER_TEXTS = [
    "Hello, world!",
    "Call me Ishmael. Some years ago—never mind how long precisely—having little money…",
    "In 1790 a loan of 3,000,000 florins was completed in Holland.",
    "  Leading spaces,\ttabs\nand newlines\n\n",
    "naïve café “quoted” ’tis don't WE'LL",
    "<s> is text here, and so is </s>",
]


def log(msg):
    print(msg, flush=True)


def die(msg):
    print(f"default_model_reference: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Transformers:
    """The folder as transformers loads it."""

    def __init__(self, folder):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.torch = torch
        self.name = f"transformers {transformers.__version__}, torch {torch.__version__}"
        torch.set_grad_enabled(False)
        self.tok = AutoTokenizer.from_pretrained(folder)
        kwargs = {"attn_implementation": "eager"}
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
        except TypeError:  # transformers before `dtype`
            model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32,
                                                         **kwargs)
        self.model = model.eval()
        cfg = model.config
        if type(model).__name__ != "LlamaForCausalLM":
            die(f"transformers loaded a {type(model).__name__}, not a LlamaForCausalLM")
        if not cfg.tie_word_embeddings:
            die("transformers reads tie_word_embeddings as false")
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            die("transformers did not tie lm_head to the embedding")
        theta = getattr(cfg, "rope_theta", None)
        rope = getattr(cfg, "rope_parameters", None)
        if theta is None and isinstance(rope, dict):  # transformers 5
            theta = rope.get("rope_theta")
        if theta is not None and float(theta) != 10000.0:
            die(f"transformers reads rope theta {theta}, not 10000")
        self.bos, self.eos = self.tok.bos_token_id, self.tok.eos_token_id
        if (self.bos, self.eos) != (0, 1):
            die(f"bos/eos ids {self.bos}/{self.eos}, expected 0/1")
        self.parameters = sum(p.numel() for p in model.parameters())  # the tied matrix once
        self.max_positions = cfg.max_position_embeddings

    def encode(self, text, special):
        return list(self.tok(text, add_special_tokens=special).input_ids)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat(self, messages):
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, self.encode(text, False)

    def logits(self, batch):
        """float32 logits [b, t, vocab] of equal-length id lists."""
        x = self.torch.tensor(batch, dtype=self.torch.long)
        return self.model(input_ids=x).logits.float()


class Ours:
    """The training script's model and byte tokenizer (smoke test only)."""

    def __init__(self, folder):
        import struct
        import torch
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        import train_default_model as tdm
        self.torch = torch
        self.name = f"train_default_model.py's torch model (SMOKE TEST), torch {torch.__version__}"
        torch.set_grad_enabled(False)
        cfg = json.load(open(os.path.join(folder, "config.json")))
        c = {"vocab": cfg["vocab_size"], "hidden": cfg["hidden_size"],
             "intermediate": cfg["intermediate_size"], "layers": cfg["num_hidden_layers"],
             "heads": cfg["num_attention_heads"], "kv_heads": cfg["num_key_value_heads"],
             "head_dim": cfg["head_dim"], "max_positions": cfg["max_position_embeddings"],
             "eps": cfg["rms_norm_eps"], "rope_theta": cfg["rope_theta"], "dropout": 0.0}
        self.model = tdm.build_model_classes(torch)(c).eval()
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        state = {}
        for name, h in header.items():
            if name == "__metadata__":
                continue
            b, e = h["data_offsets"]
            t = torch.frombuffer(bytearray(data[b:e]), dtype=torch.int16).view(torch.bfloat16)
            state[name] = t.reshape(h["shape"]).float()
        self.model.load_state_dict(state)
        self.bos, self.eos = 0, 1
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.max_positions = c["max_positions"]

    def encode(self, text, special):
        return ([0] if special else []) + [2 + b for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(i - 2 for i in ids if i >= 2).decode("utf-8", errors="replace")

    def chat(self, messages):
        text = "<s>" + "".join(m["content"] + "</s>" for m in messages)
        ids = [0]
        for m in messages:
            ids += self.encode(m["content"], False) + [1]
        return text, ids

    def logits(self, batch):
        return self.model(self.torch.tensor(batch, dtype=self.torch.long)).float()


def scored(ref, windows, batch=8):
    """Per window: the log-probability of each token after the first."""
    torch = ref.torch
    out = []
    for i in range(0, len(windows), batch):
        group = windows[i:i + batch]
        n = max(map(len, group))
        lg = ref.logits([w + [0] * (n - len(w)) for w in group])
        lp = torch.log_softmax(lg.double(), dim=-1)
        for j, w in enumerate(group):
            ids = torch.tensor(w[1:], dtype=torch.long)
            out.append(lp[j, :len(w) - 1].gather(-1, ids[:, None])[:, 0].tolist())
    return out


def windows_of(bos, ids, length, count=None):
    out = []
    for s in range(0, len(ids), length - 1):
        chunk = ids[s:s + length - 1]
        if chunk:
            out.append([bos] + chunk)
        if count and len(out) == count:
            break
    return out


def continue_text(ref, prompt_ids, n, temperature=0.0, top_p=1.0, seed=0, stop_at_eos=False):
    torch = ref.torch
    gen = torch.Generator().manual_seed(seed)
    out, margins = [], []
    for _ in range(n):
        ids = (prompt_ids + out)[-ref.max_positions:]
        lg = ref.logits([ids])[0, -1].double()
        if temperature == 0:
            top = torch.topk(lg, 2)
            token = int(top.indices[0])
            margins.append(round(float(top.values[0] - top.values[1]), 6))
        else:
            probs = torch.softmax(lg / temperature, dim=-1)
            p, order = torch.sort(probs, descending=True)
            keep = (torch.cumsum(p, 0) - p) < top_p
            p = p * keep
            token = int(order[torch.multinomial(p / p.sum(), 1, generator=gen)])
        if stop_at_eos and token == ref.eos:
            break
        out.append(token)
    return out, margins


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the exported folder")
    ap.add_argument("--held-out", required=True, help="held_out.json of the training script")
    ap.add_argument("--report", help="training_report.json of the training script")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--smoke-without-transformers", action="store_true")
    args = ap.parse_args()
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(args.model, f)):
            die(f"{args.model}: no {f}")
    if not os.path.isfile(args.held_out):
        die(f"no {args.held_out}")
    t_start = time.time()
    import torch
    torch.set_num_threads(args.threads)
    ref = Ours(args.model) if args.smoke_without_transformers else Transformers(args.model)
    log(f"reference: {ref.name}, {ref.parameters:,} parameters, {args.threads} threads")
    held = json.load(open(args.held_out, encoding="utf-8"))["test"]
    report = json.load(open(args.report)) if args.report else None

    streams = {}
    for name, paras in held.items():
        ids = []
        for p in paras:
            ids += ref.encode(p, False) + [ref.eos]
        streams[name] = ids

    # Held-out perplexity over full-context windows.
    win = ref.max_positions
    total_nll, total_n, per_corpus = 0.0, 0, {}
    for name, ids in streams.items():
        lps = scored(ref, windows_of(ref.bos, ids, win))
        nll = -sum(sum(w) for w in lps)
        n = sum(len(w) for w in lps)
        per_corpus[name] = {"tokens": n, "perplexity": round(math.exp(nll / n), 4)}
        total_nll += nll
        total_n += n
        log(f"{name}: {n:,} test tokens, perplexity {math.exp(nll / n):.3f}")
    ppl = math.exp(total_nll / total_n)
    log(f"held-out perplexity {ppl:.4f} over {total_n:,} tokens ({time.time() - t_start:.0f} s)")

    # Golden windows.
    gw, glen = [], min(GOLDEN_WINDOW, win)
    for name, ids in streams.items():
        for w in windows_of(ref.bos, ids, glen, GOLDEN_WINDOWS_PER_CORPUS):
            if len(w) == glen:
                gw.append((name, w))
    glp = scored(ref, [w for _, w in gw])
    g_nll = -sum(sum(w) for w in glp)
    g_n = sum(len(w) for w in glp)
    log(f"golden windows: {len(gw)} of {glen}, perplexity {math.exp(g_nll / g_n):.4f}")

    tok_vectors = []
    for text in TOKENIZER_TEXTS + [held[n][0][:400] for n in held]:
        ids = ref.encode(text, True)
        tok_vectors.append({"text": text, "ids": ids, "decoded": ref.decode(ids)})
    chats = []
    for messages in CHATS:
        text, ids = ref.chat(messages)
        chats.append({"messages": messages, "text": text, "ids": ids})

    greedy, samples = [], []
    for prompt in PROMPTS:
        pids = ref.encode(prompt, True)
        ids, margins = continue_text(ref, pids, GREEDY_TOKENS)
        greedy.append({"prompt": prompt, "prompt_ids": pids, "ids": ids, "margins": margins,
                       "text": ref.decode(ids)})
        sids, _ = continue_text(ref, pids, SAMPLE_TOKENS, 0.8, 0.95, seed=1, stop_at_eos=True)
        samples.append({"prompt": prompt, "seed": 1, "temperature": 0.8, "top_p": 0.95,
                        "text": ref.decode(sids)})
        log(f"greedy   {prompt!r} -> {ref.decode(ids)!r}")
        log(f"sampled  {prompt!r} -> {ref.decode(sids)!r}")
    chat_samples = []
    for c in chats:
        ids, _ = continue_text(ref, c["ids"], SAMPLE_TOKENS, 0.8, 0.95, seed=1, stop_at_eos=True)
        gids, _ = continue_text(ref, c["ids"], SAMPLE_TOKENS, stop_at_eos=True)
        chat_samples.append({"messages": c["messages"], "sampled": ref.decode(ids),
                             "greedy": ref.decode(gids)})
        log(f"chat {c['messages'][-1]['content']!r} -> {ref.decode(ids)!r}")

    golden = {
        "model": "metronome-tiny",
        "made_by": "tools/golden/default_model_reference.py",
        "reference": ref.name + ", float32, eager attention, CPU",
        "weights_sha256": sha256(os.path.join(args.model, "model.safetensors")),
        "tokenizer_sha256": sha256(os.path.join(args.model, "tokenizer.json")),
        "parameters": ref.parameters,
        "held_out": {"window": win, "tokens": total_n, "perplexity": round(ppl, 4),
                     "per_corpus": per_corpus},
        "windows": {"length": glen, "corpora": [n for n, _ in gw],
                    "ids": [w for _, w in gw],
                    "logprobs": [[round(x, 6) for x in w] for w in glp],
                    "perplexity": round(math.exp(g_nll / g_n), 6)},
        "tokenizer": tok_vectors,
        "chat": chats,
        "greedy": greedy,
        "samples": samples,
        "chat_samples": chat_samples,
    }
    if report:
        golden["training"] = {k: report["training"][k] for k in
                              ("steps", "tokens", "passes", "seconds", "tokens_per_s", "seed",
                               "determinism", "best_step", "retrain")}
        if "made_with" in report["training"]:
            golden["training"]["made_with"] = report["training"]["made_with"]
        golden["training"]["device"] = report["versions"]["device"]
        golden["training"]["versions"] = report["versions"]
        golden["training"]["train_tokens"] = report["data"]["train_tokens"]
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
    log(f"wrote {args.out} in {time.time() - t_start:.0f} s")
    if report:
        ours = report["test"]["perplexity_bf16_autocast"]
        rel = abs(ours - ppl) / ppl
        log(f"test perplexity: training script {ours:.4f}, transformers {ppl:.4f} "
            f"({100 * rel:.2f}% apart)")
        if rel > 0.05:
            die("the training script's perplexity and transformers' differ by more than 5%: "
                "the export does not load as the model that was trained")


if __name__ == "__main__":
    main()
