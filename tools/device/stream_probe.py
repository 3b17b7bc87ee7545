#!/usr/bin/env python3
"""Streams completions from a running metronome and reports what a client
sees: status, TTFT and inter-token gaps of one request alone, then of 16
concurrent requests, and a check that usage and text arrived."""
import http.client
import json
import statistics
import sys
import threading
import time

host = sys.argv[1]


def stream(prompt, max_tokens, results, index):
    h, p = host.split(":")
    c = http.client.HTTPConnection(h, int(p), timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    stamps, usage, text = [], None, ""
    batch = r.getheader("X-Batch-Size")
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch.get("text"):
                stamps.append(time.perf_counter())
                text += ch["text"]
    results[index] = {"status": r.status, "ttft": stamps[0] - t0 if stamps else None,
                      "gaps": [b - a for a, b in zip(stamps, stamps[1:])],
                      "usage": usage, "chars": len(text), "batch": batch}


def summary(name, rs):
    ttft = [r["ttft"] for r in rs if r["ttft"] is not None]
    gaps = [g for r in rs for g in r["gaps"]]
    gaps.sort()
    p = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")
    print("%s: status %s, TTFT median %.1f ms, inter-token gap median %.2f ms p95 %.2f ms, "
          "completion tokens %s, X-Batch-Size %s" % (
              name, sorted({r["status"] for r in rs}), 1e3 * statistics.median(ttft),
              1e3 * p(gaps, 0.5), 1e3 * p(gaps, 0.95),
              sorted({r["usage"]["completion_tokens"] for r in rs if r["usage"]}),
              sorted({r["batch"] for r in rs})))


one = [None]
stream("Once upon a time", 128, one, 0)  # warm-up
stream("Once upon a time", 256, one, 0)
summary("1 request alone, 256 tokens", one)
many = [None] * 16
threads = [threading.Thread(target=stream, args=("Request %d: tell me" % i, 128, many, i))
           for i in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
summary("16 concurrent requests, 128 tokens each", many)
