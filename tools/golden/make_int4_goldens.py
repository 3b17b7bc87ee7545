#!/usr/bin/env python3
"""Goldens for INT4 W4A16 weights (issue 35): tiny GPTQ- and AWQ-layout Llama
checkpoints and the logits of Hugging Face transformers on their dequantized
weights. Runs once on the GPU machine (python3 with torch, transformers,
safetensors; no network; nothing from this repository but this file):

    python3 tools/golden/make_int4_goldens.py "$OUT"

What it does, per variant (the list is VARIANTS below):

1. Builds a tiny Llama (hidden 256, 2 layers, 4 heads of 64, 2 KV heads,
   intermediate 512, vocab 512, separate LM head) with random fp32 weights
   from a fixed seed.
2. Quantizes every q/k/v/o/gate/up/down projection to 4 bits by round to
   nearest (the quantizers' own min/max rules: AutoGPTQ's Quantizer for
   GPTQ, AutoAWQ's pseudo_quantize_tensor for AWQ; no calibration) and
   writes a Hugging Face folder in the layout real checkpoints have
   (docs/quantization.md describes both): config.json with
   quantization_config, model.safetensors, generation_config.json, and for
   GPTQ quantize_config.json. Embeddings, norms and the LM head stay bf16.
3. Reads the folder's tensors back from disk and dequantizes them to fp32
   with each layout's published formula (gptq_dequantize / awq_dequantize,
   which see only the saved tensors), and checks them against the fp32
   originals (|w - deq| <= 0.51 * scale, RTN's bound) and, exactly, against
   the quantizer's own integers: a packing bug fails here, loudly.
4. Loads the dequantized weights into a fresh transformers LlamaForCausalLM,
   float32 on the CPU with eager attention (as tools/golden/hf_reference.py),
   and for four prompts of raw token ids (lengths 1, 7, 19, 40) records the
   prefill and 16 greedy decode steps in hf_reference.py's JSON layout:
   per step the top-16 logits, the logits at 64 probe ids, the largest
   |logit| and the greedy id. A plain-torch Llama written here recomputes the
   same logits as a cross-check of the config's interpretation (reported,
   not fatal).

Output under OUT (default $OUT): int4_goldens.tar.xz holding int4_goldens/
<variant>/ (the checkpoint folder) and int4_goldens/<variant>.json (its
golden), and summary.json; a summary is printed.

--smoke (for a machine without transformers/safetensors): the same, but the
reference is the plain-torch Llama; its JSON says so and is no golden.
"""
import argparse
import hashlib
import io
import json
import math
import os
import struct
import sys
import tarfile
import tempfile
import time


def die(msg):
    print("make_int4_goldens: error: " + msg, file=sys.stderr, flush=True)
    sys.exit(2)


try:
    import torch
except ImportError:
    die("torch is not installed (this script needs torch, transformers, safetensors)")

SEED = 7
STEPS = 16          # greedy decode steps after the prefill (hf_reference.py)
TOP = 16            # top logits recorded per step (hf_reference.py)
PROBES = 64         # fixed probe ids per step (hf_reference.py)
PROMPT_LENGTHS = (1, 7, 19, 40)
BITS = 4
PACK = 32 // BITS   # nibbles per int32
EOS_ID = 2          # its LM-head row is zero: greedy never picks it

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": EOS_ID,
    "use_cache": True,
    "torch_dtype": "float16",
}

PROJECTIONS = [
    ("self_attn.q_proj", "q"), ("self_attn.k_proj", "k"), ("self_attn.v_proj", "v"),
    ("self_attn.o_proj", "o"), ("mlp.gate_proj", "gate"), ("mlp.up_proj", "up"),
    ("mlp.down_proj", "down"),
]

# name, method, group_size (-1: one group per input row = per channel), sym, desc_act
VARIANTS = [
    ("gptq-g128-sym", "gptq", 128, True, False),
    ("gptq-g64-asym", "gptq", 64, False, False),
    ("gptq-perchannel", "gptq", -1, True, False),
    ("gptq-actorder-g32-asym", "gptq", 32, False, True),
    ("gptq-actorder-g128-sym", "gptq", 128, True, True),
    ("awq-g64", "awq", 64, False, False),
    ("awq-g128", "awq", 128, False, False),
]


# --------------------------------------------------------------------------
# The fp32 model


def shape_of(kind, c):
    h, i = c["hidden_size"], c["intermediate_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    return {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q),
            "gate": (i, h), "up": (i, h), "down": (h, i)}[kind]


def make_weights(c, seed):
    """Random fp32 weights, [out, in] as nn.Linear. Projections: unit-variance
    rows with a per-row offset (so asymmetric zeros vary) and per-input-column
    magnitudes (so act-order's permutation matters). Embeddings, norms and the
    LM head are rounded to bf16 (they are stored so)."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32)
    bf = lambda t: t.to(torch.bfloat16).to(torch.float32)
    v, h = c["vocab_size"], c["hidden_size"]
    w = {"model.embed_tokens.weight": bf(rn(v, h))}
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        w[p + "input_layernorm.weight"] = bf(1 + 0.1 * rn(h))
        w[p + "post_attention_layernorm.weight"] = bf(1 + 0.1 * rn(h))
        for name, kind in PROJECTIONS:
            out_f, in_f = shape_of(kind, c)
            col = torch.exp(0.3 * rn(1, in_f))
            w[p + name + ".weight"] = (rn(out_f, in_f) + 0.2 * rn(out_f, 1)) * col / math.sqrt(in_f)
    w["model.norm.weight"] = bf(1 + 0.1 * rn(h))
    head = 2.0 * rn(v, h) / math.sqrt(h)
    head[EOS_ID] = 0
    w["lm_head.weight"] = bf(head)
    return w


# --------------------------------------------------------------------------
# Round-to-nearest quantizers (integers, fp16 scales, integer zeros)


def rtn_gptq(w, group, sym, perm):
    """AutoGPTQ's Quantizer.find_params/quantize rules per group, without the
    GPTQ error feedback: range [min(x.min, 0), max(x.max, 0)]; sym: the range
    made symmetric, zero = (maxq + 1) / 2 = 8; asym: zero = round(-xmin /
    scale); scale = (xmax - xmin) / 15; q = clamp(round(w / scale) + zero, 0,
    15). Groups are consecutive columns of w[:, perm] (identity without
    desc_act); g_idx[c] = (position of column c in perm) // group, as
    GPTQ.fasterquant writes it (g_idx = (arange // group)[invperm]).
    Returns q [out, in] (original column order), scale fp16 [ngroups, out],
    zero int [ngroups, out], g_idx int32 [in]."""
    out_f, in_f = w.shape
    gs = in_f if group == -1 else group
    assert in_f % gs == 0
    ng = in_f // gs
    wp = w[:, perm].reshape(out_f, ng, gs)
    xmin = torch.clamp(wp.amin(dim=2), max=0)
    xmax = torch.clamp(wp.amax(dim=2), min=0)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    both0 = (xmin == 0) & (xmax == 0)
    xmin = torch.where(both0, torch.full_like(xmin, -1), xmin)
    xmax = torch.where(both0, torch.full_like(xmax, 1), xmax)
    scale = ((xmax - xmin) / 15).to(torch.float16)
    s32 = scale.to(torch.float32)
    zero = torch.full_like(s32, 8.0) if sym else torch.round(-xmin / s32)
    # The v1 format stores zero - 1 in a nibble: zero 0 would be stored as -1
    # (AutoGPTQ's known overflow); keep the golden clear of it.
    assert int(zero.min()) >= 1 and int(zero.max()) <= 15, "GPTQ zero out of 1..15"
    q = torch.clamp(torch.round(wp / s32[:, :, None]) + zero[:, :, None], 0, 15)
    invperm = torch.argsort(perm)
    q = q.reshape(out_f, in_f)[:, invperm].to(torch.int32)
    g_idx = (torch.arange(in_f) // gs)[invperm].to(torch.int32)
    return q, scale.t().contiguous(), zero.t().contiguous().to(torch.int32), g_idx


def rtn_awq(w, group):
    """AutoAWQ's pseudo_quantize_tensor with zero_point: per group max/min
    (no widening to 0), scale = max(max - min, 1e-5) / 15, zero =
    clamp(-round(min / scale), 0, 15), q = clamp(round(w / scale) + zero, 0,
    15). Returns q [out, in], scale fp16 [ngroups, out], zero [ngroups, out]."""
    out_f, in_f = w.shape
    gs = in_f if group == -1 else group
    ng = in_f // gs
    wg = w.reshape(out_f, ng, gs)
    mx, mn = wg.amax(dim=2), wg.amin(dim=2)
    scale = (torch.clamp(mx - mn, min=1e-5) / 15).to(torch.float16)
    s32 = scale.to(torch.float32)
    zero = torch.clamp(-torch.round(mn / s32), 0, 15)
    q = torch.clamp(torch.round(wg / s32[:, :, None]) + zero[:, :, None], 0, 15)
    q = q.reshape(out_f, in_f).to(torch.int32)
    return q, scale.t().contiguous(), zero.t().contiguous().to(torch.int32)


# --------------------------------------------------------------------------
# Packing (the writers' layouts)


def to_int32(x64):
    """int64 holding 32 bits (0..2^32-1) -> int32 with the same bits."""
    x64 = x64 & 0xFFFFFFFF
    return torch.where(x64 >= 2 ** 31, x64 - 2 ** 32, x64).to(torch.int32)


def pack_rows(vals):
    """[R, C] nibbles -> [R / 8, C] int32: row 8r + k in bits 4k..4k+3 of row r
    (GPTQ qweight: AutoGPTQ QuantLinear.pack)."""
    v = vals.to(torch.int64).reshape(vals.shape[0] // PACK, PACK, vals.shape[1])
    out = torch.zeros(v.shape[0], v.shape[2], dtype=torch.int64)
    for k in range(PACK):
        out |= (v[:, k, :] & 0xF) << (BITS * k)
    return to_int32(out)


def pack_cols(vals, order):
    """[R, C] nibbles -> [R, C / 8] int32: bits 4k..4k+3 of column c hold
    column 8c + order[k] (GPTQ qzeros: order 0..7; AWQ GEMM: 0,2,4,6,1,3,5,7)."""
    v = vals.to(torch.int64).reshape(vals.shape[0], vals.shape[1] // PACK, PACK)
    out = torch.zeros(v.shape[0], v.shape[1], dtype=torch.int64)
    for k in range(PACK):
        out |= (v[:, :, order[k]] & 0xF) << (BITS * k)
    return to_int32(out)


GPTQ_ORDER = list(range(8))
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]       # AutoAWQ WQLinear_GEMM.from_linear's order_map


# --------------------------------------------------------------------------
# Dequantization from the saved tensors alone (the published formulas)


def nibbles(x):
    """int32 [..., n] -> int32 [..., n, 8]: (x >> 4k) & 0xF, k = 0..7."""
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32)
    return torch.bitwise_and(torch.bitwise_right_shift(x.unsqueeze(-1), shifts), 0xF)


def gptq_dequantize(t, prefix):
    """GPTQ v1 ("gptq" checkpoint_format), the formula of AutoGPTQ's torch
    path (AutoGPTQ/AutoGPTQ auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py
    and qlinear_cuda.py, forward without the CUDA extension):
      weight[i, o] = (qweight[i / 8, o] >> 4 (i % 8)) & 0xF     [in, out]
      zeros[g, o]  = ((qzeros[g, o / 8] >> 4 (o % 8)) & 0xF) + 1
      W^T[i, o]    = scales[g_idx[i], o] * (weight[i, o] - zeros[g_idx[i], o])
    Returns the nn.Linear weight [out, in] in fp32."""
    qweight, qzeros = t[prefix + "qweight"], t[prefix + "qzeros"]
    scales, g_idx = t[prefix + "scales"], t[prefix + "g_idx"].long()
    assert qweight.dtype == torch.int32 and qzeros.dtype == torch.int32
    assert scales.dtype == torch.float16 and t[prefix + "g_idx"].dtype == torch.int32
    iw = nibbles(qweight.t().contiguous())                 # [out, in/8, 8]
    iw = iw.reshape(qweight.shape[1], -1).t()              # [in, out]
    iz = nibbles(qzeros).reshape(qzeros.shape[0], -1) + 1  # [ngroups, out]
    s = scales.to(torch.float32)
    w = s[g_idx] * (iw - iz[g_idx]).to(torch.float32)      # [in, out]
    return w.t().contiguous()


AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]   # column j of a block is nibble AWQ_REVERSE_ORDER[j]


def awq_dequantize(t, prefix, group):
    """AWQ GEMM ("version": "gemm"), the formula of AutoAWQ's
    dequantize_gemm (casper-hansen/AutoAWQ awq/utils/packing_utils.py: unpack
    with shifts 0, 4, ..., 28, reorder by AWQ_REVERSE_ORDER) as vLLM's
    awq_dequantize (vllm-project/vllm
    vllm/model_executor/layers/quantization/awq_triton.py):
      iw[i, 8c + j] = (qweight[i, c] >> 4 AWQ_REVERSE_ORDER[j]) & 0xF  [in, out]
      iz[g, 8c + j] = (qzeros[g, c]  >> 4 AWQ_REVERSE_ORDER[j]) & 0xF  (no +1)
      W^T[i, o]     = (iw[i, o] - iz[i / group, o]) * scales[i / group, o]
    Returns the nn.Linear weight [out, in] in fp32."""
    qweight, qzeros, scales = t[prefix + "qweight"], t[prefix + "qzeros"], t[prefix + "scales"]
    assert qweight.dtype == torch.int32 and qzeros.dtype == torch.int32
    assert scales.dtype == torch.float16
    assert prefix + "g_idx" not in t
    rev = torch.tensor(AWQ_REVERSE_ORDER)
    iw = nibbles(qweight)[:, :, rev].reshape(qweight.shape[0], -1)   # [in, out]
    iz = nibbles(qzeros)[:, :, rev].reshape(qzeros.shape[0], -1)     # [ngroups, out]
    gs = qweight.shape[0] if group == -1 else group
    gi = torch.arange(qweight.shape[0]) // gs
    w = (iw - iz[gi]).to(torch.float32) * scales.to(torch.float32)[gi]
    return w.t().contiguous()


def self_test_packing():
    """Hand-worked words (values 1..8 for rows/columns 0..7), so that pack and
    unpack cannot agree on a wrong order between themselves."""
    v = torch.arange(1, 9, dtype=torch.int32)
    # GPTQ qweight: input row 8r + k in bits 4k: 1..8 -> 0x87654321.
    assert pack_rows(v[:, None]).item() == to_int32(torch.tensor(0x87654321)).item()
    # GPTQ qzeros: output column 8c + k in bits 4k; zero 8 stored as 7.
    assert pack_cols(v[None, :], GPTQ_ORDER).item() == to_int32(torch.tensor(0x87654321)).item()
    assert pack_cols(torch.full((1, 8), 8 - 1), GPTQ_ORDER).item() == 0x77777777
    # AWQ: bits 4k hold column order[k] = 0,2,4,6,1,3,5,7: nibbles 1,3,5,7,2,4,6,8.
    word = to_int32(torch.tensor(0x86427531))
    assert pack_cols(v[None, :], AWQ_ORDER).item() == word.item()
    assert nibbles(word.reshape(1, 1))[0, 0, torch.tensor(AWQ_REVERSE_ORDER)].tolist() == v.tolist()
    assert nibbles(to_int32(torch.tensor(0x87654321)).reshape(1))[0].tolist() == v.tolist()


# --------------------------------------------------------------------------
# safetensors (the library where installed; else a minimal reader/writer of
# the same format, for --smoke)

ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int32: "I32"}


def save_safetensors(tensors, path):
    try:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
        return "safetensors"
    except ImportError:
        pass
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return "built-in writer"


def load_safetensors(path):
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    import numpy as np
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    npt = {"F32": np.float32, "F16": np.float16, "BF16": np.int16, "I32": np.int32}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + end], dtype=npt[e["dtype"]]).copy()
        t = torch.from_numpy(a).reshape(e["shape"])
        out[name] = t.view(torch.bfloat16) if e["dtype"] == "BF16" else t
    return out


# --------------------------------------------------------------------------
# Writing a checkpoint folder


def quant_config(method, group, sym, desc_act):
    if method == "gptq":  # AutoGPTQ BaseQuantizeConfig.to_dict(), as config.json carries it
        return {"bits": BITS, "group_size": group, "damp_percent": 0.01, "desc_act": desc_act,
                "static_groups": False, "sym": sym, "true_sequential": True,
                "model_name_or_path": None, "model_file_base_name": "model",
                "quant_method": "gptq", "checkpoint_format": "gptq"}
    # AutoAWQ's quantization_config in config.json
    return {"quant_method": "awq", "bits": BITS, "group_size": group, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None}


def write_variant(folder, weights, method, group, sym, desc_act, seed):
    """Quantizes and writes one folder. Returns the quantizer's integers per
    projection (for the exact check) and the tensors written."""
    c = CONFIG
    os.makedirs(folder, exist_ok=True)
    tensors, ints = {}, {}
    g = torch.Generator().manual_seed(seed + 1000)
    for name, w in weights.items():
        if not name.endswith("_proj.weight"):
            tensors[name] = w.to(torch.bfloat16)
            continue
        prefix = name[:-len("weight")]
        out_f, in_f = w.shape
        if method == "gptq":
            perm = torch.randperm(in_f, generator=g) if desc_act else torch.arange(in_f)
            q, scale, zero, g_idx = rtn_gptq(w, group, sym, perm)
            if desc_act:
                assert bool((g_idx[1:] < g_idx[:-1]).any()), "act-order g_idx is monotonic"
            tensors[prefix + "qweight"] = pack_rows(q.t().contiguous())          # [in/8, out]
            tensors[prefix + "qzeros"] = pack_cols(zero - 1, GPTQ_ORDER)          # [ng, out/8]
            tensors[prefix + "scales"] = scale                                    # [ng, out]
            tensors[prefix + "g_idx"] = g_idx                                     # [in]
            ints[prefix] = (q, zero, scale, g_idx.long())
        else:
            q, scale, zero = rtn_awq(w, group)
            tensors[prefix + "qweight"] = pack_cols(q.t().contiguous(), AWQ_ORDER)  # [in, out/8]
            tensors[prefix + "qzeros"] = pack_cols(zero, AWQ_ORDER)                 # [ng, out/8]
            tensors[prefix + "scales"] = scale                                      # [ng, out]
            gs = in_f if group == -1 else group
            ints[prefix] = (q, zero, scale, torch.arange(in_f) // gs)
    writer = save_safetensors(tensors, os.path.join(folder, "model.safetensors"))
    qc = quant_config(method, group, sym, desc_act)
    cfg = dict(c)
    cfg["quantization_config"] = qc
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": c["bos_token_id"],
                   "eos_token_id": c["eos_token_id"]}, f, indent=2)
    if method == "gptq":  # AutoGPTQ also writes the config on its own
        with open(os.path.join(folder, "quantize_config.json"), "w") as f:
            json.dump(qc, f, indent=2)
    return ints, writer


def dequantized_state_dict(folder):
    """fp32 state dict from the folder's files alone (config.json's
    quantization_config and model.safetensors)."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    qc = cfg["quantization_config"]
    t = load_safetensors(os.path.join(folder, "model.safetensors"))
    sd = {}
    for name, v in t.items():
        if name.endswith((".qweight", ".qzeros", ".scales", ".g_idx")):
            prefix = name[:name.rindex(".") + 1]
            if prefix + "weight" in sd:
                continue
            if qc["quant_method"] == "gptq":
                assert qc["checkpoint_format"] == "gptq" and qc["bits"] == 4
                sd[prefix + "weight"] = gptq_dequantize(t, prefix)
            else:
                assert qc["version"] == "gemm" and qc["bits"] == 4 and qc["zero_point"]
                sd[prefix + "weight"] = awq_dequantize(t, prefix, qc["group_size"])
        else:
            assert v.dtype == torch.bfloat16, name
            sd[name] = v.to(torch.float32)
    return sd


def check_dequant(sd, weights, ints, method):
    """Every projection: equal to the quantizer's (q - zero) * scale exactly,
    and within 0.51 scale of the fp32 original. Returns (max |err|, max
    |err| / scale)."""
    worst_abs, worst_rel = 0.0, 0.0
    for name, w in weights.items():
        got = sd[name]
        assert got.shape == w.shape, (name, got.shape, w.shape)
        if not name.endswith("_proj.weight"):
            assert torch.equal(got, w), name
            continue
        q, zero, scale, gidx = ints[name[:-len("weight")]]
        s = scale.to(torch.float32).t()[:, gidx]                  # [out, in]
        z = zero.to(torch.float32).t()[:, gidx]
        want = (q.to(torch.float32) - z) * s
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:4].tolist()
            die("%s: the dequantized file differs from the quantizer's integers at %s "
                "(a packing bug)" % (name, bad))
        err = (got - w).abs()
        rel = err / s
        if float(rel.max()) > 0.51:
            i = int(rel.argmax())
            die("%s: |w - dequant| = %.3g is %.3f of the scale (> 0.51) at flat index %d"
                % (name, float(err.flatten()[i]), float(rel.flatten()[i]), i))
        worst_abs = max(worst_abs, float(err.max()))
        worst_rel = max(worst_rel, float(rel.max()))
    return worst_abs, worst_rel


# --------------------------------------------------------------------------
# References: transformers, and a plain-torch Llama for the cross-check


def hf_model(sd):
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = {k: v for k, v in CONFIG.items() if k not in ("torch_dtype", "architectures")}
    config = LlamaConfig(**cfg, attn_implementation="eager")
    try:
        config._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m and "inv_freq" not in m]
    if missing or unexpected:
        die("state dict mismatch: missing %s, unexpected %s" % (missing, unexpected))
    model.eval()
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, n
    theta = getattr(model.config, "rope_theta", None)
    if theta is None:
        theta = (getattr(model.config, "rope_parameters", None) or {}).get("rope_theta")
    if theta is not None and float(theta) != CONFIG["rope_theta"]:
        die("transformers took rope_theta %s, not %s" % (theta, CONFIG["rope_theta"]))
    desc = "transformers %s, torch %s, float32 on CPU, eager attention (%s)" % (
        transformers.__version__, torch.__version__,
        getattr(model.config, "_attn_implementation", "?"))
    return model, desc


class HfRunner:
    def __init__(self, model):
        self.model = model

    def prefill(self, ids):
        out = self.model(input_ids=torch.tensor([ids]), use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].float()

    def step(self, tok, pos):
        out = self.model(input_ids=torch.tensor([[tok]]), past_key_values=self.past,
                         use_cache=True, position_ids=torch.tensor([[pos]]),
                         cache_position=torch.tensor([pos]))
        self.past = out.past_key_values
        return out.logits[0, -1].float()


def plain_llama_logits(sd, ids):
    """Logits at every position of `ids` by a Llama written out here (RMSNorm,
    default RoPE by rotate-half, GQA, causal softmax, SwiGLU), fp32."""
    c = CONFIG
    nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps, n = c["rms_norm_eps"], len(ids)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos(), ang.sin()

    def rope(x):  # [heads, n, d]
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    x = sd["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((n, n), float("-inf")).triu(1)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        h = norm(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].t()).view(n, nh, d).transpose(0, 1)
        k = (h @ sd[p + "self_attn.k_proj.weight"].t()).view(n, nkv, d).transpose(0, 1)
        v = (h @ sd[p + "self_attn.v_proj.weight"].t()).view(n, nkv, d).transpose(0, 1)
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(nh // nkv, dim=0)
        v = v.repeat_interleave(nh // nkv, dim=0)
        a = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d) + mask, dim=-1) @ v
        x = x + a.transpose(0, 1).reshape(n, nh * d) @ sd[p + "self_attn.o_proj.weight"].t()
        h = norm(x, sd[p + "post_attention_layernorm.weight"])
        gate = h @ sd[p + "mlp.gate_proj.weight"].t()
        up = h @ sd[p + "mlp.up_proj.weight"].t()
        x = x + (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].t()
    return norm(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].t()


class PlainRunner:
    def __init__(self, sd):
        self.sd = sd

    def prefill(self, ids):
        self.ids = list(ids)
        return plain_llama_logits(self.sd, self.ids)[-1]

    def step(self, tok, pos):
        assert pos == len(self.ids)
        self.ids.append(tok)
        return plain_llama_logits(self.sd, self.ids)[-1]


# --------------------------------------------------------------------------
# Goldens


def prompts_for(vocab):
    """Deterministic prompts of raw ids: hf_reference.py's LCG, no BOS."""
    state, out = 12345, []
    for n in PROMPT_LENGTHS:
        ids = []
        while len(ids) < n:
            state = (state * 1103515245 + 12345) % (1 << 31)
            ids.append(state % vocab)
        out.append(ids)
    return out


def record(logits, probe_ids):
    top = torch.topk(logits, TOP)
    return {
        "top_ids": top.indices.tolist(),
        "top_logits": [float(x) for x in top.values.tolist()],
        "probe_logits": [float(logits[i]) for i in probe_ids],
        "max_abs": float(logits.abs().max()),
        "argmax": int(torch.argmax(logits)),
    }


def run_prompts(runner, prompts, probe_ids):
    runs, all_logits = [], []
    for ids in prompts:
        logits = runner.prefill(ids)
        steps, seq = [record(logits, probe_ids)], [logits]
        pos = len(ids)
        for _ in range(STEPS):
            logits = runner.step(int(torch.argmax(logits)), pos)
            steps.append(record(logits, probe_ids))
            seq.append(logits)
            pos += 1
        runs.append({"prompt": ids, "steps": steps, "greedy_ids": [s["argmax"] for s in steps]})
        all_logits.append(torch.stack(seq))
    return runs, all_logits


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT"),
                    help="output directory (default $OUT)")
    ap.add_argument("--smoke", action="store_true",
                    help="no transformers: the plain-torch Llama is the reference (no golden)")
    ap.add_argument("--only", help="comma-separated variant names (default all)")
    args = ap.parse_args()
    if not args.out:
        die("no output directory (give one or set $OUT)")
    if not args.smoke:
        for mod in ("transformers", "safetensors"):
            try:
                __import__(mod)
            except ImportError:
                die("%s is not installed (use --smoke to test without it; that makes no golden)"
                    % mod)
    t0 = time.time()
    torch.set_grad_enabled(False)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    variants = VARIANTS
    if args.only:
        names = args.only.split(",")
        variants = [v for v in VARIANTS if v[0] in names]
        if len(variants) != len(names):
            die("unknown variant in --only %s" % args.only)

    self_test_packing()
    weights = make_weights(CONFIG, SEED)
    vocab = CONFIG["vocab_size"]
    probe_ids = [(i * vocab) // PROBES + 7 for i in range(PROBES)]
    prompts = prompts_for(vocab)
    script_sha = sha256(os.path.abspath(__file__))
    work = tempfile.mkdtemp(prefix="int4_goldens_")
    root = os.path.join(work, "int4_goldens")
    summary = {"script_sha256": script_sha, "smoke": args.smoke, "variants": {}}
    print("make_int4_goldens: torch %s, %d variants, smoke=%s" % (torch.__version__,
          len(variants), args.smoke), flush=True)

    for name, method, group, sym, desc_act in variants:
        folder = os.path.join(root, name)
        ints, writer = write_variant(folder, weights, method, group, sym, desc_act, SEED)
        sd = dequantized_state_dict(folder)
        err_abs, err_rel = check_dequant(sd, weights, ints, method)

        if args.smoke:
            runs, ref_logits = run_prompts(PlainRunner(sd), prompts, probe_ids)
            reference = ("SMOKE TEST ONLY, NOT A GOLDEN: plain-torch Llama of make_int4_goldens.py, "
                         "torch %s" % torch.__version__)
            cross = None
        else:
            model, reference = hf_model(sd)
            runs, ref_logits = run_prompts(HfRunner(model), prompts, probe_ids)
            # The plain Llama fed the reference's tokens: same logits expected.
            cross = 0.0
            for r, lg in zip(runs, ref_logits):
                toks = r["prompt"] + r["greedy_ids"][:-1]
                pl = plain_llama_logits(sd, toks)[len(r["prompt"]) - 1:]
                cross = max(cross, float((pl - lg).abs().max() / lg.abs().max()))
        eos_hits = sum(r["greedy_ids"].count(EOS_ID) for r in runs)
        margins = []
        for lg in ref_logits:
            top2 = torch.topk(lg, 2, dim=-1).values
            margins.append(((top2[:, 0] - top2[:, 1]) / lg.abs().amax(dim=-1)).min())
        min_margin = float(min(margins))

        weights_path = os.path.join(folder, "model.safetensors")
        doc = {
            "name": name,
            "seed": SEED,
            "reference": reference,
            "weights_sha256": sha256(weights_path),
            "quantization": quant_config(method, group, sym, desc_act),
            "dequant": "gptq_dequantize (AutoGPTQ v1 formula)" if method == "gptq"
                       else "awq_dequantize (AutoAWQ GEMM formula)",
            "dequant_max_abs_error": err_abs,
            "dequant_max_error_over_scale": err_rel,
            "plain_llama_max_rel_diff": cross,
            "min_top2_margin_rel": min_margin,
            "script_sha256": script_sha,
            "probe_ids": probe_ids,
            "steps_per_prompt": STEPS + 1,
            "runs": runs,
        }
        jpath = os.path.join(root, name + ".json")
        with open(jpath, "w") as f:
            json.dump(doc, f, indent=1)
        kib = os.path.getsize(jpath) / 1024
        assert kib < 2048, "%s is %.0f KiB" % (jpath, kib)
        summary["variants"][name] = {
            "dequant_max_abs_error": err_abs, "dequant_max_error_over_scale": err_rel,
            "plain_llama_max_rel_diff": cross, "min_top2_margin_rel": min_margin,
            "eos_in_greedy": eos_hits, "greedy_ids_prompt0": runs[0]["greedy_ids"],
            "weights_sha256": doc["weights_sha256"], "safetensors_writer": writer,
            "json_kib": round(kib, 1)}
        print("%-24s dequant max err %.4g (%.3f of scale)  plain-vs-ref %s  min margin %.2e  "
              "greedy[0] %s%s" % (name, err_abs, err_rel,
                                  "n/a" if cross is None else "%.2e" % cross, min_margin,
                                  runs[0]["greedy_ids"],
                                  "  WARNING: EOS in greedy ids" if eos_hits else ""),
              flush=True)
        if cross is not None and cross > 1e-4:
            print("WARNING: %s: transformers and the plain Llama differ by %.2e of the largest "
                  "logit: check the config's interpretation" % (name, cross), flush=True)

    tar_path = os.path.join(args.out, "int4_goldens.tar.xz")
    with tarfile.open(tar_path, "w:xz") as tar:
        tar.add(root, arcname="int4_goldens")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    mib = os.path.getsize(tar_path) / (1 << 20)
    print("wrote %s (%.2f MiB) and summary.json in %.1f s" % (tar_path, mib, time.time() - t0))
    if mib > 15:
        die("the archive is over 15 MiB")


if __name__ == "__main__":
    main()
