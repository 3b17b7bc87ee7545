// The conventions users expect of an LLM server (issue 37, item 5), from the
// real server on the tiny Llama 3 model: vLLM's POST /tokenize and
// /detokenize, GET /version, a client's X-Request-Id echoed and used in the
// access line, and --chat-template given a Jinja file.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import WebSocket from 'ws';

import { MODEL_NAME, TESTDATA, eventually, postJson, rawRequest, startServer }
  from './lib/harness.mjs';

const KEY = 'sk-conventions-test-key';
const auth = { authorization: `Bearer ${KEY}` };

/// Sends raw bytes on a fresh connection (without half-closing it: the
/// server takes an end of stream for a client gone); resolves to what came
/// back until the server closes.
function rawExchange(server, bytes) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    const s = net.connect(server.port, '127.0.0.1', () => s.write(bytes, 'latin1'));
    s.on('data', (c) => chunks.push(c));
    s.on('end', () => resolve(Buffer.concat(chunks).toString('latin1')));
    s.on('error', reject);
  });
}

describe('tokenizer routes, /version, X-Request-Id', () => {
  let server;
  before(async () => { server = await startServer([], { env: { METRONOME_API_KEY: KEY } }); });
  after(async () => { await server?.stop(); });

  test('tokenize a prompt: the ids the completions route feeds the model', async () => {
    const res = await postJson(server, '/tokenize', { prompt: 'How are you doing?' }, auth);
    assert.equal(res.status, 200, res.body);
    const j = JSON.parse(res.body);
    // Llama 3's ids (shared/testdata/tokenizers/vectors.json); this
    // tokenizer.json adds no BOS of its own.
    assert.deepEqual(j.tokens, [4438, 527, 499, 3815, 30]);
    assert.equal(j.count, 5);
    assert.equal(typeof j.max_model_len, 'number');
    assert.ok(j.max_model_len > 0);

    const bare = JSON.parse((await postJson(server, '/tokenize',
      { prompt: 'How are you doing?', add_special_tokens: false, model: MODEL_NAME }, auth)).body);
    assert.deepEqual(bare.tokens, [4438, 527, 499, 3815, 30]);

    // The count is the usage the completions route reports for the same prompt.
    const done = await postJson(server, '/v1/completions',
      { model: MODEL_NAME, prompt: 'How are you doing?', max_tokens: 1 }, auth);
    assert.equal(done.status, 200, done.body);
    assert.equal(JSON.parse(done.body).usage.prompt_tokens, j.count);
  });

  test('tokenize messages: the prompt tokens of the chat route', async () => {
    const messages = [{ role: 'user', content: 'Name three rivers.' }];
    const res = await postJson(server, '/tokenize', { messages }, auth);
    assert.equal(res.status, 200, res.body);
    const j = JSON.parse(res.body);
    assert.equal(j.tokens[0], 128000);
    assert.equal(j.count, j.tokens.length);
    const chat = await postJson(server, '/v1/chat/completions',
      { model: MODEL_NAME, messages, max_tokens: 1 }, auth);
    assert.equal(chat.status, 200, chat.body);
    assert.equal(JSON.parse(chat.body).usage.prompt_tokens, j.count);
    // add_special_tokens adds what the tokenizer's post-processor adds:
    // nothing here (the unit tests cover Llama 2's BOS).
    const extra = JSON.parse((await postJson(server, '/tokenize',
      { messages, add_special_tokens: true }, auth)).body);
    assert.deepEqual(extra.tokens, j.tokens);
  });

  test('detokenize is the inverse, special tokens included', async () => {
    const res = await postJson(server, '/detokenize', { tokens: [128000, 4438, 527, 499, 3815, 30] },
                               auth);
    assert.equal(res.status, 200, res.body);
    assert.deepEqual(JSON.parse(res.body), { prompt: '<|begin_of_text|>How are you doing?' });
  });

  test('bad bodies get a 400 naming the field, and the server stays up', async () => {
    const cases = [
      ['/tokenize', {}, 'prompt', 'missing_required_parameter'],
      ['/tokenize', { prompt: 7 }, 'prompt', 'invalid_type'],
      ['/tokenize', { prompt: 'a', messages: [{ role: 'user', content: 'b' }] }, 'messages', 'invalid_value'],
      ['/tokenize', { messages: [{ role: 'robot', content: 'b' }] }, 'messages[0].role', 'invalid_value'],
      ['/tokenize', { prompt: 'a', add_special_tokens: 1 }, 'add_special_tokens', 'invalid_type'],
      ['/tokenize', '{"prompt": ', null, 'invalid_json'],
      ['/detokenize', {}, 'tokens', 'missing_required_parameter'],
      ['/detokenize', { tokens: 'abc' }, 'tokens', 'invalid_type'],
      ['/detokenize', { tokens: [1, -2] }, 'tokens', 'invalid_value'],
      ['/detokenize', { tokens: [1, 2.5] }, 'tokens[1]', 'invalid_type'],
      ['/detokenize', { tokens: [4438, 99999999] }, 'tokens', 'invalid_value'],
    ];
    for (const [route, body, param, code] of cases) {
      const res = await postJson(server, route, body, auth);
      assert.equal(res.status, 400, `${route} ${JSON.stringify(body)}: ${res.body}`);
      const e = JSON.parse(res.body).error;
      assert.equal(e.param, param, res.body);
      assert.equal(e.code, code, res.body);
      assert.equal(e.type, 'invalid_request_error');
    }
    const outside = JSON.parse((await postJson(server, '/detokenize', { tokens: [4438, 99999999] },
                                               auth)).body).error;
    assert.match(outside.message, /tokens\[1\]/);
    const other = await postJson(server, '/tokenize', { prompt: 'a', model: 'other' }, auth);
    assert.equal(other.status, 404);
    assert.equal((await rawRequest(server, { path: '/health' })).status, 200);
  });

  test('the same key rules as the other routes', async () => {
    for (const route of ['/tokenize', '/detokenize']) {
      const none = await postJson(server, route, { prompt: 'a', tokens: [1] });
      assert.equal(none.status, 401, none.body);
      assert.equal(JSON.parse(none.body).error.code, 'missing_api_key');
      const wrong = await postJson(server, route, { tokens: [1] }, { authorization: 'Bearer nope' });
      assert.equal(wrong.status, 401);
      assert.equal(JSON.parse(wrong.body).error.code, 'invalid_api_key');
      const text = await rawRequest(server, { method: 'POST', path: route, body: '{}',
                                              headers: { ...auth, 'content-type': 'text/plain' } });
      assert.equal(text.status, 415);
    }
    assert.equal((await rawRequest(server, { path: '/version' })).status, 401);
  });

  test('GET /version', async () => {
    const res = await rawRequest(server, { path: '/version', headers: auth });
    assert.equal(res.status, 200, res.body);
    const j = JSON.parse(res.body);
    assert.match(j.version, /^\d+\.\d+\.\d+$/);
    assert.equal(j.version, res.headers.server.replace('metronome/', ''));
    assert.equal(typeof j.cuda, 'boolean');
    assert.equal(typeof j.build_type, 'string');
    assert.equal(typeof j.compiler, 'string');
  });

  test('X-Request-Id is echoed and names the request in its access line', async () => {
    const id = 'trace-3f9a2c71-e2e';
    const res = await postJson(server, '/v1/chat/completions',
      { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
      { ...auth, 'x-request-id': id });
    assert.equal(res.status, 200, res.body);
    assert.equal(res.headers['x-request-id'], id);
    const responseId = JSON.parse(res.body).id;
    assert.match(responseId, /^chatcmpl-/);
    const line = await eventually(() => server.stderr().split('\n')
      .find((l) => / access /.test(l) && l.includes(`request_id=${id}`)));
    assert.ok(line, server.stderr().slice(-2000));
    assert.ok(line.includes(`response_id=${responseId}`), line);
    assert.ok(line.includes('route=/v1/chat/completions'), line);

    // On the WebSocket upgrade too, whose access line names it.
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/v1/ws`,
                             { headers: { ...auth, 'x-request-id': 'ws-7' } });
    const upgraded = await new Promise((resolve, reject) => {
      ws.once('upgrade', (r) => resolve(r.headers['x-request-id']));
      ws.once('error', reject);
    });
    ws.close();
    assert.equal(upgraded, 'ws-7');
    assert.ok(await eventually(() => server.stderr().split('\n')
      .find((l) => / access /.test(l) && l.includes('status=101') && l.includes('request_id=ws-7'))));

    // On a refusal too (no key).
    const refused = await rawRequest(server, { path: '/v1/models', headers: { 'x-request-id': 'r-401' } });
    assert.equal(refused.status, 401);
    assert.equal(refused.headers['x-request-id'], 'r-401');
    assert.ok(await eventually(() => server.stderr().includes('request_id=r-401')));
  });

  test('an invalid X-Request-Id is not used, nor logged as it is', async () => {
    const long = 'x'.repeat(129);
    const res = await postJson(server, '/v1/chat/completions',
      { model: MODEL_NAME, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 },
      { ...auth, 'x-request-id': long });
    assert.equal(res.status, 200, res.body);
    assert.equal(res.headers['x-request-id'], JSON.parse(res.body).id);
    assert.ok(!server.stderr().includes(long));

    // What a client library would refuse to send: a space and a non-ASCII
    // byte.
    const body = JSON.stringify({ model: MODEL_NAME, prompt: 'a', max_tokens: 1 });
    const reply = await rawExchange(server,
      'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n'
      + `Authorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n`
      + 'X-Request-Id: evil id\xe9\r\n'
      + `Content-Length: ${body.length}\r\n\r\n${body}`);
    assert.match(reply, /^HTTP\/1\.1 200/);
    const echoed = /\r\nX-Request-Id: ([^\r]*)\r\n/i.exec(reply)?.[1];
    assert.match(echoed ?? '', /^cmpl-[0-9a-f]+$/, reply.slice(0, 600));
    assert.ok(!server.stderr().includes('evil id'), 'the invalid id reached the log');
  });
});

describe('--chat-template with a Jinja file', () => {
  let server;
  let dir;

  before(async () => {
    // Qwen3's template from the test data, alone in a file as Hugging Face
    // saves chat_template.jinja, on the tiny model whose folder holds Llama
    // 3's (tests/tokenizer/chat_template_test.cpp compares the file's
    // prompts with the folder's).
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'metronome-template-'));
    const file = path.join(dir, 'chat_template.jinja');
    const config = JSON.parse(fs.readFileSync(
      path.join(TESTDATA, 'tokenizers', 'qwen3', 'tokenizer_config.json'), 'utf8'));
    fs.writeFileSync(file, config.chat_template);
    server = await startServer(['--chat-template', file]);
  });

  after(async () => {
    await server?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test("the file's format makes the chat prompt", async () => {
    const messages = [{ role: 'user', content: 'Name three rivers.' }];
    const res = await postJson(server, '/tokenize', { messages });
    assert.equal(res.status, 200, res.body);
    const ids = JSON.parse(res.body).tokens;
    const prompt = JSON.parse((await postJson(server, '/detokenize', { tokens: ids })).body).prompt;
    // ChatML's turns (Qwen3), not the folder's Llama 3 headers.
    assert.ok(prompt.startsWith('<|im_start|>user\nName three rivers.<|im_end|>\n'), prompt);
    assert.ok(prompt.endsWith('<|im_start|>assistant\n'), prompt);
    assert.ok(!prompt.includes('<|start_header_id|>'), prompt);
    // The chat route feeds the model the same prompt.
    const chat = await postJson(server, '/v1/chat/completions',
      { model: MODEL_NAME, messages, max_tokens: 1 });
    assert.equal(chat.status, 200, chat.body);
    assert.equal(JSON.parse(chat.body).usage.prompt_tokens, ids.length);
  });
});
