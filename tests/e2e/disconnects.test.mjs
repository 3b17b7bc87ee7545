// 1,000 requests, many of whose clients hang up at random moments (before
// the answer starts, mid-stream, while a non-streaming answer is being
// generated; over HTTP and WebSocket). Afterwards the engine must hold zero
// KV pages and zero request actors, run and queue nothing, and still serve.

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import WebSocket from 'ws';

import { MODEL_NAME, eventually, metrics, postJson, rawRequest, rng,
         startServer } from './lib/harness.mjs';

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

const TOTAL = 1000;
const CONCURRENCY = 48;

/// One HTTP request that may be abandoned: `plan.abortAfterMs` (a timer
/// from the start) or `plan.abortAfterChunks` (after that many body
/// chunks). Resolves to what happened.
function httpRequest(plan) {
  return new Promise((resolve) => {
    const body = JSON.stringify(plan.body);
    let chunks = 0;
    let settled = false;
    const finish = (outcome) => {
      if (!settled) {
        settled = true;
        resolve(outcome);
      }
    };
    const req = http.request({
      host: '127.0.0.1', port: server.port, method: 'POST', path: plan.path, agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      res.on('data', () => {
        chunks += 1;
        if (plan.abortAfterChunks !== undefined && chunks >= plan.abortAfterChunks) {
          req.destroy();
          finish('aborted');
        }
      });
      res.on('end', () => finish(res.statusCode === 200 ? 'completed' : `status ${res.statusCode}`));
      res.on('error', () => finish('aborted'));
    });
    req.on('error', () => finish('aborted'));
    if (plan.abortAfterMs !== undefined)
      setTimeout(() => { req.destroy(); finish('aborted'); }, plan.abortAfterMs);
    req.end(body);
  });
}

/// One WebSocket request; the socket is dropped (no close handshake) after
/// `dropAfterEvents` events, or it runs to its end.
function wsRequest(plan) {
  return new Promise((resolve) => {
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/ws`);
    let events = 0;
    const done = (outcome) => { ws.terminate(); resolve(outcome); };
    ws.on('open', () => ws.send(JSON.stringify({ type: 'chat', id: 'r', ...plan.body })));
    ws.on('message', (data) => {
      events += 1;
      const e = JSON.parse(data.toString());
      if (e.type === 'done' || e.type === 'error')
        return done(e.type === 'done' ? 'completed' : 'error');
      if (plan.dropAfterEvents !== undefined && events >= plan.dropAfterEvents)
        done('aborted');
    });
    ws.on('error', () => done('aborted'));
  });
}

function makePlans() {
  const r = rng(1000);
  const plans = [];
  for (let i = 0; i < TOTAL; ++i) {
    const max_tokens = 1 + Math.floor(r() * 40);
    const stream = r() < 0.6;
    const chat = r() < 0.5;
    const body = chat
      ? { model: MODEL_NAME, messages: [{ role: 'user', content: `message ${i} ${'x'.repeat(i % 50)}` }],
          max_tokens, temperature: r() < 0.5 ? 0 : 0.8, seed: i, ignore_eos: r() < 0.5, stream }
      : { model: MODEL_NAME, prompt: `prompt ${i} ${'y '.repeat(i % 80)}`, max_tokens,
          temperature: 0.7, seed: i, stream };
    const plan = { kind: 'http', path: chat ? '/v1/chat/completions' : '/v1/completions', body };
    const u = r();
    if (i % 10 === 5) {
      // Long requests whose client always leaves early: only cancellation
      // frees them in time (3000 tokens each would take minutes).
      body.max_tokens = 3000;
      body.ignore_eos = true;
      body.stream = true;
      plan.abortAfterChunks = 2;
      plan.long = true;
    } else if (i % 10 === 0) {
      plan.kind = 'ws';
      delete body.stream;
      body.messages ??= [{ role: 'user', content: body.prompt }];
      delete body.prompt;
      if (u < 0.6)
        plan.dropAfterEvents = 1 + Math.floor(r() * 5);
    } else if (u < 0.25) {
      plan.abortAfterMs = Math.floor(r() * 30); // often before the first token
    } else if (u < 0.55 && stream) {
      plan.abortAfterChunks = 1 + Math.floor(r() * 4); // mid-stream
    } else if (u < 0.65) {
      plan.abortAfterMs = 20 + Math.floor(r() * 200); // while generating
    }
    plans.push(plan);
  }
  return plans;
}

const CANCELLED = 'metronome:request_cancelled_total';

test('1000 requests with random disconnects leave nothing behind', { timeout: 300_000 },
     async () => {
  const plans = makePlans();
  const cancelledBefore = (await metrics(server)).get(CANCELLED) ?? 0;
  const outcomes = new Map();
  let next = 0;
  const worker = async () => {
    while (next < plans.length) {
      const plan = plans[next++];
      const outcome = plan.kind === 'ws' ? await wsRequest(plan) : await httpRequest(plan);
      outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const summary = JSON.stringify(Object.fromEntries(outcomes));
  console.log(`outcomes: ${summary}`);
  assert.ok((outcomes.get('aborted') ?? 0) >= 200, summary);
  assert.ok((outcomes.get('completed') ?? 0) >= 200, summary);
  for (const key of outcomes.keys())
    assert.ok(['aborted', 'completed'].includes(key), `unexpected outcome ${key}: ${summary}`);

  // Everything the engine held for those requests is released.
  let last;
  const clean = await eventually(async () => {
    last = await metrics(server);
    return last.get('metronome:kv_cache_usage_perc') === 0
        && last.get('metronome:request_actors_alive') === 0
        && last.get('metronome:num_requests_running') === 0
        && last.get('metronome:num_requests_waiting') === 0;
  }, 30_000);
  assert.ok(clean, `engine not idle after the run: ${JSON.stringify(Object.fromEntries(
    [...last].filter(([k]) => /kv_cache_usage|actors_alive|requests_(running|waiting)/.test(k))))}`);

  // Every long request was cancelled, not run to its end.
  const longOnes = plans.filter((p) => p.long).length;
  assert.ok((last.get(CANCELLED) ?? 0) - cancelledBefore >= longOnes,
            `cancelled ${(last.get(CANCELLED) ?? 0) - cancelledBefore}, expected >= ${longOnes}`);

  // And healthy: /health, and a request that runs to its end.
  const health = await rawRequest(server, { path: '/health' });
  assert.equal(health.status, 200);
  const res = await postJson(server, '/v1/completions',
                             { model: MODEL_NAME, prompt: 'after the storm', max_tokens: 8,
                               temperature: 0 });
  assert.equal(res.status, 200, res.body);
  assert.equal(JSON.parse(res.body).choices.length, 1);
});
