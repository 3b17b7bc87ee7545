// Every error case of the API over raw HTTP: its status, its headers and
// its OpenAI-style body {"error": {"message", "type", "param", "code"}}.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import OpenAI from 'openai';

import { MODEL_NAME, postJson, rawRequest, sseData, startServer } from './lib/harness.mjs';

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

function assertErrorBody(res, status, { param, code, type } = {}) {
  assert.equal(res.status, status, res.body);
  assert.match(res.headers['content-type'], /^application\/json/);
  const body = JSON.parse(res.body);
  assert.ok(body.error, res.body);
  assert.equal(typeof body.error.message, 'string');
  assert.ok(body.error.message.length > 0);
  assert.equal(typeof body.error.type, 'string');
  assert.ok('param' in body.error && 'code' in body.error, res.body);
  if (param !== undefined)
    assert.equal(body.error.param, param, res.body);
  if (code !== undefined)
    assert.equal(body.error.code, code, res.body);
  if (type !== undefined)
    assert.equal(body.error.type, type, res.body);
  return body.error;
}

const chatBody = (extra = {}) => ({
  model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...extra,
});

describe('400: malformed JSON, wrong types, invalid ranges', () => {
  test('malformed JSON', { timeout: 20_000 }, async () => {
    for (const body of ['{', '{"messages": [}', 'not json at all', '']) {
      const res = await postJson(server, '/v1/chat/completions', body);
      assertErrorBody(res, 400, { code: 'invalid_json', type: 'invalid_request_error' });
    }
  });

  test('not an object', { timeout: 20_000 }, async () => {
    assertErrorBody(await postJson(server, '/v1/completions', '[1, 2]'), 400);
  });

  test('wrong types', { timeout: 20_000 }, async () => {
    const cases = [
      [{ temperature: 'hot' }, 'temperature'],
      [{ max_tokens: '5' }, 'max_tokens'],
      [{ stream: 'yes' }, 'stream'],
      [{ stop: 3 }, 'stop'],
      [{ messages: 'hello' }, 'messages'],
      [{ messages: [{ role: 'user', content: 7 }] }, 'messages[0].content'],
    ];
    for (const [extra, param] of cases) {
      const res = await postJson(server, '/v1/chat/completions', chatBody(extra));
      assertErrorBody(res, 400, { param, type: 'invalid_request_error' });
    }
  });

  test('invalid ranges', { timeout: 20_000 }, async () => {
    const cases = [
      [{ temperature: 2.5 }, 'temperature'],
      [{ top_p: 0 }, 'top_p'],
      [{ top_p: 1.1 }, 'top_p'],
      [{ max_tokens: 0 }, 'max_tokens'],
      [{ frequency_penalty: 3 }, 'frequency_penalty'],
      [{ presence_penalty: -3 }, 'presence_penalty'],
      [{ stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop'],
      [{ n: 2 }, 'n'],
      [{ logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
      [{ top_logprobs: 2 }, 'top_logprobs'],
    ];
    for (const [extra, param] of cases) {
      const res = await postJson(server, '/v1/chat/completions', chatBody(extra));
      assertErrorBody(res, 400, { param });
    }
  });

  test('missing required fields', { timeout: 20_000 }, async () => {
    assertErrorBody(await postJson(server, '/v1/chat/completions', { model: MODEL_NAME }), 400,
                    { param: 'messages', code: 'missing_required_parameter' });
    assertErrorBody(await postJson(server, '/v1/completions', { model: MODEL_NAME }), 400,
                    { param: 'prompt', code: 'missing_required_parameter' });
  });

  test('prompt longer than the context', { timeout: 60_000 }, async () => {
    const prompt = Array.from({ length: 5000 }, (_, i) => 200 + i);
    for (const stream of [false, true]) {
      const res = await postJson(server, '/v1/completions',
                                 { model: MODEL_NAME, prompt, max_tokens: 4, stream });
      assertErrorBody(res, 400, { code: 'context_length_exceeded' });
    }
  });

  test('token ids outside the vocabulary', { timeout: 20_000 }, async () => {
    const res = await postJson(server, '/v1/completions',
                               { model: MODEL_NAME, prompt: [1, 2, 999999999], max_tokens: 2 });
    assertErrorBody(res, 400);
  });

  test('unknown fields are ignored', { timeout: 60_000 }, async () => {
    const res = await postJson(server, '/v1/chat/completions',
                               chatBody({ some_new_option: { x: 1 }, user: 'u', metadata: {} }));
    assert.equal(res.status, 200, res.body);
  });
});

describe('404, 405, 413', () => {
  test('unknown route -> 404', { timeout: 20_000 }, async () => {
    assertErrorBody(await rawRequest(server, { path: '/v1/engines' }), 404);
    assertErrorBody(await postJson(server, '/v1/chat/completion', chatBody()), 404);
  });

  test('unknown model -> 404 model_not_found', { timeout: 20_000 }, async () => {
    assertErrorBody(await postJson(server, '/v1/chat/completions', chatBody({ model: 'x' })),
                    404, { code: 'model_not_found' });
  });

  test('wrong method -> 405 with Allow', { timeout: 20_000 }, async () => {
    const get = await rawRequest(server, { path: '/v1/chat/completions' });
    assertErrorBody(get, 405);
    assert.equal(get.headers.allow, 'POST');
    const post = await postJson(server, '/v1/models', {});
    assertErrorBody(post, 405);
    assert.equal(post.headers.allow, 'GET');
    const put = await rawRequest(server, { method: 'PUT', path: '/health', body: 'x' });
    assertErrorBody(put, 405);
  });

  test('body over the limit -> 413', { timeout: 20_000 }, async () => {
    // The default limit is 1 MiB.
    const big = JSON.stringify(chatBody({ padding: 'x'.repeat(2 << 20) }));
    const res = await postJson(server, '/v1/chat/completions', big);
    assertErrorBody(res, 413, { code: 'request_too_large' });
  });

  test('the openai client sees APIError subclasses with the status', { timeout: 20_000 },
       async () => {
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'x', maxRetries: 0 });
    await assert.rejects(
      client.chat.completions.create(chatBody({ padding: 'y'.repeat(2 << 20) })),
      (err) => err instanceof OpenAI.APIError && err.status === 413);
    await assert.rejects(client.post('/nowhere', { body: {} }),
                         (err) => err instanceof OpenAI.NotFoundError);
  });
});

describe('429 when the queue is full', () => {
  let small;

  before(async () => {
    // One running sequence, one waiting: the third concurrent request finds
    // the queue full.
    small = await startServer(['--max-batch-size', '1', '--set', 'server.max_queued_requests=1',
                               '--set', 'server.retry_after_s=3',
                               // LADB's admissions a step must fit under the engine's cap.
                               '--set', 'batching.max_batch_size=1']);
  });

  after(async () => {
    await small?.stop();
  });

  test('429 with Retry-After and a rate-limit error', { timeout: 90_000 }, async () => {
    const body = { model: MODEL_NAME, prompt: 'fill the queue', max_tokens: 64,
                   ignore_eos: true, temperature: 0 };
    const results = await Promise.all(Array.from({ length: 8 }, () =>
      postJson(small, '/v1/completions', body)));
    const limited = results.filter((r) => r.status === 429);
    const ok = results.filter((r) => r.status === 200);
    assert.ok(limited.length >= 1, `statuses: ${results.map((r) => r.status)}`);
    assert.ok(ok.length >= 1, `statuses: ${results.map((r) => r.status)}`);
    assert.equal(ok.length + limited.length, results.length);
    for (const r of limited) {
      assertErrorBody(r, 429);
      assert.equal(r.headers['retry-after'], '3');
    }
    // Streaming requests get the real status too (headers wait for the
    // first token), and the openai client raises RateLimitError.
    const client = new OpenAI({ baseURL: small.baseURL, apiKey: 'x', maxRetries: 0 });
    const outcomes = await Promise.allSettled(Array.from({ length: 8 }, async () => {
      const stream = await client.completions.create({ ...body, stream: true });
      for await (const _ of stream) { /* drain */ }
    }));
    const rejected = outcomes.filter((o) => o.status === 'rejected').map((o) => o.reason);
    assert.ok(rejected.length >= 1);
    for (const err of rejected)
      assert.ok(err instanceof OpenAI.RateLimitError, `got ${err?.constructor?.name}: ${err}`);
  });
});

describe('protocol robustness', () => {
  test('garbage on the socket gets 400 and a close; the server lives on', { timeout: 20_000 },
       async () => {
    const reply = await new Promise((resolve, reject) => {
      const s = net.connect(server.port, '127.0.0.1');
      let data = '';
      s.on('data', (d) => { data += d.toString(); });
      s.on('end', () => resolve(data));
      s.on('error', reject);
      s.write('\x16\x03\x01 this is not HTTP\r\n\r\n');
    });
    assert.match(reply, /^HTTP\/1\.1 400 /);
    const health = await rawRequest(server, { path: '/health' });
    assert.equal(health.status, 200);
  });

  test('a stream ends with data: [DONE] and keeps the connection clean', { timeout: 20_000 },
       async () => {
    // (An error after the first token, an SSE error event, cannot be
    // provoked on a healthy engine; tests/net covers its format.)
    const res = await postJson(server, '/v1/completions',
                               { model: MODEL_NAME, prompt: 'x', max_tokens: 2, stream: true });
    assert.equal(res.status, 200);
    assert.equal(sseData(res.body).at(-1), '[DONE]');
  });
});
