// Logs an operator can use (issue 37, item 3) from the real server: one
// access line per request on stderr (answered, failed, refused, cancelled
// over HTTP and the WebSocket) with its route, status, tokens, TTFT, e2e
// and finish reason or error code; `--log-format json` makes every stderr
// line a JSON object; the stats line comes while the engine works; prompts
// and outputs are never logged unless logging.log_prompts asks.

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';

import WebSocket from 'ws';

import { MODEL_NAME, eventually, postJson, rawRequest, sleep, startServer }
  from './lib/harness.mjs';

const SECRET = 'zebra-violet-prompt-7731';

/// Opens /v1/ws; resolves to { ws, next(), send() }.
async function openWs(server) {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/ws`);
  const queue = [];
  const waiters = [];
  ws.on('message', (data) => {
    const e = JSON.parse(data.toString());
    const w = waiters.shift();
    if (w) w(e); else queue.push(e);
  });
  await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
  return {
    ws,
    send: (o) => ws.send(JSON.stringify(o)),
    next: () => new Promise((resolve) => (queue.length ? resolve(queue.shift()) : waiters.push(resolve))),
  };
}

/// A streaming completion abandoned after its first chunk.
function abandonedStream(server) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ model: MODEL_NAME, prompt: 'Once', max_tokens: 3000,
                                  stream: true, seed: 3 });
    const req = http.request({
      host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/completions', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => res.once('data', () => { req.destroy(); resolve(); }));
    req.on('error', () => resolve());
    req.end(body);
  });
}

/// Runs the same mix of requests against `server`: returns what it expects
/// to find in the access lines.
async function runMix(server) {
  const chat = await postJson(server, '/v1/chat/completions', {
    model: MODEL_NAME, max_tokens: 5, seed: 1,
    messages: [{ role: 'user', content: `Say ${SECRET}` }] });
  assert.equal(chat.status, 200);
  const bad = await postJson(server, '/v1/chat/completions', {
    model: MODEL_NAME, temperature: 7, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(bad.status, 400);
  assert.equal((await rawRequest(server, { path: '/nope' })).status, 404);
  await abandonedStream(server);

  const c = await openWs(server);
  c.send({ type: 'chat', id: 'ok\nFORGED access line', max_tokens: 4, seed: 2,
           messages: [{ role: 'user', content: SECRET }] });
  for (let e = await c.next(); e.type !== 'done'; e = await c.next());
  c.send({ type: 'chat', id: 'long', max_tokens: 3000, seed: 3,
           messages: [{ role: 'user', content: 'Tell a long story.' }] });
  assert.equal((await c.next()).type, 'delta');
  c.send({ type: 'cancel', id: 'long' });
  for (let e = await c.next(); e.type !== 'done'; e = await c.next());
  c.send({ type: 'chat', id: 'hot', temperature: 9, messages: [{ role: 'user', content: 'x' }] });
  assert.equal((await c.next()).type, 'error');
  await new Promise((resolve) => { c.ws.once('close', resolve); c.ws.close(); });
  return JSON.parse(chat.body).id;
}

describe('text logs (the default)', () => {
  let server;
  let chatId;

  before(async () => {
    server = await startServer();
    chatId = await runMix(server);
  });
  after(async () => { await server?.stop(); });

  test('one access line per request, on stderr', { timeout: 60_000 }, async () => {
    const lines = () => server.stderr().split('\n').filter((l) => / access /.test(l));
    // The abandoned stream's line comes once the server sees the reset.
    await eventually(() => lines().length >= 8);
    const all = lines();
    const ok = all.filter((l) => l.includes(`request_id=${chatId} `));
    assert.equal(ok.length, 1, all.join('\n'));
    assert.match(ok[0], /^\[[\d-]+ [\d:.]+\] \[info\] access method=POST route=\/v1\/chat\/completions status=200 client=127\.0\.0\.1 request_id=chatcmpl-\S+ prompt_tokens=\d+ output_tokens=5 (cached_tokens=\d+ )?ttft_ms=[\d.]+ e2e_ms=[\d.]+ finish_reason=length$/);
    assert.equal(all.filter((l) => /route=\/v1\/chat\/completions status=400 .* error=invalid_value$/.test(l)).length, 1);
    assert.equal(all.filter((l) => /method=GET route=\/nope status=404 .*error=not_found$/.test(l)).length, 1);
    assert.equal(all.filter((l) => /route=\/v1\/completions status=200 .* finish_reason=cancelled$/.test(l)).length, 1, all.join('\n'));
    assert.equal(all.filter((l) => /method=GET route=\/v1\/ws status=101 /.test(l)).length, 1);
    // WebSocket chats: one line each, the client's id escaped.
    assert.equal(all.filter((l) => /method=WS route=\/v1\/ws status=200 .* ws_id="ok\\nFORGED access line" .* output_tokens=4 .* finish_reason=length$/.test(l)).length, 1, all.join('\n'));
    assert.equal(all.filter((l) => /method=WS .* ws_id=long .* finish_reason=cancelled$/.test(l)).length, 1);
    assert.equal(all.filter((l) => /method=WS .* status=400 .* ws_id=hot .* error=invalid_value$/.test(l)).length, 1);
    assert.ok(!server.stderr().split('\n').some((l) => l.startsWith('FORGED')));
    // Nothing of the sort on stdout, which keeps the banner only.
    assert.ok(!/ access /.test(server.stdout()));
    // Health probes are not logged at info.
    assert.ok(!all.some((l) => l.includes('route=/health')));
  });

  test('prompts and outputs are not logged', () => {
    assert.ok(!server.log().includes(SECRET));
    assert.ok(!/ prompt=| output=/.test(server.log()));
  });
});

describe('--log-format json', () => {
  let server;
  let chatId;

  before(async () => {
    server = await startServer(['--log-format', 'json', '--set', 'logging.stats_interval_s=0.2',
                                '--set', 'logging.log_prompts=true']);
    chatId = await runMix(server);
  });
  after(async () => { await server?.stop(); });

  test('every stderr line is a JSON object; access lines carry fields', { timeout: 60_000 },
       async () => {
    const events = () => server.stderr().split('\n').filter((l) => l).map((l) => JSON.parse(l));
    await eventually(() => events().filter((e) => e.event === 'access').length >= 8);
    const all = events();
    for (const e of all) {
      assert.match(e.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
      assert.ok(['trace', 'debug', 'info', 'warning', 'error', 'critical'].includes(e.level));
      assert.ok(e.event || typeof e.msg === 'string');
    }
    const access = all.filter((e) => e.event === 'access');
    const ok = access.find((e) => e.request_id === chatId);
    assert.equal(ok.level, 'info');
    assert.equal(ok.method, 'POST');
    assert.equal(ok.route, '/v1/chat/completions');
    assert.equal(ok.status, 200);
    assert.equal(ok.output_tokens, 5);
    assert.ok(ok.prompt_tokens > 0);
    assert.ok(ok.ttft_ms > 0 && ok.e2e_ms >= ok.ttft_ms);
    assert.equal(ok.finish_reason, 'length');
    // logging.log_prompts: the prompt and the output are there.
    assert.ok(ok.prompt.includes(SECRET));
    assert.equal(typeof ok.output, 'string');
    const bad = access.find((e) => e.status === 400 && e.route === '/v1/chat/completions');
    assert.equal(bad.error, 'invalid_value');
    const ws = access.find((e) => e.ws_id === 'ok\nFORGED access line');
    assert.equal(ws.method, 'WS');
    assert.equal(ws.output_tokens, 4);
    assert.equal(access.find((e) => e.ws_id === 'long').finish_reason, 'cancelled');
    const abandoned = access.find((e) => e.route === '/v1/completions');
    assert.equal(abandoned.finish_reason, 'cancelled');
    assert.ok(abandoned.output_tokens >= 1);
  });

  test('the stats line comes while the engine works', { timeout: 60_000 }, async () => {
    const stats = () => server.stderr().split('\n').filter((l) => l.includes('"event":"stats"'))
      .map((l) => JSON.parse(l));
    const before = stats().length;
    const c = await openWs(server);
    c.send({ type: 'chat', id: 's', max_tokens: 2000, seed: 5,
             messages: [{ role: 'user', content: 'Go.' }] });
    assert.equal((await c.next()).type, 'delta');
    const seen = await eventually(() => stats().length > before, 20_000);
    c.send({ type: 'cancel', id: 's' });
    c.ws.close();
    assert.ok(seen, 'a stats line while a request ran');
    const line = stats().at(-1);
    assert.equal(line.level, 'info');
    for (const key of ['interval_s', 'tokens_per_s', 'output_tokens_per_s', 'running', 'waiting',
                       'kv_usage'])
      assert.equal(typeof line[key], 'number', key);
    assert.ok('prefix_cache_hit_rate' in line);
    // Idle: no more stats lines.
    await sleep(600);
    const idle = stats().length;
    await sleep(800);
    assert.equal(stats().length, idle);
  });
});
