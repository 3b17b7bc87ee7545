// Security by default (issue 39, item 4) against `metronome serve`: API keys
// (flag, environment, file) with the official openai client, raw HTTP and
// the WebSocket; Content-Type, Origin and Host checks; log escaping; the
// warning for an open non-loopback server; TLS with a self-signed pair made
// here by the openssl command.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import OpenAI from 'openai';
import WebSocket from 'ws';

import { MODEL_NAME, eventually, postJson, rawRequest, startServer, tlsRequest }
  from './lib/harness.mjs';

const KEY = 'sk-e2e-flag';
const ENV_KEY = 'sk-e2e-env';
const FILE_KEY = 'sk-e2e-file';

/// Opens /v1/ws with these `ws` options; resolves to { status } of a refused
/// upgrade, or { ws, protocol } once open.
function openWs(server, { query = '', protocols, ...options } = {}) {
  return new Promise((resolve, reject) => {
    const scheme = options.ca ? 'wss' : 'ws';
    const ws = new WebSocket(`${scheme}://127.0.0.1:${server.port}/v1/ws${query}`, protocols,
                             options);
    ws.once('unexpected-response', (req, res) => {
      resolve({ status: res.statusCode });
      req.destroy();
    });
    ws.once('open', () => resolve({ ws, protocol: ws.protocol }));
    ws.on('error', reject); // after a refusal too: a no-op once resolved
  });
}

/// Sends a ping on an open socket and waits for its pong, then closes.
async function pingAndClose(ws) {
  const pong = new Promise((resolve) => ws.once('message', (d) => resolve(JSON.parse(d))));
  ws.send(JSON.stringify({ type: 'ping', id: 'p' }));
  assert.equal((await pong).type, 'pong');
  await new Promise((resolve) => { ws.once('close', resolve); ws.close(); });
}

describe('with API keys from the flag, the environment and a file', () => {
  let server;
  let dir;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'metronome-keys-'));
    const file = path.join(dir, 'keys');
    fs.writeFileSync(file, `# keys\n${FILE_KEY}\n`);
    server = await startServer(['--api-key', KEY, '--set', `server.api_keys_file=${file}`],
                               { env: { METRONOME_API_KEY: ENV_KEY } });
  });

  after(async () => {
    await server?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('the openai client needs a right key', { timeout: 60_000 }, async () => {
    const wrong = new OpenAI({ baseURL: server.baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
    await assert.rejects(
      wrong.chat.completions.create({ model: MODEL_NAME, max_tokens: 2,
                                      messages: [{ role: 'user', content: 'hi' }] }),
      (err) => {
        assert.ok(err instanceof OpenAI.AuthenticationError, `got ${err?.constructor?.name}`);
        assert.equal(err.status, 401);
        assert.equal(err.code, 'invalid_api_key');
        return true;
      });
    await assert.rejects(wrong.models.list(), OpenAI.AuthenticationError);
    for (const key of [KEY, ENV_KEY, FILE_KEY]) {
      const client = new OpenAI({ baseURL: server.baseURL, apiKey: key, maxRetries: 0 });
      const res = await client.chat.completions.create({
        model: MODEL_NAME, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(res.object, 'chat.completion', key);
      const stream = await client.completions.create({ model: MODEL_NAME, prompt: 'x',
                                                       max_tokens: 2, stream: true });
      let chunks = 0;
      for await (const _ of stream)
        chunks += 1;
      assert.ok(chunks >= 1, key);
    }
  });

  test('/health is open, /metrics and the rest are not', { timeout: 30_000 }, async () => {
    assert.equal((await rawRequest(server, { path: '/health' })).status, 200);
    for (const p of ['/metrics', '/v1/models', '/v1/nothing']) {
      const res = await rawRequest(server, { path: p });
      assert.equal(res.status, 401, p);
      assert.equal(res.headers['www-authenticate'], 'Bearer');
      const body = JSON.parse(res.body);
      assert.equal(body.error.code, 'missing_api_key');
      assert.equal(body.error.type, 'invalid_request_error');
    }
    const ok = await rawRequest(server, { path: '/metrics',
                                          headers: { authorization: `Bearer ${KEY}` } });
    assert.equal(ok.status, 200);
    assert.match(ok.body, /^metronome:/m);
  });

  test('the WebSocket takes the key as header, subprotocol or query', { timeout: 30_000 },
       async () => {
    assert.equal((await openWs(server)).status, 401);
    assert.equal((await openWs(server, { query: '?api_key=sk-wrong' })).status, 401);
    let r = await openWs(server, { headers: { authorization: `Bearer ${KEY}` } });
    await pingAndClose(r.ws);
    // What a browser does: new WebSocket(url, ['metronome', 'bearer.' + key]).
    r = await openWs(server, { protocols: ['metronome', `bearer.${ENV_KEY}`] });
    assert.equal(r.protocol, 'metronome');
    await pingAndClose(r.ws);
    r = await openWs(server, { query: `?api_key=${encodeURIComponent(FILE_KEY)}` });
    await pingAndClose(r.ws);
  });
});

describe('with the defaults (no key)', () => {
  let server;

  before(async () => {
    server = await startServer(['--log-level', 'debug']);
  });

  after(async () => {
    await server?.stop();
  });

  test('a text/plain POST (a simple cross-site request) gets 415', { timeout: 30_000 },
       async () => {
    const body = JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 2 });
    for (const type of ['text/plain', 'application/x-www-form-urlencoded']) {
      const res = await rawRequest(server, { method: 'POST', path: '/v1/completions', body,
                                             headers: { 'content-type': type } });
      assert.equal(res.status, 415, type);
      assert.equal(JSON.parse(res.body).error.code, 'unsupported_media_type');
    }
    assert.equal((await postJson(server, '/v1/completions', body)).status, 200);
  });

  test('other sites cannot use the API or the WebSocket', { timeout: 30_000 }, async () => {
    const evil = { origin: 'http://evil.example' };
    const res = await postJson(server, '/v1/completions',
                               { model: MODEL_NAME, prompt: 'x', max_tokens: 2 }, evil);
    assert.equal(res.status, 403);
    assert.equal(JSON.parse(res.body).error.code, 'origin_not_allowed');
    assert.equal((await openWs(server, { origin: 'http://evil.example' })).status, 403);
    // A page served by this server itself.
    const own = await openWs(server, { origin: `http://127.0.0.1:${server.port}` });
    await pingAndClose(own.ws);
  });

  test('a rebound host name gets 421', { timeout: 30_000 }, async () => {
    const res = await rawRequest(server, { path: '/v1/models',
                                           headers: { host: `evil.example:${server.port}` } });
    assert.equal(res.status, 421);
    assert.equal(JSON.parse(res.body).error.code, 'host_not_allowed');
    const local = await rawRequest(server, { path: '/v1/models',
                                             headers: { host: `localhost:${server.port}` } });
    assert.equal(local.status, 200);
  });

  test('a WebSocket id cannot forge a log line', { timeout: 30_000 }, async () => {
    const { ws } = await openWs(server);
    const done = new Promise((resolve) => ws.on('message', (d) => {
      const e = JSON.parse(d);
      if (e.type === 'done' || e.type === 'error')
        resolve(e);
    }));
    ws.send(JSON.stringify({ type: 'chat', id: 'a\nFORGED admin login', model: MODEL_NAME,
                             max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }));
    assert.equal((await done).type, 'done');
    ws.close();
    assert.ok(await eventually(() => server.log().includes('a\\nFORGED')), server.log());
    assert.doesNotMatch(server.log(), /^FORGED/m);
  });
});

test('an open server on all interfaces warns at start', { timeout: 120_000 }, async () => {
  const open = await startServer(['--set', 'server.host=0.0.0.0']);
  try {
    assert.ok(await open.waitForLog(/WITHOUT an API key/), open.log());
  } finally {
    await open.stop();
  }
  const keyed = await startServer(['--set', 'server.host=0.0.0.0'],
                                  { env: { METRONOME_API_KEY: 'k' } });
  try {
    // One line or the other is written, never both.
    assert.ok(await keyed.waitForLog(/1 API key required/), keyed.log());
    assert.doesNotMatch(keyed.log(), /WITHOUT an API key/);
  } finally {
    await keyed.stop();
  }
});

describe('with TLS', () => {
  let server;
  let dir;
  let ca;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'metronome-tls-'));
    const cert = path.join(dir, 'cert.pem');
    const key = path.join(dir, 'key.pem');
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt',
                             'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
                             '-subj', '/CN=localhost', '-addext',
                             'subjectAltName=DNS:localhost,IP:127.0.0.1',
                             '-keyout', key, '-out', cert], { stdio: 'ignore' });
    ca = fs.readFileSync(cert);
    server = await startServer(['--set', `server.tls.cert_file=${cert}`,
                                '--set', `server.tls.key_file=${key}`, '--api-key', KEY],
                               { ca });
  });

  after(async () => {
    await server?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('https and wss work, with the key', { timeout: 60_000 }, async () => {
    assert.ok(await server.waitForLog(/on https:\/\//), server.log());
    const body = JSON.stringify({ model: MODEL_NAME, prompt: 'x', max_tokens: 2 });
    const headers = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
    const res = await tlsRequest({ port: server.port, ca, method: 'POST',
                                   path: '/v1/completions', headers, body });
    assert.equal(res.status, 200, res.body);
    assert.equal(JSON.parse(res.body).object, 'text_completion');
    const refused = await tlsRequest({ port: server.port, ca, path: '/v1/models' });
    assert.equal(refused.status, 401);
    const r = await openWs(server, { ca, servername: 'localhost',
                                     protocols: ['metronome', `bearer.${KEY}`] });
    await pingAndClose(r.ws);
    // Plain HTTP on the TLS port gets nowhere.
    await assert.rejects(rawRequest(server, { path: '/health' }));
  });
});
