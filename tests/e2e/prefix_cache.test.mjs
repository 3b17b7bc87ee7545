// Prefix caching end to end: the same long prompt again is served from the
// cache (its time to first token a fraction of the first's, usage reports
// the cached tokens, /metrics counts the hits), a conversation's next turn
// reuses the earlier turns, and the answers are the ones a server without
// the cache gives, greedy and with seeded sampling.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL_NAME, metrics, postJson, rng, startServer } from './lib/harness.mjs';

const PAGE = 16; // engine.page_size's default
let cached, plain;

before(async () => {
  cached = await startServer();
  plain = await startServer(['--set', 'engine.prefix_caching=false']);
});

after(async () => {
  await cached?.stop();
  await plain?.stop();
});

function prompt(seed, n) {
  const r = rng(seed);
  return Array.from({ length: n }, () => 1 + Math.floor(r() * 120000));
}

/// { text, cached, ms } of a non-streamed completion.
async function complete(server, body) {
  const t0 = performance.now();
  const res = await postJson(server, '/v1/completions', { model: MODEL_NAME, ...body });
  const ms = performance.now() - t0;
  assert.equal(res.status, 200, res.body);
  const j = JSON.parse(res.body);
  return { text: j.choices[0].text, cached: j.usage.prompt_tokens_details.cached_tokens, ms,
           promptTokens: j.usage.prompt_tokens };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

test('the same long prompt again starts from the cache', async () => {
  const n = 3000;
  const first = [], again = [];
  for (let i = 0; i < 3; ++i) {
    const p = prompt(100 + i, n);
    const a = await complete(cached, { prompt: p, max_tokens: 1, temperature: 0 });
    assert.equal(a.cached, 0, 'nothing is cached the first time');
    assert.equal(a.promptTokens, n);
    first.push(a.ms);
    const b = await complete(cached, { prompt: p, max_tokens: 1, temperature: 0 });
    assert.equal(b.cached, Math.floor((n - 1) / PAGE) * PAGE, 'every full page but the last');
    assert.equal(b.text, a.text);
    again.push(b.ms);
  }
  const ratio = median(again) / median(first);
  console.log(`time to first token: ${median(first).toFixed(1)} ms uncached, ` +
              `${median(again).toFixed(1)} ms cached (${ratio.toFixed(3)}x)`);
  assert.ok(ratio <= 0.3, `cached TTFT ${ratio.toFixed(3)}x the uncached one`);
  const m = await metrics(cached);
  assert.ok(m.get('metronome:prefix_cache_hits_total') >= 3 * Math.floor((n - 1) / PAGE) * PAGE);
  assert.ok(m.get('metronome:prefix_cache_queries_total') >= 6 * n);
});

test('a conversation\'s next turn reuses the earlier turns, streamed over chat', async () => {
  const messages = [{ role: 'system', content: 'You are terse. '.repeat(40) },
                    { role: 'user', content: 'First question about the weather today?' }];
  const turn = async () => {
    const res = await postJson(cached, '/v1/chat/completions', {
      model: MODEL_NAME, messages, max_tokens: 8, temperature: 0, stream: true,
      stream_options: { include_usage: true } });
    assert.equal(res.status, 200, res.body);
    let text = '', usage = null;
    for (const line of res.body.split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]')
        continue;
      const j = JSON.parse(line.slice(6));
      if (j.usage)
        usage = j.usage;
      text += j.choices?.[0]?.delta?.content ?? '';
    }
    return { text, usage };
  };
  const one = await turn();
  messages.push({ role: 'assistant', content: one.text },
                { role: 'user', content: 'And tomorrow?' });
  const two = await turn();
  assert.ok(two.usage.prompt_tokens_details.cached_tokens >= PAGE * Math.floor(
    one.usage.prompt_tokens / PAGE) - PAGE, JSON.stringify([one.usage, two.usage]));
});

test('answers do not change with the cache, greedy and seeded', async () => {
  const system = prompt(7, 700);
  const bodies = [];
  for (let i = 0; i < 6; ++i) {
    const p = [...system, ...prompt(200 + i, 1 + 37 * i)];
    bodies.push({ prompt: p, max_tokens: 24, temperature: 0, ignore_eos: true });
    bodies.push({ prompt: p, max_tokens: 24, temperature: 0.9, top_p: 0.9, seed: 11 + i,
                  ignore_eos: true });
  }
  // On both servers at once, then again on the caching one (from the cache).
  const [warm, cold] = await Promise.all([
    Promise.all(bodies.map((b) => complete(cached, b))),
    Promise.all(bodies.map((b) => complete(plain, b)))]);
  const again = await Promise.all(bodies.map((b) => complete(cached, b)));
  for (let i = 0; i < bodies.length; ++i) {
    assert.equal(warm[i].text, cold[i].text, `request ${i}: with and without the cache`);
    assert.equal(again[i].text, cold[i].text, `request ${i}: from the cache`);
    assert.ok(again[i].cached >= 700 - PAGE, `request ${i} cached ${again[i].cached}`);
    assert.equal(cold[i].cached, 0);
  }
});
