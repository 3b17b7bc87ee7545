// The WebSocket protocol at /v1/ws (docs/protocol.md) with the `ws` client
// against `metronome serve`: streaming chat, concurrent requests, cancel,
// bad messages, ping, and cancellation when the socket closes.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import WebSocket from 'ws';

import { eventually, metrics, postJson, startServer } from './lib/harness.mjs';

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

/// A connected socket with an event queue: next() resolves the next event.
async function connect() {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/ws`);
  const queue = [];
  const waiters = [];
  ws.on('message', (data, isBinary) => {
    assert.equal(isBinary, false);
    const event = JSON.parse(data.toString());
    const w = waiters.shift();
    if (w)
      w(event);
    else
      queue.push(event);
  });
  await new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  return {
    ws,
    send: (obj) => ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj)),
    next: (timeoutMs = 30_000) => new Promise((resolve, reject) => {
      if (queue.length)
        return resolve(queue.shift());
      const timer = setTimeout(() => reject(new Error('no event in time')), timeoutMs);
      waiters.push((e) => { clearTimeout(timer); resolve(e); });
    }),
    /// Events until the `done`/`error` of `id`.
    async until(id) {
      const events = [];
      for (;;) {
        const e = await this.next();
        events.push(e);
        if (e.id === id && (e.type === 'done' || e.type === 'error'))
          return events;
      }
    },
    close: () => new Promise((resolve) => { ws.once('close', resolve); ws.close(); }),
  };
}

const chat = (id, content, extra = {}) => ({
  type: 'chat', id, messages: [{ role: 'user', content }], temperature: 0, ...extra,
});

const textOf = (events, id) =>
  events.filter((e) => e.type === 'delta' && e.id === id).map((e) => e.text).join('');

describe('websocket protocol', () => {
  test('chat streams deltas, then done with usage and timings', { timeout: 60_000 },
       async () => {
    const c = await connect();
    c.send(chat('r1', 'Tell me about the sea.', { max_tokens: 10 }));
    const events = await c.until('r1');
    const done = events.at(-1);
    assert.equal(done.type, 'done');
    assert.ok(['stop', 'length'].includes(done.finish_reason));
    assert.ok(done.usage.prompt_tokens > 0);
    assert.ok(done.usage.completion_tokens >= 1 && done.usage.completion_tokens <= 10);
    const t = done.timings;
    assert.ok(t.queue_ms >= 0 && t.ttft_ms >= t.queue_ms && t.e2e_ms >= t.ttft_ms,
              JSON.stringify(t));
    // The same request over HTTP gives the same text.
    const http = await postJson(server, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'Tell me about the sea.' }], temperature: 0,
      max_tokens: 10 });
    assert.equal(textOf(events, 'r1'), JSON.parse(http.body).choices[0].message.content);
    await c.close();
  });

  test('logprobs ride on the deltas, one entry per token', { timeout: 60_000 }, async () => {
    const c = await connect();
    c.send(chat('lp', 'Tell me about the sea.',
                { max_tokens: 10, ignore_eos: true, logprobs: true, top_logprobs: 2 }));
    const events = await c.until('lp');
    const done = events.at(-1);
    assert.equal(done.type, 'done', JSON.stringify(done));
    const deltas = events.filter((e) => e.type === 'delta');
    assert.ok(deltas.every((e) => Array.isArray(e.logprobs?.content)), JSON.stringify(deltas[0]));
    const entries = deltas.flatMap((e) => e.logprobs.content);
    assert.equal(entries.length, done.usage.completion_tokens);
    assert.ok(entries.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0));
    assert.equal(Buffer.from(entries.flatMap((e) => e.bytes)).toString('utf8'),
                 textOf(events, 'lp'));
    // Not asked: no logprobs key.
    c.send(chat('plain', 'Tell me about the sea.', { max_tokens: 3 }));
    const plain = await c.until('plain');
    assert.ok(plain.filter((e) => e.type === 'delta').every((e) => !('logprobs' in e)));
    await c.close();
  });

  test('concurrent requests on one socket keep their ids apart', { timeout: 60_000 },
       async () => {
    const c = await connect();
    const ids = ['a', 'b', 'c', 'd'];
    ids.forEach((id, i) => c.send(chat(id, `prompt number ${i}`, { max_tokens: 4 + 3 * i })));
    const events = [];
    const finished = new Set();
    while (finished.size < ids.length) {
      const e = await c.next();
      events.push(e);
      if (e.type === 'done')
        finished.add(e.id);
      assert.notEqual(e.type, 'error', JSON.stringify(e));
    }
    // Each equals the same request run alone on a fresh socket.
    for (const [i, id] of ids.entries()) {
      const solo = await connect();
      solo.send(chat('solo', `prompt number ${i}`, { max_tokens: 4 + 3 * i }));
      assert.equal(textOf(events, id), textOf(await solo.until('solo'), 'solo'));
      await solo.close();
    }
    await c.close();
  });

  test('cancel ends a request with finish_reason cancelled', { timeout: 60_000 }, async () => {
    const c = await connect();
    c.send(chat('long', 'go on and on', { max_tokens: 2000, ignore_eos: true }));
    let first;
    do
      first = await c.next();
    while (first.type !== 'delta');
    c.send({ type: 'cancel', id: 'long' });
    let e;
    do
      e = await c.next();
    while (e.type === 'delta');
    assert.deepEqual(e, { type: 'done', id: 'long', finish_reason: 'cancelled' });
    // The engine let go of it.
    let m;
    const idle = await eventually(async () => {
      m = await metrics(server);
      return m.get('metronome:request_actors_alive') === 0
             && m.get('metronome:kv_cache_usage_perc') === 0;
    });
    assert.ok(idle, `engine still holds the request after cancel: actors ${
      m.get('metronome:request_actors_alive')}, kv ${m.get('metronome:kv_cache_usage_perc')}`);
    // Cancelling it again is an error; the connection stays usable.
    c.send({ type: 'cancel', id: 'long' });
    const err = await c.next();
    assert.equal(err.type, 'error');
    assert.equal(err.error.code, 'unknown_id');
    c.send({ type: 'ping' });
    assert.deepEqual(await c.next(), { type: 'pong' });
    await c.close();
  });

  test('bad messages get error events and the socket stays usable', { timeout: 60_000 },
       async () => {
    const c = await connect();
    c.send('{"type": "chat", oops');
    const e1 = await c.next();
    assert.equal(e1.type, 'error');
    assert.equal(e1.error.code, 'invalid_json');
    c.send({ type: 'teleport', id: 'x' });
    const e2 = await c.next();
    assert.equal(e2.id, 'x');
    assert.equal(e2.error.param, 'type');
    c.send(chat('t', 'hi', { temperature: -1 }));
    const e3 = await c.next();
    assert.equal(e3.id, 't');
    assert.equal(e3.error.param, 'temperature');
    assert.equal(e3.error.type, 'invalid_request_error');
    c.send({ type: 'chat', messages: [{ role: 'user', content: 'no id' }] });
    assert.equal((await c.next()).error.param, 'id');
    c.ws.send(Buffer.from([1, 2, 3]), { binary: true });
    assert.equal((await c.next()).type, 'error');
    c.send({ type: 'ping', id: 'p' });
    assert.deepEqual(await c.next(), { type: 'pong', id: 'p' });
    c.send(chat('ok', 'still works', { max_tokens: 3 }));
    const events = await c.until('ok');
    assert.equal(events.at(-1).type, 'done');
    await c.close();
  });

  test('a duplicate live id is an error and leaves the first alone', { timeout: 60_000 },
       async () => {
    const c = await connect();
    c.send(chat('dup', 'first', { max_tokens: 12, ignore_eos: true }));
    c.send(chat('dup', 'second', { max_tokens: 2 }));
    const events = await c.until('dup');
    // The duplicate's error arrives first (the first request is still
    // running), then the first request finishes normally.
    assert.equal(events.at(-1).type, 'error');
    assert.equal(events.at(-1).error.code, 'duplicate_id');
    const rest = await c.until('dup');
    assert.equal(rest.at(-1).type, 'done');
    assert.equal(rest.at(-1).usage.completion_tokens, 12);
    await c.close();
  });

  test('closing the socket cancels its requests', { timeout: 60_000 }, async () => {
    const c = await connect();
    for (let i = 0; i < 5; ++i)
      c.send(chat(`x${i}`, `keep going ${i}`, { max_tokens: 2000, ignore_eos: true }));
    await c.next();
    c.ws.terminate(); // no close handshake: as if the client crashed
    let m;
    const idle = await eventually(async () => {
      m = await metrics(server);
      return m.get('metronome:request_actors_alive') === 0
             && m.get('metronome:num_requests_running') === 0
             && m.get('metronome:kv_cache_usage_perc') === 0;
    });
    assert.ok(idle, `engine still holds requests after the socket closed: actors ${
      m.get('metronome:request_actors_alive')}, running ${
      m.get('metronome:num_requests_running')}, kv ${m.get('metronome:kv_cache_usage_perc')}`);
  });
});
