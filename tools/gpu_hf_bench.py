#!/usr/bin/env python3
"""The Hugging Face transformers side of the GPU benchmark.

Runs the same model folder (made by `metronome make-model`) through
transformers in bf16 on the GPU and writes rows
{"engine", "model", "metric", "value", "unit", "floor"} with the metric names
of bench/gpu/gpu_bench.cpp, so both land in one table:

- engine "hf-eager": the default dynamic cache, PyTorch eager (sdpa attention);
- engine "hf-static-compile": a StaticCache and the one-token forward under
  torch.compile(mode="reduce-overhead") (CUDA graphs), driven by a greedy
  loop written here (as gpt-fast does): generate() with
  cache_implementation="static" under the same compile fails in this
  torch/transformers pair ("accessing tensor output of CUDAGraphs that has
  been overwritten by a subsequent run": generate() keeps the graph's outputs
  across steps); the loop marks each step (cudagraph_mark_step_begin) and
  consumes the logits before the next replay;
- engine "hf-eager-loop": the eager forward called by hand, no generate().

Decode figures are what `model.generate()` (greedy) spends per token: a
logits processor, called once per generated token, synchronises and stamps
the time; the figure is the median gap between consecutive stamps after
warm-up. Prefill is the forward of the whole prompt (logits of the last
position only where the installed transformers supports it). Rows are written
after every figure, so a run cut short by its time limit keeps what it has.
Failures of one configuration are reported as rows with a null value and a
note, never as a crash of the whole benchmark.
"""

import argparse
import json
import statistics
import sys
import time
import traceback

import torch


def median_ms(samples):
    return statistics.median(samples) * 1e3


def load(path, attn="sdpa"):
    from transformers import AutoModelForCausalLM

    kwargs = dict(attn_implementation=attn)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kwargs)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, **kwargs)
    return model.to("cuda").eval()


def random_ids(vocab, batch, length, seed=2026):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).to("cuda")


def forward_last(model, **kw):
    """A forward that computes logits of the last position only if it can."""
    try:
        return model(logits_to_keep=1, **kw)
    except TypeError:
        return model(**kw)


class StepTimer:
    """A logits processor that records when each generation step ends."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores):
        torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())
        return scores


@torch.no_grad()
def generate_step_ms(model, vocab, batch, ctx, warm, steps):
    from transformers import LogitsProcessorList

    ids = random_ids(vocab, batch, ctx)
    timer = StepTimer()
    n = warm + steps + 1
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                   min_new_tokens=n, do_sample=False, pad_token_id=0,
                   logits_processor=LogitsProcessorList([timer]))
    gaps = [b - a for a, b in zip(timer.stamps[warm:], timer.stamps[warm + 1:])]
    torch.cuda.empty_cache()
    return median_ms(gaps)


@torch.no_grad()
def eager_decode(model, vocab, batch, ctx, warm, steps):
    from transformers import DynamicCache

    ids = random_ids(vocab, batch, ctx)
    cache = DynamicCache()
    out = forward_last(model, input_ids=ids, past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    cache = out.past_key_values
    times = []
    for i in range(warm + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=tok, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        if i >= warm:
            times.append(time.perf_counter() - t0)
        cache = out.past_key_values
    del cache, out
    torch.cuda.empty_cache()
    return median_ms(times)


def make_static_cache(model, batch, max_len):
    """A StaticCache, whatever the installed transformers calls its arguments."""
    import inspect

    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kw = dict(config=model.config, max_cache_len=max_len)
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", "cuda"),
                        ("dtype", torch.bfloat16)):
        if name in params:
            kw[name] = value
    return StaticCache(**kw)


@torch.no_grad()
def compiled_decode(model, vocab, ctx, warm, steps, fullgraph=True):
    """Per-token time of greedy decoding with a static cache and the one-token
    forward compiled with CUDA graphs; returns (ms, compile seconds)."""
    ids = random_ids(vocab, 1, ctx)
    cache = make_static_cache(model, 1, ctx + warm + steps + 8)
    out = forward_last(model, input_ids=ids, past_key_values=cache, use_cache=True,
                       cache_position=torch.arange(ctx, device="cuda"))
    tok = out.logits[:, -1:].argmax(-1)
    del out

    def one_token(tok, pos):
        return model(input_ids=tok, past_key_values=cache, cache_position=pos,
                     use_cache=True).logits

    step = torch.compile(one_token, mode="reduce-overhead", fullgraph=fullgraph)
    pos = torch.tensor([ctx], device="cuda")
    times, t_compile = [], time.perf_counter()
    for i in range(warm + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.compiler.cudagraph_mark_step_begin()
        logits = step(tok, pos)
        tok = logits[:, -1:].argmax(-1)  # consumed before the next replay
        pos = pos + 1
        torch.cuda.synchronize()
        if i == 1:
            t_compile = time.perf_counter() - t_compile  # first call compiles, second records
        if i >= warm:
            times.append(time.perf_counter() - t0)
    del cache
    torch.cuda.empty_cache()
    return median_ms(times), t_compile


@torch.no_grad()
def prefill(model, vocab, n, reps=5):
    ids = random_ids(vocab, 1, n)
    forward_last(model, input_ids=ids, use_cache=False)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = forward_last(model, input_ids=ids, use_cache=False)
        out.logits[:, -1].argmax(-1)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return median_ms(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--compile-contexts", default="128,4096")
    ap.add_argument("--compiled-only", action="store_true",
                    help="only the static-cache compiled decode (no eager figures)")
    a = ap.parse_args()

    rows = []

    def row(engine, metric, value, unit="ms", note=None):
        r = dict(engine=engine, model=a.name, metric=metric, value=value, unit=unit, floor=None)
        if note:
            r["note"] = note
        rows.append(r)
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
        v = "n/a" if value is None else f"{value:10.3f}"
        print(f"  {engine:18s} {metric:34s} {v} {unit} {note or ''}", flush=True)

    def attempt(engine, metrics, fn):
        try:
            fn()
        except Exception as e:  # one configuration failing must not stop the rest
            note = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            traceback.print_exc(limit=2)
            for m in metrics:
                row(engine, m, None, "ms", note)
            torch.cuda.empty_cache()

    import transformers

    print(f"== {a.name}: transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    t0 = time.perf_counter()
    model = load(a.model)
    row("hf-eager", "load_s", time.perf_counter() - t0, "s")
    vocab = model.config.vocab_size
    warm, steps = (3, 10) if a.quick else (5, 30)

    for n in (() if a.compiled_only else (128, 2048)):
        attempt("hf-eager", [f"prefill_ms_{n}"],
                lambda n=n: row("hf-eager", f"prefill_ms_{n}", prefill(model, vocab, n)))
    for ctx in (() if a.compiled_only else (128, 4096)):
        attempt("hf-eager", [f"decode_bs1_ms_ctx{ctx}"],
                lambda ctx=ctx: row("hf-eager", f"decode_bs1_ms_ctx{ctx}",
                                    generate_step_ms(model, vocab, 1, ctx, warm, steps)))
    if not a.compiled_only:
        attempt("hf-eager", ["decode_step_ms_bs1_ctx1024"],
                lambda: row("hf-eager", "decode_step_ms_bs1_ctx1024",
                            generate_step_ms(model, vocab, 1, 1024, warm, steps)))
    for b in ([] if a.compiled_only else [int(x) for x in a.batches.split(",") if x]):
        attempt("hf-eager", [f"decode_step_ms_bs{b}_ctx1024"],
                lambda b=b: row("hf-eager", f"decode_step_ms_bs{b}_ctx1024",
                                generate_step_ms(model, vocab, b, 1024, 2, 6 if a.quick else 10)))
    # The same forward by hand (no generate()), for comparison.
    if not a.compiled_only:
        attempt("hf-eager-loop", ["decode_bs1_ms_ctx128"],
                lambda: row("hf-eager-loop", "decode_bs1_ms_ctx128",
                            eager_decode(model, vocab, 1, 128, warm, steps)))

    if not a.no_compile:
        contexts = [int(x) for x in a.compile_contexts.split(",") if x]

        def run_compiled(ctx):
            try:
                ms, compile_s = compiled_decode(model, vocab, ctx, max(warm, 3), steps)
            except Exception:  # graph breaks in this model's code: compile what compiles
                torch._dynamo.reset()
                ms, compile_s = compiled_decode(model, vocab, ctx, max(warm, 3), steps,
                                                fullgraph=False)
            row("hf-static-compile", f"compile_s_ctx{ctx}", compile_s, "s")
            row("hf-static-compile", f"decode_bs1_ms_ctx{ctx}", ms)

        for ctx in contexts:
            attempt("hf-static-compile", [f"decode_bs1_ms_ctx{ctx}"],
                    lambda ctx=ctx: run_compiled(ctx))

    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
