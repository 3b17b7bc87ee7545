// Continuous batching must not change results: 64 concurrent greedy
// requests of mixed prompt and output lengths give exactly the text each
// gives when it runs alone on an idle server.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL_NAME, metrics, postJson, rng, startServer } from './lib/harness.mjs';

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

/// 64 requests: completions with token-id prompts of 1..300 tokens, text
/// prompts and chats; 1..32 output tokens; some streamed.
function requests() {
  const r = rng(64);
  const out = [];
  for (let i = 0; i < 64; ++i) {
    const max_tokens = 1 + Math.floor(r() * 32);
    const stream = r() < 0.3;
    const kind = i % 3;
    if (kind === 0) {
      const n = 1 + Math.floor(r() * 300);
      const prompt = Array.from({ length: n }, () => 1 + Math.floor(r() * 120000));
      out.push({ path: '/v1/completions', body: { model: MODEL_NAME, prompt, max_tokens,
                                                  temperature: 0, stream } });
    } else if (kind === 1) {
      const words = Array.from({ length: 1 + Math.floor(r() * 60) },
                               (_, k) => `word${Math.floor(r() * 1000)}${k % 7 ? '' : '.'}`);
      out.push({ path: '/v1/completions', body: { model: MODEL_NAME, prompt: words.join(' '),
                                                  max_tokens, temperature: 0, stream } });
    } else {
      out.push({ path: '/v1/chat/completions', body: {
        model: MODEL_NAME, max_tokens, temperature: 0, stream,
        messages: [{ role: 'system', content: 'You answer briefly.' },
                   { role: 'user', content: `Question ${i}: ${'why '.repeat(1 + (i % 40))}?` }] } });
    }
  }
  return out;
}

/// { text, finish, tokens } of one request's answer.
async function run(req) {
  const res = await postJson(server, req.path, req.body);
  assert.equal(res.status, 200, res.body);
  const chat = req.path.includes('chat');
  if (!req.body.stream) {
    const j = JSON.parse(res.body);
    const c = j.choices[0];
    return { text: chat ? c.message.content : c.text, finish: c.finish_reason,
             tokens: j.usage.completion_tokens };
  }
  let text = '';
  let finish = null;
  for (const data of res.body.split('\n\n').filter((e) => e.startsWith('data: '))
                                 .map((e) => e.slice(6))) {
    if (data === '[DONE]')
      break;
    const c = JSON.parse(data).choices[0];
    if (!c)
      continue;
    text += chat ? (c.delta.content ?? '') : c.text;
    finish = c.finish_reason ?? finish;
  }
  return { text, finish, tokens: null };
}

test('64 concurrent greedy requests equal their solo runs', { timeout: 240_000 }, async () => {
  const reqs = requests();
  const solo = [];
  for (const req of reqs)
    solo.push(await run(req));
  const batched = await Promise.all(reqs.map(run));
  let mismatches = 0;
  for (let i = 0; i < reqs.length; ++i) {
    if (batched[i].text !== solo[i].text || batched[i].finish !== solo[i].finish)
      ++mismatches;
    assert.equal(batched[i].text, solo[i].text, `request ${i} text differs under batching`);
    assert.equal(batched[i].finish, solo[i].finish, `request ${i} finish_reason differs`);
    if (solo[i].tokens !== null)
      assert.equal(batched[i].tokens, solo[i].tokens, `request ${i} token count differs`);
  }
  assert.equal(mismatches, 0);
  // The batch really was concurrent: more than one sequence per step.
  const m = await metrics(server);
  assert.ok((m.get('metronome:batch_size_sum') ?? 0) > (m.get('metronome:batch_size_count') ?? 0),
            'no step ever ran more than one sequence');
});
