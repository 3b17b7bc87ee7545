// The fp8_e5m2 KV cache's overflow supervision end to end (issue 35): the
// real `metronome serve` on the CPU, whose engine is fp8_e5m2's reference,
// serving a tiny model made to overflow (the same edit as the C++ tests'
// test::overflowing_model: token 6's value in layer 0 is ~1e5 times what
// its window's first row set the scale for). With a budget of one
// re-materialisation and a cool-down of 2 s, the first overflowing request
// is recomputed in bf16, the second is kept and starts the cool-down, a
// request during it runs bf16, and after it fp8_e5m2 again; each response's
// X-KV-Cache-Strategy, /metrics and the log say so.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { BIN, MODEL_NAME, TESTDATA, WORK_DIR, eventually, metrics, postJson,
         startServer } from './lib/harness.mjs';

const OVERFLOW_TOKEN = 6;
const STRATEGY = 'paged;page_size=16;dtype=fp8_e5m2';
let server;

/// Rewrites the F32 tensor `name` of a safetensors file through `edit`.
function editTensor(file, name, edit) {
  const bytes = fs.readFileSync(file);
  const headerLen = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLen).toString('utf8'));
  const t = header[name];
  assert.equal(t.dtype, 'F32', name);
  const [begin, end] = t.data_offsets;
  const start = 8 + headerLen + begin;
  const values = new Float32Array(bytes.buffer.slice(bytes.byteOffset + start,
                                                     bytes.byteOffset + 8 + headerLen + end));
  edit(values, t.shape);
  Buffer.from(values.buffer).copy(bytes, start);
  fs.writeFileSync(file, bytes);
}

function overflowingModel() {
  fs.mkdirSync(WORK_DIR, { recursive: true });
  const dir = fs.mkdtempSync(path.join(WORK_DIR, 'e2e-overflowing-'));
  execFileSync(BIN, ['make-model', '--preset', 'tiny-llama3', '--tokenizer',
                     path.join(TESTDATA, 'tokenizers', 'llama3'), '--seed', '11', '--dtype', 'f32',
                     '--out', dir, '--force'],
               { stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000 });
  const file = path.join(dir, 'model.safetensors');
  editTensor(file, 'model.embed_tokens.weight', (v, [vocab, hidden]) => {
    for (let t = 0; t < vocab; ++t)
      v[t * hidden] = 0;
    for (let i = 0; i < hidden; ++i)
      v[OVERFLOW_TOKEN * hidden + i] = i === 0 ? 1 : 0;
  });
  editTensor(file, 'model.layers.0.self_attn.v_proj.weight', (v) => { v[0] = 1e5; });
  return dir;
}

before(async () => {
  server = await startServer(['--kv-cache-dtype', 'fp8_e5m2',
                              '--set', 'engine.kv_overflow.max_rematerializations=1',
                              '--set', 'engine.kv_overflow.cooldown_s=2'],
                             { model: overflowingModel() });
});

after(async () => {
  await server?.stop();
});

/// The X-KV-Cache-Strategy of a greedy completion of `prompt` (token ids).
async function strategy(prompt) {
  const res = await postJson(server, '/v1/completions',
                             { model: MODEL_NAME, prompt, max_tokens: 4, temperature: 0 });
  assert.equal(res.status, 200, res.body);
  return res.headers['x-kv-cache-strategy'];
}

test('overflows are re-materialised, then a cool-down runs bf16, then fp8_e5m2 again', async () => {
  assert.ok(await server.waitForLog(/fp8_e5m2 on device 'cpu'.*saves no memory/), server.log());
  assert.equal(await strategy([100, 200, 300, 400]), `${STRATEGY};kv=fp8_e5m2`);
  assert.equal(await strategy([100, OVERFLOW_TOKEN, 200, 300, 400]),
               `${STRATEGY};kv=bf16;kv_overflow=rematerialized`);
  // The budget (one) is spent: kept with its saturated values, and the
  // cool-down starts.
  assert.equal(await strategy([101, OVERFLOW_TOKEN, 200, 300, 400]),
               `${STRATEGY};kv=fp8_e5m2;kv_overflow=saturated`);
  assert.equal(await strategy([102, 200, 300, 400]), `${STRATEGY};kv=bf16;kv_overflow=cooldown`);
  let m = await metrics(server);
  assert.equal(m.get('metronome:kv_precision_events_total{event="rematerialized"}'), 1);
  assert.equal(m.get('metronome:kv_precision_events_total{event="kept"}'), 1);
  assert.equal(m.get('metronome:kv_precision_events_total{event="cooldown_started"}'), 1);
  assert.equal(m.get('metronome:kv_precision_mode{mode="bf16"}'), 1);
  // 2 s later the cool-down is over.
  m = await eventually(async () => {
    const x = await metrics(server);
    return x.get('metronome:kv_precision_mode{mode="fp8_e5m2"}') === 1 ? x : null;
  }, 10_000, 100);
  assert.ok(m, 'the cool-down did not end');
  assert.equal(m.get('metronome:kv_precision_events_total{event="cooldown_ended"}'), 1);
  assert.equal(await strategy([103, 200, 300, 400]), `${STRATEGY};kv=fp8_e5m2`);
  for (const event of ['rematerialized', 'kept', 'cooldown_started', 'cooldown_ended'])
    assert.ok(await server.waitForLog(new RegExp(`kv_precision event=${event}`)), server.log());
});
