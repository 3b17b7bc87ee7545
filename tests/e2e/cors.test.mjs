// CORS over a real socket (issue 37, item 5): `metronome serve
// --allowed-origins` answers a browser's preflight for a listed origin
// without an API key, refuses the preflight of any other origin, and marks
// the responses to a listed origin's requests so the browser hands them to
// the page (the rules themselves: tests/net/access_control_test.cpp).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL_NAME, postJson, rawRequest, startServer } from './lib/harness.mjs';

const KEY = 'sk-cors-e2e';
const ALLOWED = 'http://chat.example.test:3000';
const OTHER_ALLOWED = 'https://app.example.test';
const EVIL = 'http://evil.example.test';

/// The browser's preflight for a POST with these headers from `origin`.
function preflight(server, origin, path = '/v1/chat/completions') {
  return rawRequest(server, {
    method: 'OPTIONS', path,
    headers: { origin, 'access-control-request-method': 'POST',
               'access-control-request-headers': 'authorization, content-type' },
  });
}

/// A comma-separated header as a set of lower-case items.
const items = (value) => new Set((value ?? '').split(',').map((s) => s.trim().toLowerCase())
  .filter((s) => s));

describe('with --allowed-origins and an API key', () => {
  let server;

  before(async () => {
    server = await startServer(['--allowed-origins', `${ALLOWED},${OTHER_ALLOWED}`,
                                '--api-key', KEY]);
  });

  after(async () => {
    await server?.stop();
  });

  test('a listed origin\'s preflight is answered, without a key', async () => {
    for (const origin of [ALLOWED, OTHER_ALLOWED]) {
      for (const route of ['/v1/chat/completions', '/v1/completions', '/tokenize']) {
        const res = await preflight(server, origin, route);
        assert.equal(res.status, 204, `${origin} ${route}: ${res.body}`);
        assert.equal(res.body, '');
        assert.equal(res.headers['access-control-allow-origin'], origin);
        assert.ok(items(res.headers.vary).has('origin'), res.headers.vary);
        assert.ok(items(res.headers['access-control-allow-methods']).has('post'),
                  res.headers['access-control-allow-methods']);
        const allowed = items(res.headers['access-control-allow-headers']);
        assert.ok(allowed.has('authorization') && allowed.has('content-type'),
                  res.headers['access-control-allow-headers']);
        assert.match(res.headers['access-control-max-age'] ?? '', /^[1-9][0-9]*$/);
      }
    }
  });

  test('another origin\'s preflight and requests get no Access-Control-Allow-Origin',
       async () => {
    const res = await preflight(server, EVIL);
    assert.equal(res.status, 403, res.body);
    assert.equal(JSON.parse(res.body).error.code, 'origin_not_allowed');
    assert.equal(res.headers['access-control-allow-origin'], undefined);
    assert.equal(res.headers['access-control-allow-methods'], undefined);
    // A listed origin's scheme or port changed is another origin.
    for (const near of ['https://chat.example.test:3000', 'http://chat.example.test:3001']) {
      const r = await preflight(server, near);
      assert.equal(r.status, 403, near);
      assert.equal(r.headers['access-control-allow-origin'], undefined, near);
    }
    const post = await postJson(server, '/v1/chat/completions',
      { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 },
      { origin: EVIL, authorization: `Bearer ${KEY}` });
    assert.equal(post.status, 403, post.body);
    assert.equal(post.headers['access-control-allow-origin'], undefined);
  });

  test('a listed origin\'s POST carries Access-Control-Allow-Origin', async () => {
    const headers = { origin: ALLOWED, authorization: `Bearer ${KEY}` };
    const res = await postJson(server, '/v1/chat/completions',
      { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }, headers);
    assert.equal(res.status, 200, res.body);
    assert.equal(res.headers['access-control-allow-origin'], ALLOWED);
    assert.ok(items(res.headers.vary).has('origin'), res.headers.vary);
    assert.equal(JSON.parse(res.body).object, 'chat.completion');

    // A streamed answer (SSE) too.
    const stream = await postJson(server, '/v1/completions',
      { model: MODEL_NAME, prompt: 'The sea', max_tokens: 2, stream: true }, headers);
    assert.equal(stream.status, 200, stream.body);
    assert.match(stream.headers['content-type'], /^text\/event-stream/);
    assert.equal(stream.headers['access-control-allow-origin'], ALLOWED);

    // And a refusal, so the page can read why (here: a wrong key).
    const refused = await postJson(server, '/v1/completions',
      { model: MODEL_NAME, prompt: 'x', max_tokens: 1 },
      { origin: ALLOWED, authorization: 'Bearer wrong' });
    assert.equal(refused.status, 401, refused.body);
    assert.equal(refused.headers['access-control-allow-origin'], ALLOWED);

    // A request with no Origin (no browser) gets none: not a blanket "*".
    const plain = await postJson(server, '/v1/completions',
      { model: MODEL_NAME, prompt: 'x', max_tokens: 1 }, { authorization: `Bearer ${KEY}` });
    assert.equal(plain.status, 200, plain.body);
    assert.equal(plain.headers['access-control-allow-origin'], undefined);
  });
});
