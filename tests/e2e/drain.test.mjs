// Graceful drain of the real server (issue 39, item 3). On SIGTERM,
// `metronome serve` refuses new connections, answers /health on a
// connection already open with 503 "draining", lets a short stream finish,
// ends a long one at server.drain_timeout_s with an error event and [DONE]
// (SSE) or an error event and close code 1001 (WebSocket), answers a
// non-streaming request still running with a 503 error body, and exits 0.
// A second signal exits at once with 128 + its number.

import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { test } from 'node:test';

import WebSocket from 'ws';

import {
  MODEL_NAME, eventually, openStream, postJson, sleep, sseData, startServer,
} from './lib/harness.mjs';

const DRAIN_TIMEOUT_S = 3;

/// A WebSocket chat; `started` resolves at its first delta, `done` to
/// { events, closeCode } once the server closes.
function openWsChat(server, body) {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/ws`);
  const events = [];
  let first;
  const started = new Promise((resolve) => { first = resolve; });
  const done = new Promise((resolve, reject) => {
    ws.on('open', () => ws.send(JSON.stringify({ type: 'chat', id: 'long', model: MODEL_NAME,
                                                 ...body })));
    ws.on('message', (data) => {
      events.push(JSON.parse(data.toString()));
      first();
    });
    ws.on('close', (code) => resolve({ events, closeCode: code }));
    ws.on('error', reject);
  });
  return { started, done };
}

/// 'connected' or the connect error's code (ECONNREFUSED once the server
/// no longer listens).
function tryConnect(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => { s.destroy(); resolve('connected'); });
    s.once('error', (e) => resolve(e.code));
  });
}

/// GET /health through `agent`; also says whether a pooled socket carried it.
function health(server, agent) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port: server.port, path: '/health', agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode, body, reused: req.reusedSocket }));
    });
    req.on('error', reject);
  });
}

test('SIGTERM drains: short streams finish, long ones end with an error, exit 0',
     { timeout: 120_000 }, async () => {
  const server = await startServer(['--set', `server.drain_timeout_s=${DRAIN_TIMEOUT_S}`]);
  try {
    // A keep-alive connection opened before the signal, to ask /health on.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    assert.equal((await health(server, agent)).status, 200);

    const long = { prompt: 'a long story', max_tokens: 3000, ignore_eos: true, temperature: 0 };
    const whole = postJson(server, '/v1/completions', { model: MODEL_NAME, ...long });
    const longStream = openStream(server, long);
    const ws = openWsChat(server, { messages: [{ role: 'user', content: 'a long chat' }],
                                    max_tokens: 3000, ignore_eos: true });
    await Promise.all([longStream.started, ws.started]);
    const SHORT_TOKENS = 60;
    const short = openStream(server, { prompt: 'a short one', max_tokens: SHORT_TOKENS,
                                       ignore_eos: true, temperature: 0 });
    await short.started;

    const shortEventsAtSignal = short.events();
    const t0 = Date.now();
    server.proc.kill('SIGTERM');

    // New connections are refused at once.
    assert.equal(await eventually(async () => (await tryConnect(server.port)) === 'ECONNREFUSED',
                                  5_000),
                 true, 'the server still accepts connections while draining');
    // /health on the connection opened before says draining.
    const h = await health(server, agent);
    assert.equal(h.reused, true, 'the /health request did not reuse the open connection');
    assert.equal(h.status, 503);
    assert.equal(JSON.parse(h.body).status, 'draining');

    // The short stream was under way at the signal and finishes cleanly.
    assert.ok(shortEventsAtSignal < SHORT_TOKENS + 1,
              `the short stream had already finished (${shortEventsAtSignal} events)`);
    const s = await short.done;
    assert.equal(s.status, 200);
    const sEvents = sseData(s.body);
    assert.equal(sEvents.at(-1), '[DONE]');
    assert.equal(JSON.parse(sEvents.at(-2)).choices[0].finish_reason, 'length', s.body.slice(-500));
    assert.ok(!s.body.includes('shutting_down'));

    // The long stream is ended at the drain timeout: an error event, then [DONE].
    const l = await longStream.done;
    const cutAfterMs = Date.now() - t0;
    assert.equal(l.status, 200);
    const lEvents = sseData(l.body);
    assert.equal(lEvents.at(-1), '[DONE]', l.body.slice(-500));
    const error = JSON.parse(lEvents.at(-2)).error;
    assert.equal(error?.code, 'shutting_down', l.body.slice(-500));
    assert.equal(error.type, 'service_unavailable_error');
    assert.ok(lEvents.length > 2, 'the long stream was cut before it started');
    assert.ok(cutAfterMs >= DRAIN_TIMEOUT_S * 1000 - 500 && cutAfterMs < 15_000,
              `cut after ${cutAfterMs} ms`);

    // The non-streaming request still running gets an OpenAI-style 503.
    const w = await whole;
    assert.equal(w.status, 503, w.body);
    assert.equal(JSON.parse(w.body).error.code, 'shutting_down');
    assert.equal(w.headers['retry-after'], '1');

    // The WebSocket request: an error event for its id, then close 1001.
    const { events, closeCode } = await ws.done;
    const last = events.at(-1);
    assert.equal(last.type, 'error', JSON.stringify(last));
    assert.equal(last.id, 'long');
    assert.equal(last.error.code, 'shutting_down');
    assert.equal(closeCode, 1001);

    const exit = await server.exited;
    assert.deepEqual(exit, { code: 0, signal: null }, server.log());
    assert.match(server.log(), /draining/);
    assert.match(server.log(), /drain timeout: ending \d+ requests still running/);
    agent.destroy();
  } finally {
    await server.stop();
  }
});

test('a second signal exits at once', { timeout: 60_000 }, async () => {
  const server = await startServer(['--set', 'server.drain_timeout_s=60']);
  try {
    const stream = openStream(server, { prompt: 'x', max_tokens: 3000, ignore_eos: true });
    // Cut without an answer: that is the point of the second signal.
    const cut = stream.done.catch((e) => e);
    await stream.started;
    server.proc.kill('SIGINT');
    assert.ok(await eventually(() => /draining/.test(server.log()), 10_000), server.log());
    const t0 = Date.now();
    server.proc.kill('SIGTERM');
    const exit = await server.exited;
    assert.ok(Date.now() - t0 < 5_000, `exit took ${Date.now() - t0} ms`);
    assert.deepEqual(exit, { code: 128 + 15, signal: null }, server.log());
    await cut;
  } finally {
    await server.stop();
  }
});

test('an idle server drains at once and exits 0', { timeout: 60_000 }, async () => {
  const server = await startServer();
  try {
    await sleep(100);
    const t0 = Date.now();
    server.proc.kill('SIGTERM');
    const exit = await server.exited;
    assert.deepEqual(exit, { code: 0, signal: null }, server.log());
    assert.ok(Date.now() - t0 < 5_000, `exit took ${Date.now() - t0} ms`);
  } finally {
    await server.stop();
  }
});
