#!/usr/bin/env python3
"""Debian's real Prometheus scrapes a real `metronome serve` (CPU, the
default model) with tools/monitoring/prometheus.yml, and answers queries:
the TTFT P95 over the requests just sent, the model_name label (the
served model's name, as vLLM's) on the per-request series, the build info,
and every expression of tools/monitoring/grafana-dashboard.json, its
$model_name variable set to the served model, without an error.

    prometheus_check.py METRONOME SOURCE_DIR WORK_DIR
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def wait_for(what, fn, seconds):
    deadline = time.time() + seconds
    while True:
        try:
            value = fn()
            if value:
                return value
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"prometheus_check: timed out waiting for {what}")
        time.sleep(0.25)


def main():
    metronome, source, work = sys.argv[1:4]
    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("prometheus_check: Debian's prometheus is not installed (tools/build.sh installs it)")
        return 1
    shutil.rmtree(work, ignore_errors=True) # no series of an earlier run
    os.makedirs(work)
    port = free_port()
    prom_port = free_port()
    while prom_port == port:
        prom_port = free_port()
    # The committed configuration, pointed at this server and scraping fast.
    with open(os.path.join(source, "tools/monitoring/prometheus.yml")) as f:
        config = f.read()
    if '"127.0.0.1:8080"' not in config:
        print("prometheus_check: tools/monitoring/prometheus.yml no longer has its example target")
        return 1
    config = config.replace('"127.0.0.1:8080"', f'"127.0.0.1:{port}"')
    config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
    config_path = os.path.join(work, "prometheus.yml")
    with open(config_path, "w") as f:
        f.write(config)
    procs = []
    try:
        server = subprocess.Popen([metronome, "serve", "--port", str(port)],
                                  stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(work, "serve.log"), "w"))
        procs.append(server)
        prom = subprocess.Popen([prometheus, f"--config.file={config_path}",
                                 f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(work, "prometheus.log"), "w"))
        procs.append(prom)
        base = f"http://127.0.0.1:{port}"
        wait_for("the server", lambda: get(base + "/health")[0] == 200, 60)
        model = json.loads(get(base + "/v1/models")[1])["data"][0]["id"]
        papi = f"http://127.0.0.1:{prom_port}/api/v1/query?query="

        def query(expr):
            status, raw = get(papi + urllib.parse.quote(expr))
            doc = json.loads(raw)
            if doc.get("status") != "success":
                raise SystemExit(f"prometheus_check: {expr}: {doc}")
            return doc["data"]["result"]

        # Rates need the counters before the requests too: the first scrape
        # comes first.
        wait_for("Prometheus's first scrape of the server",
                 lambda: any(r["value"][1] == "1"
                             for r in query(f'up{{instance="127.0.0.1:{port}"}}')), 60)
        for i in range(12):
            body = json.dumps({"messages": [{"role": "user", "content": f"Tell me of ships, {i}."}],
                               "max_tokens": 12}).encode()
            req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                assert r.status == 200
        ttft = "histogram_quantile(0.95, sum by (le) (rate(metronome:time_to_first_token_seconds_bucket[30s])))"

        def ttft_value():
            r = query(ttft)
            if r and math.isfinite(float(r[0]["value"][1])) and float(r[0]["value"][1]) > 0:
                return float(r[0]["value"][1])
            return None

        p95 = wait_for("a scraped TTFT P95", ttft_value, 60)
        print(f"TTFT P95 from Prometheus: {p95 * 1e3:.1f} ms")
        try: # a path the API does not have: counted as route "other"
            get(base + "/no/such/path")
        except urllib.error.HTTPError as e:
            assert e.code == 404, e.code

        def responses():
            ok = query('metronome:http_responses_total{route="/v1/chat/completions",status="200"}')
            other = query('metronome:http_responses_total{route="other",status="404"}')
            return ok and other and float(ok[0]["value"][1]) >= 12 and float(other[0]["value"][1]) >= 1

        wait_for("the HTTP response counters (12 chats answered 200, one 404)", responses, 30)
        # vLLM's label, on every series of the metrics vLLM labels with it.
        labelled = ("time_to_first_token_seconds_count|inter_token_latency_seconds_count|"
                    "e2e_request_latency_seconds_count|request_queue_time_seconds_count|"
                    "request_prompt_tokens_count|request_generation_tokens_count|"
                    "prompt_tokens_total|generation_tokens_total|request_success_total|"
                    "num_requests_running|num_requests_waiting|kv_cache_usage_perc")
        mine = query(f'{{__name__=~"metronome:({labelled})",model_name={json.dumps(model)}}}')
        names = {r["metric"]["__name__"] for r in mine}
        if len(names) != len(labelled.split("|")):
            print(f"prometheus_check: series labelled model_name={model!r}: {sorted(names)}")
            return 1
        others = query(f'{{__name__=~"metronome:({labelled})",model_name!={json.dumps(model)}}}')
        if others:
            print(f"prometheus_check: series without model_name={model!r}: {others}")
            return 1
        print(f"{len(names)} per-request and engine metrics labelled model_name={model!r}")
        info = query("metronome:build_info")
        if not info or info[0]["value"][1] != "1":
            print(f"prometheus_check: metronome:build_info: {info}")
            return 1
        with open(os.path.join(source, "tools/monitoring/grafana-dashboard.json")) as f:
            dash = json.load(f)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        if not any("$model_name" in e for e in exprs):
            print("prometheus_check: no dashboard expression selects $model_name")
            return 1
        # Grafana puts the value in a =~ selector; this name has no regex
        # characters but '.', which matches itself too.
        if not all(c.isalnum() or c in "._-" for c in model):
            print(f"prometheus_check: served model name {model!r} is no plain name")
            return 1
        empty = []
        for e in exprs:
            if not query(e.replace("$__rate_interval", "30s").replace("$model_name", model)):
                empty.append(e)
        # Rates of events that did not happen (errors, cancellations, prefix
        # hits with no queries) may be empty; the latency panels may not.
        must = [e for e in empty if "time_to_first_token" in e or "inter_token" in e
                or "e2e_request" in e or "sampled_tokens" in e]
        if must:
            print("prometheus_check: empty dashboard series:\n  " + "\n  ".join(must))
            return 1
        print(f"{len(exprs)} dashboard expressions evaluate ({len(empty)} empty: no such events)")
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
