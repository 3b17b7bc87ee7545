#!/usr/bin/env python3
"""Soak test: does the server's heap stay flat over many requests?

Starts `metronome serve` on loopback (the embedded default model on the CPU
unless --model or --url says otherwise), drives N requests through it in
batches, and between batches, once the server is idle, reads its heap in use
(metronome:heap_in_use_bytes, glibc mallinfo2) and RSS from /metrics. After a
warm-up (caches, hash tables and allocator arenas reach their working size)
it measures how much the heap grew per request and over the run, and exits
non-zero when that growth exceeds the bound:

    growth <= bytes_per_request * measured_requests + tolerance

Issue 39's bound is 2 MB over 90,000 requests after warm-up, i.e. 22.2 bytes
per request; the same per-request figure applies to shorter runs.

The request mix (see KINDS) covers every way a request ends: non-streaming
and streaming chat and completions over HTTP, streaming chat over the
WebSocket protocol (docs/protocol.md), WebSocket `cancel`, clients that hang
up mid-stream (HTTP and WebSocket), and invalid requests.

What grows for a while and then stays is not a leak, and the warm-up must
cover it: the predictor's history (4,096 finished requests), 30 s of step
timeouts in CAF's clock (CAF 0.17 leaves a request's timeout queued after
the answer) and the drift supervisor's window (300 s of outcomes by
default). docs/reliability.md has the figures.

Python 3 standard library only. Examples:

    # The CTest soak (ctest -L soak): 10,000 requests, about 100 s here.
    bench/soak/soak.py --metronome build/metronome --requests 10000 --warmup 6000 \
        --set supervisor.drift.window_s=30
    # Issue 39's bound: 2 MB over 90,000 requests after warm-up (~15 min here).
    bench/soak/soak.py --metronome build/metronome --requests 100000 --warmup 10000 \
        --sample-every 2000 --tolerance-bytes 0 --report /tmp/soak.json
"""

import argparse
import base64
import collections
import http.client
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# -- the request mix -------------------------------------------------------------

# kind -> weight. Output lengths stay short: the soak is about request
# lifecycles, not decoding throughput.
KINDS = {
    "chat": 20,               # POST /v1/chat/completions, whole answer
    "chat_stream": 20,        # the same with stream: true (SSE to [DONE])
    "completion": 10,         # POST /v1/completions, whole answer
    "completion_stream": 5,   # the same, streamed
    "stream_disconnect": 10,  # streaming chat; the client hangs up after the first event
    "ws_chat": 15,            # WebSocket chat, read to `done`
    "ws_cancel": 8,           # WebSocket chat, `cancel` after the first delta
    "ws_disconnect": 7,       # WebSocket chat, the socket closed after the first delta
    "invalid": 5,             # temperature out of range: 400 / WebSocket error event
}

MODEL = "default"
TIMEOUT_S = 60.0
# Output tokens of the requests that run to their end (--max-tokens), and
# of those the client cuts short after the first event (cancel, hang-up):
# enough that they are still running when cut.
TOKENS = 4
CUT_TOKENS = 32


class soak_error(Exception):
    pass


def chat_body(i, max_tokens, stream=False, **extra):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Soak request {i}: say something."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if stream:
        body["stream"] = True
    body.update(extra)
    return body


# -- HTTP ----------------------------------------------------------------------------

_local = threading.local()


def keepalive(host, port):
    """This thread's persistent HTTP connection."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
        _local.conn = conn
    return conn


def post(host, port, path, body):
    """POSTs on the thread's keep-alive connection; returns the response,
    reconnecting once if the server closed an idle connection."""
    for attempt in range(2):
        conn = keepalive(host, port)
        try:
            conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
            return conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            conn.close()
            _local.conn = None
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def http_whole(host, port, path, body):
    resp = post(host, port, path, body)
    data = resp.read()
    if resp.status != 200:
        raise soak_error(f"{path}: HTTP {resp.status}: {data[:200]!r}")
    doc = json.loads(data)
    if not doc.get("choices"):
        raise soak_error(f"{path}: no choices in {data[:200]!r}")


def http_stream(host, port, path, body):
    resp = post(host, port, path, body)
    if resp.status != 200:
        raise soak_error(f"{path} (stream): HTTP {resp.status}: {resp.read()[:200]!r}")
    while True:
        line = resp.readline()
        if not line:
            raise soak_error(f"{path} (stream): ended without [DONE]")
        if line.strip() == b"data: [DONE]":
            break
    resp.read()  # the end of the chunked body: the connection can be reused


def http_invalid(host, port):
    resp = post(host, port, "/v1/chat/completions", chat_body(0, 4, temperature=7))
    data = resp.read()
    if resp.status != 400:
        raise soak_error(f"invalid request: HTTP {resp.status}, expected 400: {data[:200]!r}")


def http_disconnect(host, port, i):
    """A streaming chat on its own connection, closed after the first bytes
    of the event stream: the server must cancel the request."""
    body = json.dumps(chat_body(i, CUT_TOKENS, stream=True)).encode()
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                  b"content-type: application/json\r\ncontent-length: %d\r\n\r\n"
                  % (host.encode(), port, len(body)) + body)
        got = b""
        while b"data:" not in got:
            chunk = s.recv(4096)
            if not chunk:
                raise soak_error("stream_disconnect: the server closed first")
            got += chunk
        if not got.startswith(b"HTTP/1.1 200"):
            raise soak_error(f"stream_disconnect: {got[:100]!r}")


# -- WebSocket (RFC 6455, client side, text frames only) -----------------------------------


class ws_client:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /v1/ws HTTP/1.1\r\nHost: {host}:{port}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise soak_error(f"websocket upgrade refused: {head[:100]!r}")

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise soak_error("websocket: connection closed by the server")
        self.buf += chunk

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[k % 4] for k, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send(self, obj):
        self._send_frame(0x1, json.dumps(obj).encode())

    def recv(self):
        """The next JSON event; answers pings on the way."""
        while True:
            b0, b1 = self._take(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._take(8))[0]
            if b1 & 0x80:
                raise soak_error("websocket: the server masked a frame")
            payload = self._take(n)
            if opcode == 0x9:
                self._send_frame(0xA, payload)
            elif opcode == 0x8:
                raise soak_error(f"websocket: closed by the server: {payload[:100]!r}")
            elif opcode == 0x1:
                return json.loads(payload)

    def close(self):
        try:
            self._send_frame(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        self.sock.close()


def ws_request(host, port, i, kind):
    ws = ws_client(host, port)
    try:
        rid = f"s{i}"
        if kind == "ws_chat":
            msg = chat_body(i, TOKENS)
        elif kind == "invalid":
            msg = chat_body(i, 4, temperature=7)
        else:
            msg = chat_body(i, CUT_TOKENS)
        msg.update({"type": "chat", "id": rid})
        del msg["model"]
        ws.send(msg)
        cancelled = False
        while True:
            ev = ws.recv()
            t = ev.get("type")
            if t == "error":
                if kind == "invalid":
                    return
                raise soak_error(f"websocket {kind}: error event {ev}")
            if t == "delta" and kind == "ws_disconnect":
                ws.sock.close()  # no close frame: the client just goes away
                return
            if t == "delta" and kind == "ws_cancel" and not cancelled:
                ws.send({"type": "cancel", "id": rid})
                cancelled = True
            if t == "done":
                if kind == "invalid":
                    raise soak_error("websocket invalid request: done instead of error")
                if kind == "ws_cancel" and ev.get("finish_reason") not in ("cancelled", "length"):
                    raise soak_error(f"websocket cancel: {ev}")
                return
    finally:
        ws.close()


# -- one request ----------------------------------------------------------------------


def run_one(host, port, i, kind):
    if kind == "chat":
        http_whole(host, port, "/v1/chat/completions", chat_body(i, TOKENS))
    elif kind == "chat_stream":
        http_stream(host, port, "/v1/chat/completions", chat_body(i, TOKENS, stream=True))
    elif kind == "completion":
        http_whole(host, port, "/v1/completions",
                   {"model": MODEL, "prompt": f"Soak {i}:", "max_tokens": TOKENS, "temperature": 0,
                    "ignore_eos": True})
    elif kind == "completion_stream":
        http_stream(host, port, "/v1/completions",
                    {"model": MODEL, "prompt": f"Soak {i}:", "max_tokens": TOKENS, "temperature": 0,
                     "ignore_eos": True, "stream": True})
    elif kind == "stream_disconnect":
        http_disconnect(host, port, i)
    elif kind in ("ws_chat", "ws_cancel", "ws_disconnect"):
        ws_request(host, port, i, kind)
    elif kind == "invalid":
        if i % 2:
            http_invalid(host, port)
        else:
            ws_request(host, port, i, kind)
    else:
        raise AssertionError(kind)


# -- /metrics -------------------------------------------------------------------------

WATCHED = ("metronome:heap_in_use_bytes", "metronome:heap_free_bytes",
           "process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total",
           "metronome:request_actors_alive", "metronome:num_requests_running",
           "metronome:num_requests_waiting")


def scrape(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        text = resp.read().decode()
        if resp.status != 200:
            raise soak_error(f"/metrics: HTTP {resp.status}")
    finally:
        conn.close()
    # Summed over label sets: the engine's gauges carry model_name (one
    # series a served model), the process's none.
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m and m.group(1) in WATCHED:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    missing = [k for k in WATCHED if k not in out]
    if missing:
        raise soak_error(f"/metrics lacks {missing} (a server without the process metrics?)")
    return out


def settled_sample(host, port, limit_s=30.0):
    """Waits until the server holds no request (actors, running, waiting),
    then samples. The disconnects of the last batch may still be on their
    way; a server that never settles is itself a leak of requests."""
    deadline = time.monotonic() + limit_s
    while True:
        m = scrape(host, port)
        idle = (m["metronome:request_actors_alive"] == 0 and m["metronome:num_requests_running"] == 0
                and m["metronome:num_requests_waiting"] == 0)
        if idle:
            time.sleep(0.05)  # the last sinks and sessions end just after their request
            return scrape(host, port)
        if time.monotonic() > deadline:
            raise soak_error(f"the server did not settle within {limit_s} s: {m}")
        time.sleep(0.02)


# -- the server -----------------------------------------------------------------------


def start_server(binary, model, extra, server_log):
    """Starts the server; returns (process, port, recent log lines)."""
    argv = [binary, "serve", "--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL]
    if model:
        argv += ["--model", model]
    argv += extra
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    log = []
    deadline = time.monotonic() + 120
    while port is None:
        line = proc.stdout.readline()
        if not line:
            raise soak_error("metronome serve exited: " + "".join(log[-20:]))
        log.append(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
        if time.monotonic() > deadline:
            proc.kill()
            raise soak_error("metronome serve did not say where it listens")
    # Keep draining its output so it never blocks on a full pipe; keep the
    # last lines for a failure report and all of them in --server-log.
    recent = collections.deque(log, maxlen=200)

    def drain():
        out = open(server_log, "w") if server_log else None
        if out:
            out.writelines(log)
        for line in proc.stdout:
            recent.append(line)
            if out:
                out.write(line)
                out.flush()

    threading.Thread(target=drain, daemon=True).start()
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port, recent
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise soak_error("the server never became healthy")


# -- the run --------------------------------------------------------------------------


def least_squares_slope(xs, ys):
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def main():
    global TOKENS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metronome", help="the metronome binary (starts a server)")
    ap.add_argument("--model", help="model folder (default: the binary's embedded default model)")
    ap.add_argument("--url", help="use a running server instead, e.g. http://127.0.0.1:8080")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="server configuration override (repeatable)")
    ap.add_argument("--requests", type=int, default=10000, help="requests in all (default 10000)")
    ap.add_argument("--warmup", type=int, default=6000,
                    help="requests before the baseline sample (default 6000: the predictor's "
                         "history of 4,096 finished requests fills up by then)")
    ap.add_argument("--sample-every", type=int, default=500,
                    help="requests between heap samples (default 500)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    ap.add_argument("--max-tokens", type=int, default=TOKENS,
                    help=f"output tokens of the requests that run to their end (default {TOKENS})")
    ap.add_argument("--bytes-per-request", type=float, default=2e6 / 90000,
                    help="allowed heap growth per request after warm-up (default 22.2: "
                         "issue 39's 2 MB over 90,000 requests)")
    # Why 256 KiB: with no leak, the heap in use at an idle moment still
    # moves: glibc's per-thread tcache keeps up to 7 freed chunks per size
    # class per thread, which mallinfo2 counts as in use (the server runs
    # about 10 threads); hash tables keep the bucket arrays of their peak
    # size; the drift supervisor's window and CAF's clock hold whatever the
    # last minutes' traffic left. Measured after the fix
    # (docs/reliability.md): peak-to-peak 201 KB over the last 64,000
    # requests of a 100,000-request run, 71 KB after the CI soak's warm-up.
    # A leak of 3 KB per request (issue 39) passes 256 KiB within 90 requests.
    ap.add_argument("--tolerance-bytes", type=float, default=256 * 1024,
                    help="allowance for allocator noise, in bytes (default 262144; 0 for "
                         "issue 39's bound exactly)")
    ap.add_argument("--max-failures", type=int, default=0,
                    help="requests that may fail unexpectedly (default 0)")
    ap.add_argument("--fd-tolerance", type=int, default=16,
                    help="allowed growth of open descriptors after warm-up (default 16)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report", help="write the samples and the verdict as JSON here")
    ap.add_argument("--server-log", help="write the server's output here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    TOKENS = args.max_tokens
    if args.warmup >= args.requests:
        ap.error("--warmup must be below --requests")
    if not args.url and not args.metronome:
        ap.error("give --metronome (to start a server) or --url")
    if args.url and (args.set or args.model or args.server_log):
        ap.error("--set, --model and --server-log need a server started here (--metronome)")

    proc = None
    server_lines = []
    extra = []
    for kv in args.set:
        extra += ["--set", kv]
    if args.url:
        m = re.match(r"^http://([^:/]+):(\d+)/?$", args.url)
        if not m:
            ap.error("--url must look like http://HOST:PORT")
        host, port = m.group(1), int(m.group(2))
    else:
        host = "127.0.0.1"
        try:
            proc, port, server_lines = start_server(args.metronome, args.model, extra,
                                                    args.server_log)
        except soak_error as e:
            print(f"soak: {e}", file=sys.stderr)
            return 2

    rng = random.Random(args.seed)
    names = list(KINDS)
    weights = [KINDS[k] for k in names]
    plan = rng.choices(names, weights, k=args.requests)
    failures = []
    counts = {k: 0 for k in names}
    lock = threading.Lock()

    def job(i):
        kind = plan[i]
        try:
            run_one(host, port, i, kind)
            with lock:
                counts[kind] += 1
        except Exception as e:  # noqa: BLE001 - every failure is recorded and reported
            with lock:
                failures.append(f"#{i} {kind}: {type(e).__name__}: {e}")

    def log(msg):
        if not args.quiet:
            print(msg, flush=True)

    samples = []
    t0 = time.monotonic()
    status = 0
    try:
        first = settled_sample(host, port)
        samples.append({"requests": 0, "t": 0.0, **first})
        # Batch boundaries: every --sample-every requests, and the warm-up's end.
        bounds = sorted(set(list(range(args.sample_every, args.requests, args.sample_every))
                            + [args.warmup, args.requests]))
        done = 0
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            for end in bounds:
                list(pool.map(job, range(done, end)))
                done = end
                m = settled_sample(host, port)
                samples.append({"requests": done, "t": round(time.monotonic() - t0, 3), **m})
                log(f"{done:>7} requests {time.monotonic() - t0:7.1f} s  "
                    f"heap {m['metronome:heap_in_use_bytes'] / 1e6:9.3f} MB  "
                    f"rss {m['process_resident_memory_bytes'] / 1e6:8.1f} MB  "
                    f"fds {int(m['process_open_fds'])}  server cpu {m['process_cpu_seconds_total']:6.1f} s  "
                    f"failures {len(failures)}")
                if len(failures) > args.max_failures:
                    break
    except soak_error as e:
        failures.append(f"soak: {e}")
    finally:
        elapsed = time.monotonic() - t0
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    post = [s for s in samples if s["requests"] >= args.warmup]
    verdict = {"requests": samples[-1]["requests"] if samples else 0, "warmup": args.warmup,
               "seconds": round(elapsed, 1), "failures": len(failures),
               "failure_examples": failures[:10], "kinds": counts}
    if len(post) >= 2:
        base, last = post[0], post[-1]
        measured = last["requests"] - base["requests"]
        heap = "metronome:heap_in_use_bytes"
        rss = "process_resident_memory_bytes"
        growth = last[heap] - base[heap]
        bound = args.bytes_per_request * measured + args.tolerance_bytes
        slope = least_squares_slope([s["requests"] for s in post], [s[heap] for s in post])
        verdict.update({
            "measured_requests": measured,
            "heap_baseline_bytes": base[heap],
            "heap_growth_bytes": growth,
            "heap_growth_bytes_per_request": growth / measured if measured else 0.0,
            "heap_slope_bytes_per_request": slope,
            "heap_spread_bytes": max(s[heap] for s in post) - min(s[heap] for s in post),
            "heap_bound_bytes": bound,
            "rss_growth_bytes": last[rss] - base[rss],
            "rss_growth_bytes_per_request": (last[rss] - base[rss]) / measured if measured else 0.0,
            "fd_growth": last["process_open_fds"] - base["process_open_fds"],
            "heap_growth_ok": growth <= bound,
        })
        log(f"after warm-up: {measured} requests in {elapsed:.0f} s; heap {growth / 1e3:+.1f} KB "
            f"({growth / measured:+.2f} B/request, slope {slope:+.2f} B/request), bound "
            f"{bound / 1e3:.1f} KB; RSS {verdict['rss_growth_bytes'] / 1e6:+.2f} MB; "
            f"fds {verdict['fd_growth']:+.0f}")
        if growth > bound:
            log(f"FAIL: the heap grew by {growth:.0f} bytes, more than the bound of {bound:.0f}")
            status = 1
        if verdict["fd_growth"] > args.fd_tolerance:
            log(f"FAIL: {verdict['fd_growth']:.0f} more descriptors open than after warm-up")
            status = 1
    else:
        log("FAIL: too few samples after the warm-up to measure growth")
        status = 1
    if len(failures) > args.max_failures:
        log(f"FAIL: {len(failures)} requests failed; first ones:")
        for f in failures[:10]:
            log("  " + f)
        status = 1
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w") as f:
            json.dump({"verdict": verdict, "samples": samples, "args": vars(args)}, f, indent=1)
    if status != 0 and server_lines:
        log("last lines of the server's output:")
        for line in list(server_lines)[-30:]:
            log("  " + line.rstrip())
    log("PASS" if status == 0 else "soak failed")
    return status


if __name__ == "__main__":
    sys.exit(main())
