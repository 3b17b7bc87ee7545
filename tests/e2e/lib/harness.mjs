// Shared helpers of the end-to-end tests: a tiny model made once by
// `metronome make-model`, `metronome serve` started on a free 127.0.0.1 port
// and stopped again, /metrics parsing, and small HTTP utilities.
//
// Environment (set by tests/e2e/CMakeLists.txt, overridable):
//   METRONOME_BIN       the metronome executable
//   METRONOME_TESTDATA  the shared testdata folder (tokenizers/llama3)
//   METRONOME_WORK_DIR  a scratch folder for the model and logs

import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export const BIN = process.env.METRONOME_BIN;
export const TESTDATA = process.env.METRONOME_TESTDATA;
export const WORK_DIR = process.env.METRONOME_WORK_DIR || path.join(os.tmpdir(), 'metronome-e2e');
export const MODEL_NAME = 'tiny';

if (!BIN || !TESTDATA)
  throw new Error('METRONOME_BIN and METRONOME_TESTDATA must be set (ctest sets them)');

/// The tiny-llama3 model folder, made once per work dir. Concurrent test
/// processes race safely: each writes a private folder and renames it.
export function tinyModel() {
  const dir = path.join(WORK_DIR, 'e2e-tiny-llama3');
  if (fs.existsSync(path.join(dir, 'config.json')))
    return dir;
  fs.mkdirSync(WORK_DIR, { recursive: true });
  const tmp = fs.mkdtempSync(path.join(WORK_DIR, 'e2e-model-'));
  execFileSync(BIN, ['make-model', '--preset', 'tiny-llama3', '--tokenizer',
                     path.join(TESTDATA, 'tokenizers', 'llama3'), '--out', tmp],
               { stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000 });
  try {
    fs.renameSync(tmp, dir);
  } catch {
    fs.rmSync(tmp, { recursive: true, force: true }); // another process won
  }
  return dir;
}

/// A port that was free a moment ago.
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/// Starts `metronome serve` on the tiny model; resolves once /health says
/// 200. `args` are extra command-line arguments (flags, --set key=value);
/// `env` adds environment variables (METRONOME_API_KEY); with `ca` (a PEM
/// certificate) the server speaks TLS and /health is probed over https.
/// `fdLimit` runs it under `ulimit -n fdLimit`. `defaultModel` starts it
/// with neither --model nor --served-model-name: the build's default model;
/// `model` (a folder) serves that one instead of the tiny model.
/// The result's `exited` resolves to { code, signal } when the process has
/// ended and its output has all been read; `log()` is stdout and stderr
/// together (the last 100-200 kB), `stdout()` and `stderr()` each whole;
/// `waitForLog(re)` resolves to whether the log matches `re` within 15 s
/// (the output comes through pipes: a line the server wrote before it
/// answered a request may reach this process after the answer).
export async function startServer(args = [],
                                  { readyTimeoutMs = 90_000, fdLimit, env = {}, ca,
                                    defaultModel = false, model: modelDir } = {}) {
  const model = defaultModel ? null : (modelDir ?? tinyModel());
  let lastError;
  for (let attempt = 0; attempt < 3; ++attempt) {
    const port = await freePort();
    const argv = ['serve', ...(model ? ['--model', model, '--served-model-name', MODEL_NAME] : []),
                  '--host', '127.0.0.1', '--port', String(port), ...args];
    const options = { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } };
    const proc = fdLimit === undefined
      ? spawn(BIN, argv, options)
      // exec: the pid is the server's, so signals reach it.
      : spawn('/bin/sh', ['-c', `ulimit -n ${Number(fdLimit)} && exec "$0" "$@"`, BIN, ...argv],
              options);
    let log = '';
    const streams = { stdout: '', stderr: '' };
    const keep = (name) => (chunk) => {
      const text = chunk.toString();
      streams[name] += text;
      log += text;
      if (log.length > 200_000)
        log = log.slice(-100_000);
    };
    proc.stdout.on('data', keep('stdout'));
    proc.stderr.on('data', keep('stderr'));
    let exited = null;
    // 'close', not 'exit': the pipes are read to their end.
    const exitedPromise = new Promise((resolve) => proc.on('close', (code, signal) => {
      exited = { code, signal };
      resolve(exited);
    }));
    const url = `${ca ? 'https' : 'http'}://127.0.0.1:${port}`;
    const deadline = Date.now() + readyTimeoutMs;
    while (Date.now() < deadline && !exited) {
      try {
        const res = ca ? await tlsRequest({ port, ca, path: '/health' })
                       : await fetch(`${url}/health`);
        if (!ca)
          await res.arrayBuffer();
        if (res.status === 200) {
          return {
            port, url, baseURL: `${url}/v1`, proc, exited: exitedPromise,
            log: () => log,
            stdout: () => streams.stdout,
            stderr: () => streams.stderr,
            waitForLog: async (re, timeoutMs = 15_000) =>
              Boolean(await eventually(() => re.test(log), timeoutMs)),
            async stop() { await stopProcess(proc); },
          };
        }
      } catch { /* not listening yet */ }
      await sleep(50);
    }
    await stopProcess(proc);
    lastError = new Error(`metronome serve did not become healthy (${JSON.stringify(exited)}):\n` +
                          `${BIN} ${argv.join(' ')}\n${log}`);
    if (!/address already in use|bind/i.test(log))
      break; // only a lost port race is worth another try
  }
  throw lastError;
}

/// SIGTERM, then SIGKILL after 10 s.
export async function stopProcess(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null)
    return;
  const done = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
  await done;
  clearTimeout(timer);
}

/// Prometheus text -> Map: each name to its value summed over all label
/// sets, and each series as written ('name{label="v"}') to its own value.
export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#'))
      continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m)
      continue;
    const value = Number(m[3]);
    out.set(m[1], (out.get(m[1]) ?? 0) + value);
    if (m[2])
      out.set(m[1] + m[2], value);
  }
  return out;
}

export async function metrics(server) {
  const res = await fetch(`${server.url}/metrics`);
  if (res.status !== 200)
    throw new Error(`/metrics answered ${res.status}`);
  return parseMetrics(await res.text());
}

/// Polls `fn` until it returns a truthy value or `timeoutMs` passes;
/// returns the last value.
export async function eventually(fn, timeoutMs = 15_000, everyMs = 50) {
  const deadline = Date.now() + timeoutMs;
  let value;
  for (;;) {
    value = await fn();
    if (value || Date.now() > deadline)
      return value;
    await sleep(everyMs);
  }
}

/// Sends one request with `send` (http.request or https.request) and
/// resolves to { status, headers, body }.
function requestWith(send, options, body) {
  return new Promise((resolve, reject) => {
    const req = send({ ...options, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers,
                                    body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (body !== undefined)
      req.write(body);
    req.end();
  });
}

/// One HTTP request with node:http (no retries, no pooling): resolves to
/// { status, headers, body }.
export function rawRequest(server, { method = 'GET', path: p = '/', headers = {}, body } = {}) {
  return requestWith(http.request, { host: '127.0.0.1', port: server.port, method, path: p, headers },
                     body);
}

/// One HTTPS request trusting only `ca` (server name: localhost); same
/// result shape as rawRequest.
export function tlsRequest({ port, ca, method = 'GET', path: p = '/', headers = {}, body }) {
  return requestWith(https.request, { host: '127.0.0.1', servername: 'localhost', port, method,
                                      path: p, headers, ca }, body);
}

/// POSTs JSON; same result shape as rawRequest.
export function postJson(server, p, obj, headers = {}) {
  const body = typeof obj === 'string' ? obj : JSON.stringify(obj);
  return rawRequest(server, { method: 'POST', path: p, body,
                              headers: { 'content-type': 'application/json', ...headers } });
}

/// The `data:` payloads of an SSE body.
export function sseData(body) {
  return body.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
}

/// A deterministic pseudo-random generator (mulberry32).
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/// A streaming completion over its own connection. `started` resolves at
/// its first chunk, `done` to { status, body } at its end; `events()` counts
/// the SSE events so far.
export function openStream(server, body) {
  let text = '';
  let first;
  const started = new Promise((resolve) => { first = resolve; });
  const done = new Promise((resolve, reject) => {
    const payload = JSON.stringify({ model: MODEL_NAME, stream: true, ...body });
    const req = http.request({
      host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/completions', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) },
    }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (chunk) => { text += chunk; first(); });
      res.on('end', () => resolve({ status: res.statusCode, body: text }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(payload);
  });
  return { started, done, events: () => sseData(text).length };
}
