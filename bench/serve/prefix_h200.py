#!/usr/bin/env python3
"""Prefix caching on a live server (issue 34, item 3), standard library only.

  prefix_h200.py --url http://127.0.0.1:PORT [--label on] [--out result.json]

Against a running `metronome serve` (token-id prompts through
/v1/completions, streamed; time to first token is the first SSE chunk):

1. Cached prefix against the suffix alone: a 4,100-token prompt (a
   4,000-token prefix and a 100-token suffix) computed once, then the same
   prefix with 5 other suffixes (the prefix comes from the cache), and 5
   fresh 100-token prompts alone. The issue's bar: TTFT with the cached
   prefix <= 1.3x the suffix's alone (medians).
2. Multi-turn conversations: 32 conversations of 4 turns on one 2,000-token
   system prompt, each turn the conversation so far plus 60 new user tokens
   (the assistant's earlier answers are sent back as 64 fixed tokens: only
   earlier prompts can be reused, as with a client that rewrites answers),
   64 output tokens, 0.5 s between a conversation's turns, conversations
   starting 0.15 s apart. TTFT P50/P95, e2e P95, output tokens/s and the
   share of prompt tokens the server reports cached.
Run it once against a server with engine.prefix_caching=true and once with
false: the script only measures; the comparison is the caller's.
"""
import argparse
import http.client
import json
import random
import socket
import statistics
import threading
import time
import urllib.parse

VOCAB = 120000


def ids(rng, n):
    return [rng.randrange(1000, VOCAB) for _ in range(n)]


def stream(url, prompt, max_tokens):
    """(ttft_s, e2e_s, cached_tokens, output_tokens) of one streamed completion.

    The request is built and its connection opened first; the clock starts
    at its one send (headers and body in one write, as a client with its
    body ready sends it) and TTFT ends at the first chunk with a choice.
    """
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": "default", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    sock = socket.create_connection((u.hostname, u.port), timeout=600)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    sock.sendall(head + body)
    res = http.client.HTTPResponse(sock)
    res.begin()
    if res.status != 200:
        raise RuntimeError(f"HTTP {res.status}: {res.read()[:300]!r}")
    ttft = None
    cached = 0
    out = 0
    buf = b""
    while True:
        chunk = res.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                j = json.loads(line[6:])
                if j.get("choices") and ttft is None:
                    ttft = time.perf_counter() - t0
                if j.get("usage"):
                    cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
                    out = j["usage"]["completion_tokens"]
    e2e = time.perf_counter() - t0
    res.close()
    sock.close()
    return ttft, e2e, cached, out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def cached_prefix(url, rng):
    prefix = ids(rng, 4000)
    first = stream(url, prefix + ids(rng, 100), 1)
    with_prefix = [stream(url, prefix + ids(rng, 100), 1) for _ in range(5)]
    alone = [stream(url, ids(rng, 100), 1) for _ in range(5)]
    r = {
        "uncached_4100_ttft_ms": first[0] * 1e3,
        "cached_prefix_ttft_ms": [x[0] * 1e3 for x in with_prefix],
        "cached_prefix_cached_tokens": [x[2] for x in with_prefix],
        "suffix_alone_ttft_ms": [x[0] * 1e3 for x in alone],
    }
    r["ratio_cached_prefix_over_suffix_alone"] = (
        statistics.median(r["cached_prefix_ttft_ms"]) / statistics.median(r["suffix_alone_ttft_ms"]))
    return r


def multi_turn(url, rng):
    system = ids(rng, 2000)
    convs, turns = 32, 4
    user = [[ids(rng, 60) for _ in range(turns)] for _ in range(convs)]
    answer = ids(rng, 64)
    results = []
    lock = threading.Lock()

    def conversation(c):
        time.sleep(0.15 * c)
        history = list(system)
        for t in range(turns):
            history += user[c][t]
            ttft, e2e, cached, out = stream(url, history, 64)
            with lock:
                results.append({"conv": c, "turn": t, "prompt": len(history), "ttft_s": ttft,
                                "e2e_s": e2e, "cached": cached, "output": out})
            history += answer
            time.sleep(0.5)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(convs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    ttft = [r["ttft_s"] * 1e3 for r in results]
    e2e = [r["e2e_s"] * 1e3 for r in results]
    return {
        "requests": len(results),
        "wall_s": wall,
        "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p95": pct(ttft, 0.95),
        "e2e_ms_p50": pct(e2e, 0.5), "e2e_ms_p95": pct(e2e, 0.95),
        "output_tokens_per_s": sum(r["output"] for r in results) / wall,
        "prompt_tokens": sum(r["prompt"] for r in results),
        "cached_share": sum(r["cached"] for r in results) / sum(r["prompt"] for r in results),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rng = random.Random(34)
    stream(a.url, ids(rng, 64), 4)  # warm-up
    r = {"label": a.label, "cached_prefix": cached_prefix(a.url, rng),
         "multi_turn": multi_turn(a.url, rng)}
    print(json.dumps(r, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
