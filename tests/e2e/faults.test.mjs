// Executor faults in the real server (issue 39, item 6), injected with the
// test-only key engine.fault_injection (docs/reliability.md, "Executor
// faults"): every executor's step N + 1 throws, hangs past
// engine.step_timeout_ms, or loses the device. Requests running at the
// fault end with an error their client can read (an SSE error event and
// [DONE], a 500 error body, a WebSocket error event), KV pages return, the
// supervisor restarts the executor and new requests succeed; one failure
// past supervisor.executor.max_restarts leaves the server degraded: /health
// answers 503 with the reason at once and new requests get a quick 503. A
// lost device makes the process exit 75 for its service manager.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import WebSocket from 'ws';

import {
  MODEL_NAME, eventually, metrics, openStream, postJson, sseData, startServer,
} from './lib/harness.mjs';

const LONG = { prompt: 'a long story', max_tokens: 3000, ignore_eos: true, temperature: 0 };

/// A WebSocket chat; `done` resolves to its events once its done/error came.
function openWsChat(server, id, body) {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/ws`);
  const events = [];
  const done = new Promise((resolve, reject) => {
    ws.on('open', () => ws.send(JSON.stringify({ type: 'chat', id, model: MODEL_NAME, ...body })));
    ws.on('message', (data) => {
      const e = JSON.parse(data.toString());
      events.push(e);
      if (e.id === id && (e.type === 'done' || e.type === 'error')) {
        ws.close();
        resolve(events);
      }
    });
    ws.on('error', reject);
  });
  return { done };
}

/// GET /health: { status, body, ms }.
async function health(server) {
  const t0 = Date.now();
  const res = await fetch(`${server.url}/health`);
  return { status: res.status, body: await res.json(), ms: Date.now() - t0 };
}

/// The engine is idle again: no request running or alive, no KV page in use.
async function settled(server) {
  return eventually(async () => {
    const m = await metrics(server);
    return m.get('metronome:num_requests_running') === 0
      && m.get('metronome:request_actors_alive') === 0
      && m.get('metronome:kv_cache_usage_perc') === 0 ? m : null;
  }, 20_000);
}

/// An SSE stream, a non-streaming request and a WebSocket chat, all running
/// when the fault comes: each ends with the engine's error.
async function expectRunningRequestsFail(server, what) {
  const stream = openStream(server, LONG);
  const whole = postJson(server, '/v1/completions', { model: MODEL_NAME, ...LONG });
  const ws = openWsChat(server, 'long', { messages: [{ role: 'user', content: 'a long chat' }],
                                          max_tokens: 3000, ignore_eos: true });

  const s = await stream.done;
  assert.equal(s.status, 200, 'the stream\'s headers were out before the fault');
  const events = sseData(s.body);
  assert.equal(events.at(-1), '[DONE]', s.body.slice(-500));
  const streamError = JSON.parse(events.at(-2)).error;
  assert.equal(streamError?.code, 'engine_failure', s.body.slice(-500));
  assert.equal(streamError.type, 'server_error');
  assert.match(streamError.message, what);

  const w = await whole;
  assert.equal(w.status, 500, w.body);
  const wholeError = JSON.parse(w.body).error;
  assert.equal(wholeError.code, 'engine_failure');
  assert.match(wholeError.message, what);

  const wsEvents = await ws.done;
  const last = wsEvents.at(-1);
  assert.equal(last.type, 'error', JSON.stringify(last));
  assert.equal(last.id, 'long');
  assert.equal(last.error.code, 'engine_failure');
}

/// A short request succeeds (after a restart).
async function expectServing(server) {
  const r = await postJson(server, '/v1/completions',
                           { model: MODEL_NAME, prompt: 'hello', max_tokens: 4, temperature: 0 });
  assert.equal(r.status, 200, r.body);
  assert.equal(JSON.parse(r.body).usage.completion_tokens, 4);
  const h = await health(server);
  assert.equal(h.status, 200, JSON.stringify(h.body));
}

/// One more failure than the budget: degraded, answered at once.
async function expectDegraded(server, what) {
  const h = await eventually(async () => {
    const x = await health(server);
    return x.status === 503 ? x : null;
  }, 20_000);
  assert.ok(h, 'the server never reported degraded');
  assert.equal(h.body.status, 'degraded');
  assert.match(h.body.reason, /failed 2 times within 60 s/);
  assert.match(h.body.reason, what);
  assert.ok((await health(server)).ms < 1_000, '/health is slow while degraded');
  const t0 = Date.now();
  const r = await postJson(server, '/v1/completions',
                           { model: MODEL_NAME, prompt: 'anyone?', max_tokens: 4 });
  const ms = Date.now() - t0;
  assert.equal(r.status, 503, r.body);
  assert.equal(JSON.parse(r.body).error.code, 'unavailable');
  assert.ok(ms < 2_000, `refused after ${ms} ms`);
  const s = openStream(server, { prompt: 'anyone?', max_tokens: 4 });
  const sr = await s.done;
  assert.equal(sr.status, 503, sr.body);
  await settled(server);
}

test('a step that throws: requests fail, pages return, restart, then degraded',
     { timeout: 180_000 }, async () => {
  const server = await startServer(['--set', 'engine.fault_injection=throw_after:400',
                                    '--set', 'supervisor.executor.max_restarts=1']);
  try {
    await expectRunningRequestsFail(server, /injected fault: step 401 of this executor threw/);
    const m = await settled(server);
    assert.ok(m, 'KV pages or requests were left behind');
    assert.equal(m.get('metronome:executor_restarts_total'), 1);
    assert.equal(m.get('metronome:engine_ready'), 1);
    await expectServing(server);
    assert.ok(await server.waitForLog(/restarting \(1 of 1 allowed within 60 s\)/), server.log());

    // The restarted executor fails the same way: past the budget.
    const s = openStream(server, LONG);
    const sr = await s.done;
    assert.match(sseData(sr.body).at(-2), /engine_failure|unavailable/);
    await expectDegraded(server, /threw/);
    assert.equal(server.proc.exitCode, null, 'a degraded server keeps running');
  } finally {
    await server.stop();
  }
});

test('a step that hangs past engine.step_timeout_ms: requests fail, restart, then degraded',
     { timeout: 180_000 }, async () => {
  const server = await startServer(['--set', 'engine.fault_injection=hang_after:400',
                                    '--set', 'engine.step_timeout_ms=1000',
                                    '--set', 'supervisor.executor.max_restarts=1']);
  try {
    const t0 = Date.now();
    await expectRunningRequestsFail(server, /engine step timed out/);
    assert.ok(Date.now() - t0 < 30_000, `the hang was noticed after ${Date.now() - t0} ms`);
    const m = await settled(server);
    assert.ok(m, 'KV pages or requests were left behind');
    assert.equal(m.get('metronome:executor_restarts_total'), 1);
    await expectServing(server);
    assert.ok(await server.waitForLog(/engine step timed out after 1000 ms/), server.log());

    const s = openStream(server, LONG);
    const sr = await s.done;
    assert.equal(sseData(sr.body).at(-1), '[DONE]');
    await expectDegraded(server, /engine step timed out/);
  } finally {
    await server.stop();
  }
});

test('a lost device: requests fail and the process exits 75', { timeout: 120_000 }, async () => {
  const server = await startServer(['--set', 'engine.fault_injection=device_lost_after:200']);
  try {
    const s = openStream(server, LONG);
    const sr = await s.done;
    const events = sseData(sr.body);
    assert.equal(events.at(-1), '[DONE]', sr.body.slice(-500));
    const err = JSON.parse(events.at(-2)).error;
    assert.equal(err.code, 'engine_failure');
    assert.match(err.message, /lost the device/);
    const exit = await server.exited;
    assert.deepEqual(exit, { code: 75, signal: null }, server.log());
    assert.match(server.log(), /device lost/);
  } finally {
    await server.stop();
  }
});

test('fault injection is refused on a non-loopback address', { timeout: 60_000 }, async () => {
  await assert.rejects(startServer(['--set', 'engine.fault_injection=throw_after:1',
                                    '--set', 'server.host=0.0.0.0'], { readyTimeoutMs: 20_000 }),
                       /engine\.fault_injection.*loopback/s);
});
