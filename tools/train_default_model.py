#!/usr/bin/env python3
"""Trains metronome-tiny, the model `metronome serve` and `metronome generate`
use when given no --model (models/metronome-tiny, docs/default-model.md).

    train_default_model.py --corpora DIR --out DIR [--steps N | --train-seconds S]

A Llama (LlamaForCausalLM layout: RMSNorm, rotary positions, grouped-query
attention, SwiGLU, tied embeddings) written here in plain torch, so that it
also runs on an old CPU-only torch (Debian's 1.13) for the smoke test, trained
with its own byte-level BPE tokenizer on the four public-domain corpora of
shared/testdata/corpora. Writes:

  OUT/metronome-tiny/   the Hugging Face folder: config.json,
                        generation_config.json, tokenizer.json,
                        tokenizer_config.json, model.safetensors (bf16, HF
                        names), metronome.json (the id and one-line
                        description Metronome shows)
  OUT/held_out.json     the validation and test paragraphs of each corpus
                        (tools/golden/default_model_reference.py scores the
                        test ones with transformers)
  OUT/training_report.json  shape, parameters, steps, tokens, time, tokens/s,
                        the loss curve, versions

Data. Each corpus is cut into paragraphs, and each paragraph becomes its
tokens followed by EOS, so the model learns to end a paragraph; a chat turn
is one paragraph (the chat template renders BOS, then each message's content
followed by EOS). Paragraphs: kjv_bible.txt, one verse each (verse numbers
and the chapter headings dropped, wrapped lines joined); moby_dick.txt, the
blocks between blank lines with wrapped lines joined; tinyshakespeare.txt,
the blocks between blank lines as they are (a speaker's name, then verse
lines); sotu_all.txt (one address a line, no paragraphs), runs of whole
sentences of at least 400 characters.

Held out: the last paragraphs of each corpus that make up 2% of its
characters are the test set, never trained on (and never seen by the
tokenizer trainer); the 1% before them is the validation set, also never
trained on, scored during training to report progress and to keep the weights
of the best validation loss. Everything else is the training set. Training
windows are BOS followed by 1,023 tokens from a random place of the training
stream (the corpora concatenated in file order).

Determinism: fixed seeds, torch.use_deterministic_algorithms(True),
CUBLAS_WORKSPACE_CONFIG=:4096:8, no fused attention kernels (attention is
written out with matmul and softmax), offsets drawn from a seeded CPU
generator. The same arguments on the same hardware and software give the same
weights. Without --steps, the number of steps is fixed from the speed measured
over the first steps (--train-seconds); the report and the log print it, and
--steps N repeats that run exactly. The BPE trainer of `tokenizers` gives the
same merges for the same input and version (its sha256 is in the report).

Smoke test on a CPU (no `tokenizers`, no CUDA):
    python3 tools/train_default_model.py --corpora C --out /tmp/smoke --smoke
(a merge-less byte tokenizer, a tiny shape, a few steps, the first 200 kB of
each corpus).
"""
import os

# Before torch initialises CUDA: cuBLAS's deterministic workspace.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import hashlib
import json
import math
import re
import struct
import sys
import time

CORPORA = ("kjv_bible.txt", "moby_dick.txt", "sotu_all.txt", "tinyshakespeare.txt")
TEST_SHARE = 0.02
VALIDATION_SHARE = 0.01
SOTU_PARAGRAPH_CHARS = 400
BOS, EOS = "<s>", "</s>"
MODEL_ID = "metronome-tiny"
# The pre-tokenizer regex of Llama 3 (tokenizer.json of Meta-Llama-3).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Rendered by transformers' apply_chat_template and recognised by Metronome
# (model/tokenizer/chat_template_recognition.cpp, format "plain").
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] + eos_token }}{% endfor %}"
MAX_FOLDER_BYTES = 16 * 1024 * 1024


def log(msg):
    print(msg, flush=True)


def die(msg):
    print(f"train_default_model: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


# -- paragraphs ---------------------------------------------------------------------

def blocks(text):
    """The blocks of text between blank lines."""
    return [b.strip("\n") for b in re.split(r"\n[ \t]*\n", text) if b.strip()]


def unwrap(block):
    return " ".join(line.strip() for line in block.split("\n") if line.strip())


def paragraphs_kjv(text):
    out = []
    for block in blocks(text):
        lines = block.split("\n")
        if len(lines) == 1 and re.fullmatch(r"\s*(\d )?[A-Z][A-Za-z ]+ \d+\s*", lines[0]):
            continue  # a chapter heading: "Genesis 1"
        verse = None
        for line in lines:
            m = re.match(r"^\s+\d+ (.*)$", line)
            if m:
                if verse:
                    out.append(verse)
                verse = m.group(1).strip()
            elif line.strip():
                verse = (verse + " " if verse else "") + line.strip()
        if verse:
            out.append(verse)
    return out


def paragraphs_prose(text):
    return [unwrap(b) for b in blocks(text)]


def paragraphs_verse(text):
    return [b.rstrip() for b in blocks(text)]


def paragraphs_sotu(text):
    out = []
    for line in text.split("\n"):
        line = re.sub(r"\s+", " ", line).strip()
        if not line:
            continue
        para = ""
        for sentence in re.split(r"(?<=[.!?])\s+|(?<=[.!?][\"”’)])\s+", line):
            para = sentence if not para else para + " " + sentence
            if len(para) >= SOTU_PARAGRAPH_CHARS:
                out.append(para)
                para = ""
        if para:
            out.append(para)
    return out


PARAGRAPHS = {
    "kjv_bible.txt": paragraphs_kjv,
    "moby_dick.txt": paragraphs_prose,
    "sotu_all.txt": paragraphs_sotu,
    "tinyshakespeare.txt": paragraphs_verse,
}


def split_paragraphs(paras):
    """(train, validation, test): test is the tail holding TEST_SHARE of the
    characters, validation the VALIDATION_SHARE before it."""
    total = sum(len(p) for p in paras)

    def tail_start(end, share):
        i, acc = end, 0
        while i > 0 and acc < share * total:
            i -= 1
            acc += len(paras[i])
        return i

    t = tail_start(len(paras), TEST_SHARE)
    v = tail_start(t, VALIDATION_SHARE)
    return paras[:v], paras[v:t], paras[t:]


def load_corpora(folder, limit_chars=0):
    data = {}
    for name in CORPORA:
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
            text = f.read().replace("\r\n", "\n")
        if limit_chars:
            text = text[:limit_chars]
        paras = PARAGRAPHS[name](text)
        if len(paras) < 20:
            die(f"{path}: only {len(paras)} paragraphs")
        data[name] = split_paragraphs(paras)
    return data


# -- tokenizer ----------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte-to-character table of byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def special_token_entries():
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, t in enumerate((BOS, EOS))]


def byte_tokenizer_json():
    """A byte-level BPE tokenizer.json without merges (the smoke test's
    stand-in for a trained one): the same components as the real one."""
    table = bytes_to_unicode()
    vocab = {BOS: 0, EOS: 1}
    for b in range(256):
        vocab[table[b]] = 2 + b
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": special_token_entries(),
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


class ByteEncoder:
    """Encodes with byte_tokenizer_json() (no merges: one token a byte)."""

    def __init__(self):
        self.vocab_size = 258

    def encode_batch(self, texts):
        return [[2 + b for b in t.encode("utf-8")] for t in texts]


class HFEncoder:
    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]


def train_tokenizer(paragraphs, vocab_size, path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(paragraphs, trainer=trainer)
    if tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1:
        die("the trained tokenizer does not have <s> = 0 and </s> = 1")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1", special_tokens=[(BOS, 0)])
    tok.save(path)
    return HFEncoder(Tokenizer.from_file(path))


def tokenizer_config(max_len):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "model_input_names": ["input_ids", "attention_mask"],
        "added_tokens_decoder": {str(e["id"]): {k: v for k, v in e.items() if k != "id"}
                                 for e in special_token_entries()},
        "chat_template": CHAT_TEMPLATE,
    }


def stream(encoder, paragraphs, eos_id=1):
    ids = []
    for p in encoder.encode_batch(paragraphs):
        ids.extend(p)
        ids.append(eos_id)
    return ids


# -- the model ----------------------------------------------------------------------

def build_model_classes(torch):
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            dtype = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x.to(dtype)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = c["heads"], c["kv_heads"], c["head_dim"]
            h = c["hidden"]
            self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
            self.drop = nn.Dropout(c["dropout"])

        def forward(self, x, cos, sin, mask):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            group = self.heads // self.kv_heads
            if group > 1:  # query head i reads kv head i // group, as transformers' repeat_kv
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.float().masked_fill(mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1).to(v.dtype)
            y = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
            return self.drop(self.o_proj(y))

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.gate_proj = nn.Linear(c["hidden"], c["intermediate"], bias=False)
            self.up_proj = nn.Linear(c["hidden"], c["intermediate"], bias=False)
            self.down_proj = nn.Linear(c["intermediate"], c["hidden"], bias=False)
            self.drop = nn.Dropout(c["dropout"])

        def forward(self, x):
            return self.drop(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.input_layernorm = RMSNorm(c["hidden"], c["eps"])
            self.self_attn = Attention(c)
            self.post_attention_layernorm = RMSNorm(c["hidden"], c["eps"])
            self.mlp = MLP(c)

        def forward(self, x, cos, sin, mask):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Decoder(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
            self.layers = nn.ModuleList([Block(c) for _ in range(c["layers"])])
            self.norm = RMSNorm(c["hidden"], c["eps"])

    class TinyLlama(nn.Module):
        """Module names are transformers' LlamaForCausalLM's, so state_dict()
        has the checkpoint's tensor names; lm_head is the embedding (tied)."""

        def __init__(self, c):
            super().__init__()
            self.c = c
            self.model = Decoder(c)
            hd = c["head_dim"]
            inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64)
                                                  .float() / hd))
            freqs = torch.outer(torch.arange(c["max_positions"]).float(), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)
            self.apply(self._init)
            # Projections into the residual stream: GPT-2's 1/sqrt(2 layers).
            for layer in self.model.layers:
                for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * c["layers"]))

        @staticmethod
        def _init(m):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

        def forward(self, ids):
            t = ids.shape[1]
            x = self.model.embed_tokens(ids)
            cos, sin = self.cos[:t], self.sin[:t]
            mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1)
            for layer in self.model.layers:
                x = layer(x, cos, sin, mask)
            x = self.model.norm(x)
            return F.linear(x, self.model.embed_tokens.weight)

    return TinyLlama


def parameter_count(c):
    h, i, L, v = c["hidden"], c["intermediate"], c["layers"], c["vocab"]
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return v * h + L * per_layer + h


def hf_config(c):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": c["vocab"], "hidden_size": c["hidden"],
        "intermediate_size": c["intermediate"], "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
        "head_dim": c["head_dim"], "max_position_embeddings": c["max_positions"],
        "rms_norm_eps": c["eps"], "rope_theta": c["rope_theta"], "rope_scaling": None,
        # transformers 5's spelling of the same (4.x keeps it as an attribute).
        "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"]},
        "tie_word_embeddings": True, "hidden_act": "silu", "initializer_range": 0.02,
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "use_cache": True, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    }


def write_safetensors(torch, tensors, path):
    """bf16 safetensors (the format's spec: a little-endian u64 header length,
    the JSON header padded with spaces to 8 bytes, then the data)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.bfloat16).contiguous()
        data = t.view(torch.int16).numpy().astype("<i2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- main ---------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", required=True, help="folder with " + ", ".join(CORPORA))
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--steps", type=int, help="optimizer steps (exact reproduction)")
    ap.add_argument("--train-seconds", type=float,
                    help="without --steps: steps fixed from the speed of the first steps so "
                         "that training takes about this long (default 200; with --smoke, "
                         "none: 40 steps)")
    ap.add_argument("--max-passes", type=float, default=30.0,
                    help="without --steps: at most this many passes over the training split "
                         "(default 30: more overfits a model this size on this data)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096, help="tokenizer size, special tokens included")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--seq", type=int, default=1024,
                    help="training window (BOS included) = max_position_embeddings")
    ap.add_argument("--batch", type=int, default=32, help="windows a step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU smoke test: byte tokenizer, tiny shape, 40 steps, 200 kB a corpus")
    args = ap.parse_args()
    if args.smoke:
        args.device = "cpu"
        args.hidden, args.layers, args.heads, args.kv_heads = 64, 2, 2, 1
        args.intermediate, args.seq, args.batch = 192, 128, 8
        args.eval_every = 20
        args.warmup = 10 if args.train_seconds is None else 30
        if args.steps is None and args.train_seconds is None:
            args.steps = 40
    if args.train_seconds is None:
        args.train_seconds = 200.0
    return args


def main():
    args = parse_args()
    t_start = time.time()
    # -- loud, early checks: paths, imports, the device, the shape's size
    for name in CORPORA:
        if not os.path.isfile(os.path.join(args.corpora, name)):
            die(f"--corpora {args.corpora}: {name} is missing")
    try:
        import numpy  # noqa: F401 (tensor bytes for the safetensors file)
        import torch
    except ImportError as e:
        die(f"cannot import torch and numpy: {e}")
    if not args.smoke:
        try:
            import tokenizers  # noqa: F401
        except ImportError as e:
            die(f"cannot import tokenizers (needed unless --smoke): {e}")
    if args.device == "cuda" and not torch.cuda.is_available():
        die("--device cuda but torch sees no CUDA device")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        die("--hidden must be a multiple of --heads, --heads of --kv-heads")
    if args.steps is not None and args.steps < 1:
        die("--steps must be positive")
    c = {"vocab": 258 if args.smoke else args.vocab, "hidden": args.hidden,
         "intermediate": args.intermediate, "layers": args.layers, "heads": args.heads,
         "kv_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
         "max_positions": args.seq, "eps": 1e-5, "rope_theta": 10000.0,
         "dropout": args.dropout}
    if 2 * parameter_count(c) + 600_000 > MAX_FOLDER_BYTES:
        die(f"{parameter_count(c):,} parameters: the bf16 folder would exceed 16 MiB")
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, MODEL_ID)
    os.makedirs(model_dir, exist_ok=True)
    log(f"torch {torch.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name(0)})" if args.device == "cuda" else "")
        + f", {os.cpu_count()} CPUs")

    torch.manual_seed(args.seed)
    determinism = "strict"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    TinyLlama = build_model_classes(torch)

    # -- preflight: one step of a tiny model with every op of the real one, so
    # an op without a deterministic implementation fails now, not in 3 minutes
    pre = dict(c, vocab=64, hidden=32, intermediate=48, layers=1, heads=2, kv_heads=1,
               head_dim=16, max_positions=16)
    try:
        m = TinyLlama(pre).to(args.device)
        o = torch.optim.AdamW(m.parameters(), lr=1e-3,
                              **({"fused": True} if args.device == "cuda" else {}))
        x = torch.randint(0, 64, (2, 16), device=args.device)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.device == "cuda"):
            lg = m(x)
        torch.nn.functional.cross_entropy(lg.float().view(-1, 64), x.view(-1)).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        o.step()
        del m, o
    except RuntimeError as e:
        if "deterministic" not in str(e):
            raise
        log(f"WARNING: an op has no deterministic implementation here ({e}); training with "
            "torch.use_deterministic_algorithms(True, warn_only=True): the weights may differ "
            "from run to run")
        determinism = "warn_only"
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(args.seed)

    # -- data and tokenizer
    data = load_corpora(args.corpora, 200_000 if args.smoke else 0)
    for name, (tr, va, te) in data.items():
        log(f"{name}: {len(tr)} train / {len(va)} validation / {len(te)} test paragraphs "
            f"({sum(map(len, tr)):,} / {sum(map(len, va)):,} / {sum(map(len, te)):,} chars)")
    with open(os.path.join(args.out, "held_out.json"), "w", encoding="utf-8") as f:
        json.dump({"validation": {n: d[1] for n, d in data.items()},
                   "test": {n: d[2] for n, d in data.items()}}, f, ensure_ascii=False)
    tok_path = os.path.join(model_dir, "tokenizer.json")
    t0 = time.time()
    if args.smoke:
        with open(tok_path, "w", encoding="utf-8") as f:
            json.dump(byte_tokenizer_json(), f, ensure_ascii=False)
        encoder = ByteEncoder()
    else:
        encoder = train_tokenizer([p for d in data.values() for p in d[0]], args.vocab, tok_path)
    tokenizer_s = time.time() - t0
    c["vocab"] = encoder.vocab_size
    log(f"tokenizer: {encoder.vocab_size} tokens ({tokenizer_s:.1f} s)")
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(args.seq), f, indent=2, ensure_ascii=False)
    t0 = time.time()
    train_ids, val_ids, test_ids = [], [], []
    corpus_tokens = {}
    for name, (tr, va, te) in data.items():
        a, b, t = stream(encoder, tr), stream(encoder, va), stream(encoder, te)
        corpus_tokens[name] = {"train": len(a), "validation": len(b), "test": len(t)}
        train_ids += a
        val_ids += b
        test_ids.append(t)
    log(f"tokens: {len(train_ids):,} train, {len(val_ids):,} validation, "
        f"{sum(map(len, test_ids)):,} test ({time.time() - t0:.1f} s to encode)")

    # -- model and optimizer
    dev = args.device
    T, B = args.seq, args.batch
    train_t = torch.tensor(train_ids, dtype=torch.long, device=dev)
    model = TinyLlama(c).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != parameter_count(c):
        die(f"parameter count {n_params} != {parameter_count(c)} (shape arithmetic)")
    log(f"model: {n_params:,} parameters ({c['layers']} layers, hidden {c['hidden']}, "
        f"{c['heads']} heads / {c['kv_heads']} kv heads of {c['head_dim']}, MLP "
        f"{c['intermediate']}, vocab {c['vocab']}, tied embeddings)")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev == "cuda" else {}))
    autocast = dict(device_type=dev, dtype=torch.bfloat16, enabled=dev == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    positions = torch.arange(T, device=dev)
    bos_col = torch.zeros(B, 1, dtype=torch.long, device=dev)

    def windows(ids, length):
        """[BOS] + each run of length-1 tokens (the last, shorter one too)."""
        out = []
        for s in range(0, len(ids), length - 1):
            chunk = ids[s:s + length - 1]
            if len(chunk) >= 1:
                out.append([0] + chunk)
        return out

    def mean_nll(wins, batch=16):
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(wins), batch):
                group = wins[i:i + batch]
                n = max(map(len, group))
                x = torch.tensor([w + [0] * (n - len(w)) for w in group], device=dev)
                with torch.autocast(**autocast):
                    lg = model(x[:, :-1])
                lp = torch.log_softmax(lg.float(), dim=-1)
                nll = -lp.gather(-1, x[:, 1:, None])[..., 0]
                for j, w in enumerate(group):
                    total += float(nll[j, :len(w) - 1].double().sum())
                    count += len(w) - 1
        model.train()
        return total / count, count

    val_windows = windows(val_ids, T)[:48]

    def lr_at(step, total):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, total - args.warmup)
        return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    total_steps = args.steps
    calib_from, calib_to = 5, 25
    if total_steps is None and args.warmup <= calib_to:
        die("--warmup must exceed 25 steps when the step count comes from --train-seconds")
    log(f"training: batch {B} x {T} tokens, AdamW lr {args.lr} (warmup {args.warmup}, cosine to "
        f"{args.min_lr}), weight decay {args.weight_decay}, dropout {args.dropout}, "
        f"determinism {determinism}"
        + (f", {total_steps} steps" if total_steps else
           f", steps fixed after step {calib_to} for about {args.train_seconds:.0f} s"))
    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(**autocast):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, c["vocab"]),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    curve, best = [], {"val_loss": float("inf"), "step": 0, "state": None}
    sync()
    t_train = time.time()
    t_calib = None
    loss_sum, loss_n, t_mark, step = 0.0, 0, time.time(), 0
    while total_steps is None or step < total_steps:
        if step == calib_from:
            sync()
            t_calib = time.time()
        if total_steps is None and step == calib_to:
            sync()
            per_step = (time.time() - t_calib) / (calib_to - calib_from)
            left = args.train_seconds - (time.time() - t_train)
            by_time = int(left / (per_step * 1.03)) + calib_to
            by_passes = int(args.max_passes * len(train_ids) / (B * T))
            total_steps = max(calib_to + args.warmup, min(by_time, by_passes))
            total_steps -= total_steps % 50
            log(f"{per_step * 1e3:.1f} ms a step: training for {total_steps} steps "
                f"({total_steps * B * T / 1e6:.1f}M tokens, "
                f"{'--max-passes' if by_passes < by_time else '--train-seconds'} decides); "
                f"--steps {total_steps} repeats this run")
        lr = lr_at(step, total_steps or 10**9)
        for g in opt.param_groups:
            g["lr"] = lr
        offsets = torch.randint(0, len(train_ids) - T, (B,), generator=gen).to(dev)
        # Targets: T tokens of the stream; inputs: BOS and all but the last.
        y = train_t[offsets[:, None] + positions]
        x = torch.cat([bos_col, y[:, :-1]], dim=1)
        try:
            loss = train_step(x, y)
        except RuntimeError as e:
            # An op the tiny preflight model did not reach (a size-dependent
            # kernel) has no deterministic implementation: say so, go on.
            if "deterministic" not in str(e) or determinism != "strict":
                raise
            log(f"WARNING: at step {step}: {e}; continuing with warn_only=True: the weights "
                "may differ from run to run")
            determinism = "warn_only"
            torch.use_deterministic_algorithms(True, warn_only=True)
            loss = train_step(x, y)
        step += 1
        loss_sum = loss_sum + loss.detach()  # read at the next print: no sync a step
        loss_n += 1
        last = total_steps is not None and step == total_steps
        if step % 50 == 0 or last:
            sync()
            now = time.time()
            tps = loss_n * B * T / (now - t_mark)
            mean_loss = float(loss_sum) / loss_n
            log(f"step {step:5d}  loss {mean_loss:.4f}  lr {lr:.2e}  "
                f"{tps / 1e6:.2f}M tokens/s  {now - t_train:6.1f} s")
            curve.append({"step": step, "train_loss": round(mean_loss, 4)})
            loss_sum, loss_n, t_mark = 0.0, 0, time.time()
        if step % args.eval_every == 0 or last:
            v, _ = mean_nll(val_windows)
            improved = v < best["val_loss"]
            if improved:
                best = {"val_loss": v, "step": step,
                        "state": {k: t.detach().clone() for k, t in model.state_dict().items()}}
            log(f"step {step:5d}  validation loss {v:.4f} (perplexity {math.exp(v):.2f})"
                + ("  best" if improved else ""))
            curve.append({"step": step, "validation_loss": round(v, 4)})
            t_mark = time.time()
        if time.time() - t_train > 2.0 * args.train_seconds + 60 and not args.steps:
            log(f"WARNING: training has run {time.time() - t_train:.0f} s, twice its budget: "
                f"stopping at step {step} of {total_steps}")
            total_steps = step
            break
    sync()
    train_s = time.time() - t_train
    tokens_trained = step * B * T
    log(f"trained {step} steps, {tokens_trained / 1e6:.1f}M tokens "
        f"({tokens_trained / len(train_ids):.1f} passes) in {train_s:.1f} s "
        f"({tokens_trained / train_s / 1e6:.2f}M tokens/s); best validation loss "
        f"{best['val_loss']:.4f} at step {best['step']}")
    model.load_state_dict(best["state"])

    # -- test perplexity with this code (bf16 autocast on CUDA): the reference
    # script scores the exported weights with transformers in float32
    test_nll, test_n = 0.0, 0
    per_corpus = {}
    for name, ids in zip(data, test_ids):
        m, n = mean_nll(windows(ids, T))
        per_corpus[name] = {"tokens": n, "perplexity": round(math.exp(m), 3)}
        test_nll += m * n
        test_n += n
    test_ppl = math.exp(test_nll / test_n)
    log(f"test perplexity (this code, {'bf16' if dev == 'cuda' else 'fp32'}): {test_ppl:.3f} over "
        f"{test_n:,} tokens; " + ", ".join(f"{k} {v['perplexity']}" for k, v in per_corpus.items()))

    # -- export
    state = {k: v for k, v in model.state_dict().items()}
    write_safetensors(torch, state, os.path.join(model_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1}, f, indent=2)
    minutes = train_s / 60
    with open(os.path.join(model_dir, "metronome.json"), "w") as f:
        json.dump({"id": MODEL_ID if not args.smoke else MODEL_ID + "-smoke",
                   "description": (f"a {n_params / 1e6:.1f}M-parameter Llama trained for "
                                   f"{minutes:.1f} min on public-domain English (the King James "
                                   "Bible, Moby-Dick, State of the Union addresses, Shakespeare): "
                                   "it continues text in their style and is no assistant "
                                   "(docs/default-model.md)")},
                  f, indent=2)
    folder_bytes = sum(os.path.getsize(os.path.join(model_dir, n)) for n in os.listdir(model_dir))
    if folder_bytes > MAX_FOLDER_BYTES:
        die(f"{model_dir} holds {folder_bytes:,} bytes, over 16 MiB")
    report = {
        "model": dict(c, parameters=n_params, tied_embeddings=True),
        "data": {"corpora": corpus_tokens, "train_tokens": len(train_ids),
                 "validation_tokens": len(val_ids), "test_tokens": test_n,
                 "test_share": TEST_SHARE, "validation_share": VALIDATION_SHARE},
        "training": {"steps": step, "batch": B, "window": T, "tokens": tokens_trained,
                     "passes": round(tokens_trained / len(train_ids), 2),
                     "seconds": round(train_s, 1), "tokens_per_s": round(tokens_trained / train_s),
                     "tokenizer_seconds": round(tokenizer_s, 1),
                     "lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup,
                     "weight_decay": args.weight_decay, "dropout": args.dropout,
                     "seed": args.seed, "determinism": determinism,
                     "best_step": best["step"], "best_validation_loss": round(best["val_loss"], 4),
                     "retrain": f"--steps {step} --seed {args.seed}",
                     # How this run chose its step count (retrain repeats it).
                     "made_with": (f"--steps {args.steps}" if args.steps else
                                   f"--train-seconds {args.train_seconds:g} "
                                   f"--max-passes {args.max_passes:g}")
                                  + f" --seed {args.seed}"},
        "test": {"perplexity_bf16_autocast": round(test_ppl, 4), "per_corpus": per_corpus,
                 "window": T},
        "curve": curve,
        "files": {"folder_bytes": folder_bytes,
                  "tokenizer_sha256": sha256(tok_path),
                  "weights_sha256": sha256(os.path.join(model_dir, "model.safetensors"))},
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0],
                     "cuda": torch.version.cuda,
                     "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
                     "tokenizers": None if args.smoke else __import__("tokenizers").__version__},
        "total_seconds": round(time.time() - t_start, 1),
    }
    with open(os.path.join(args.out, "training_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    log(f"wrote {model_dir} ({folder_bytes / 2**20:.2f} MiB) and "
        f"{os.path.join(args.out, 'training_report.json')} in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
