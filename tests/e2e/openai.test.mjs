// The official `openai` client against `metronome serve`: chat and
// completions, streaming and not, stop strings, and errors surfacing as the
// client's own exception classes.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import OpenAI from 'openai';

import { MODEL_NAME, startServer } from './lib/harness.mjs';

let server;
let client;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0,
                        timeout: 60_000 });
});

after(async () => {
  await server?.stop();
});

const greedy = { temperature: 0, seed: 1 };

/// Text and finish reason of a streamed chat completion.
async function streamChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  let chunks = 0;
  let role = null;
  const deltas = [];
  for await (const chunk of stream) {
    chunks += 1;
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.match(chunk.id, /^chatcmpl-/);
    if (chunk.choices.length === 0)
      continue;
    const choice = chunk.choices[0];
    if (choice.delta.role)
      role = choice.delta.role;
    if (choice.delta.content) {
      text += choice.delta.content;
      deltas.push(choice.delta.content);
    }
    if (choice.finish_reason)
      finish = choice.finish_reason;
  }
  return { text, finish, chunks, role, deltas };
}

describe('models and health', () => {
  test('GET /v1/models lists the served model', { timeout: 20_000 }, async () => {
    const page = await client.models.list();
    const ids = page.data.map((m) => m.id);
    assert.deepEqual(ids, [MODEL_NAME]);
    const one = await client.models.retrieve(MODEL_NAME);
    assert.equal(one.id, MODEL_NAME);
  });
});

describe('chat completions', () => {
  test('non-streaming', { timeout: 60_000 }, async () => {
    const res = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: 'Tell me a story.' }],
      max_tokens: 12, ...greedy,
    });
    assert.match(res.id, /^chatcmpl-/);
    assert.equal(res.object, 'chat.completion');
    assert.equal(res.model, MODEL_NAME);
    assert.equal(res.choices.length, 1);
    assert.equal(res.choices[0].message.role, 'assistant');
    assert.equal(typeof res.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(res.choices[0].finish_reason));
    assert.ok(res.usage.prompt_tokens > 0);
    assert.ok(res.usage.completion_tokens >= 1 && res.usage.completion_tokens <= 12);
    assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);
  });

  test('streaming gives the same text as non-streaming', { timeout: 60_000 }, async () => {
    const params = { model: MODEL_NAME, messages: [{ role: 'user', content: 'Count to ten.' }],
                     max_tokens: 16, ...greedy };
    const whole = await client.chat.completions.create(params);
    const streamed = await streamChat(params);
    assert.equal(streamed.role, 'assistant');
    assert.equal(streamed.text, whole.choices[0].message.content);
    assert.equal(streamed.finish, whole.choices[0].finish_reason);
  });

  test('stream_options.include_usage adds a usage chunk', { timeout: 60_000 }, async () => {
    const stream = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: 'hello' }], max_tokens: 5,
      stream: true, stream_options: { include_usage: true }, ...greedy,
    });
    const chunks = [];
    for await (const chunk of stream)
      chunks.push(chunk);
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.ok(last.usage.completion_tokens >= 1 && last.usage.completion_tokens <= 5);
    for (const c of chunks.slice(0, -1))
      assert.equal(c.usage, null);
  });

  test('max_tokens ends with finish_reason length', { timeout: 60_000 }, async () => {
    const res = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: 'go' }], max_tokens: 3,
      ignore_eos: true, ...greedy,
    });
    assert.equal(res.choices[0].finish_reason, 'length');
    assert.equal(res.usage.completion_tokens, 3);
  });

  test('content as an array of text parts equals the plain string', { timeout: 60_000 },
       async () => {
    const a = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: 'same prompt' }], max_tokens: 8,
      ...greedy,
    });
    const b = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: [{ type: 'text', text: 'same prompt' }] }],
      max_tokens: 8, ...greedy,
    });
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  });
});

describe('completions', () => {
  test('non-streaming and streaming agree', { timeout: 60_000 }, async () => {
    const params = { model: MODEL_NAME, prompt: 'The capital of France is', max_tokens: 10,
                     ...greedy };
    const whole = await client.completions.create(params);
    assert.match(whole.id, /^cmpl-/);
    assert.equal(whole.object, 'text_completion');
    const stream = await client.completions.create({ ...params, stream: true });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      text += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, whole.choices[0].text);
    assert.equal(finish, whole.choices[0].finish_reason);
  });

  test('token-id prompts are accepted', { timeout: 60_000 }, async () => {
    const res = await client.completions.create({ model: MODEL_NAME, prompt: [1, 2, 3, 4],
                                                  max_tokens: 4, ...greedy });
    assert.equal(res.usage.prompt_tokens, 4);
  });

  test('the same seed gives the same sample', { timeout: 60_000 }, async () => {
    const params = { model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 8,
                     temperature: 1.0, seed: 1234 };
    const a = await client.completions.create(params);
    const b = await client.completions.create(params);
    assert.equal(a.choices[0].text, b.choices[0].text);
  });
});

describe('logprobs', () => {
  // ignore_eos: every token is text (no end-of-sequence entry outside it).
  const ask = { model: MODEL_NAME, max_tokens: 12, ignore_eos: true, ...greedy };

  /// Checks one chat logprobs entry with `top` alternatives, greedy.
  function checkEntry(e, top) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0, JSON.stringify(e));
    assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => b >= 0 && b < 256));
    assert.equal(e.top_logprobs.length, top);
    for (let k = 1; k < top; ++k)
      assert.ok(e.top_logprobs[k - 1].logprob >= e.top_logprobs[k].logprob);
    // Greedy: the sampled token is the most likely one.
    assert.equal(e.logprob, e.top_logprobs[0].logprob, JSON.stringify(e));
    assert.deepEqual(e.bytes, e.top_logprobs[0].bytes);
  }

  test('chat: one entry per token whose bytes make the text', { timeout: 60_000 }, async () => {
    const res = await client.chat.completions.create({
      ...ask, messages: [{ role: 'user', content: 'Describe the ocean.' }],
      logprobs: true, top_logprobs: 3,
    });
    const content = res.choices[0].logprobs.content;
    assert.equal(content.length, res.usage.completion_tokens);
    content.forEach((e) => checkEntry(e, 3));
    const bytes = Buffer.from(content.flatMap((e) => e.bytes));
    assert.equal(bytes.toString('utf8'), res.choices[0].message.content);
    // Streamed: the same entries, spread over the chunks.
    const stream = await client.chat.completions.create({
      ...ask, messages: [{ role: 'user', content: 'Describe the ocean.' }],
      logprobs: true, top_logprobs: 3, stream: true,
    });
    const streamed = [];
    for await (const chunk of stream)
      streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);
    // Without the flag: none.
    const plain = await client.chat.completions.create({
      ...ask, messages: [{ role: 'user', content: 'Describe the ocean.' }] });
    assert.equal(plain.choices[0].logprobs, null);
    assert.equal(plain.choices[0].message.content, res.choices[0].message.content);
  });

  test('sampling settings do not change the reported logprobs', { timeout: 60_000 },
       async () => {
    // The model's distribution, not the sampler's: the first token's
    // alternatives are the same with or without temperature and penalties.
    const base = { ...ask, max_tokens: 1, messages: [{ role: 'user', content: 'Hello' }],
                   logprobs: true, top_logprobs: 5 };
    const a = await client.chat.completions.create(base);
    const b = await client.chat.completions.create({ ...base, temperature: 1.7, seed: 9,
                                                     presence_penalty: 1.5, top_k: 3 });
    assert.deepEqual(b.choices[0].logprobs.content[0].top_logprobs,
                     a.choices[0].logprobs.content[0].top_logprobs);
  });

  test('completions: the legacy shape', { timeout: 60_000 }, async () => {
    const res = await client.completions.create({ ...ask, prompt: 'The river', logprobs: 2 });
    const lp = res.choices[0].logprobs;
    const n = res.usage.completion_tokens;
    assert.equal(lp.tokens.length, n);
    assert.equal(lp.token_logprobs.length, n);
    assert.equal(lp.top_logprobs.length, n);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 1; i < n; ++i)
      assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    for (let i = 0; i < n; ++i) {
      const alternatives = Object.values(lp.top_logprobs[i]);
      assert.ok(alternatives.length >= 1 && alternatives.length <= 2);
      assert.equal(lp.token_logprobs[i], Math.max(...alternatives)); // greedy
    }
  });

  test('out of range -> BadRequestError naming the param', { timeout: 20_000 }, async () => {
    await assert.rejects(
      client.chat.completions.create({ ...ask, messages: [{ role: 'user', content: 'x' }],
                                       logprobs: true, top_logprobs: 21 }),
      (err) => err instanceof OpenAI.BadRequestError && err.param === 'top_logprobs');
    await assert.rejects(
      client.chat.completions.create({ ...ask, messages: [{ role: 'user', content: 'x' }],
                                       top_logprobs: 2 }),
      (err) => err instanceof OpenAI.BadRequestError && err.param === 'top_logprobs');
  });
});

describe('stop strings', () => {
  // The reference is the model's own unconstrained greedy output: with a
  // stop string S, the answer must be that output cut before S's first
  // occurrence, S itself not included, finish_reason "stop".
  test('a stop string spanning two deltas cuts the text before it', { timeout: 90_000 },
       async () => {
    const params = { model: MODEL_NAME, messages: [{ role: 'user', content: 'Write a poem.' }],
                     max_tokens: 24, ignore_eos: true, ...greedy };
    const free = await streamChat(params);
    assert.ok(free.deltas.length >= 4, `too few deltas: ${JSON.stringify(free.deltas)}`);
    // A stop string across a token boundary: the end of one delta and the
    // start of the next.
    let stop = null;
    for (let i = 1; i + 1 < free.deltas.length && !stop; ++i) {
      const a = free.deltas[i];
      const b = free.deltas[i + 1];
      if (a.length === 0 || b.length === 0)
        continue;
      const s = a.slice(-Math.min(2, a.length)) + b.slice(0, Math.min(2, b.length));
      const at = free.text.indexOf(s);
      if (s.trim().length > 0 && at > 0)
        stop = s;
    }
    assert.ok(stop, `no usable stop string in ${JSON.stringify(free.deltas)}`);
    const expected = free.text.slice(0, free.text.indexOf(stop));
    const streamed = await streamChat({ ...params, stop: [stop] });
    assert.equal(streamed.text, expected);
    assert.equal(streamed.finish, 'stop');
    const whole = await client.chat.completions.create({ ...params, stop });
    assert.equal(whole.choices[0].message.content, expected);
    assert.equal(whole.choices[0].finish_reason, 'stop');
  });

  test('a stop string that never occurs changes nothing', { timeout: 60_000 }, async () => {
    const params = { model: MODEL_NAME, prompt: 'abc', max_tokens: 8, ignore_eos: true,
                     ...greedy };
    const free = await client.completions.create(params);
    const stopped = await client.completions.create({
      ...params, stop: ['\u0001never\u0002', 'nor this \u0003'] });
    assert.equal(stopped.choices[0].text, free.choices[0].text);
    assert.equal(stopped.choices[0].finish_reason, 'length');
  });
});

describe('errors surface as the client\'s exception types', () => {
  const base = { model: MODEL_NAME, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 };

  test('invalid range -> BadRequestError naming the param', { timeout: 20_000 }, async () => {
    await assert.rejects(client.chat.completions.create({ ...base, temperature: 7 }), (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `got ${err.constructor.name}`);
      assert.equal(err.status, 400);
      assert.equal(err.param, 'temperature');
      assert.equal(err.type, 'invalid_request_error');
      return true;
    });
  });

  test('wrong type -> BadRequestError', { timeout: 20_000 }, async () => {
    await assert.rejects(client.chat.completions.create({ ...base, max_tokens: 'many' }),
                         OpenAI.BadRequestError);
    await assert.rejects(client.completions.create({ model: MODEL_NAME, prompt: { no: 1 } }),
                         OpenAI.BadRequestError);
  });

  test('n > 1 -> BadRequestError', { timeout: 20_000 }, async () => {
    await assert.rejects(client.chat.completions.create({ ...base, n: 2 }), (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.param, 'n');
      return true;
    });
  });

  test('unknown model -> NotFoundError', { timeout: 20_000 }, async () => {
    await assert.rejects(client.chat.completions.create({ ...base, model: 'gpt-9' }), (err) => {
      assert.ok(err instanceof OpenAI.NotFoundError, `got ${err.constructor.name}`);
      assert.equal(err.code, 'model_not_found');
      return true;
    });
  });

  test('prompt longer than the context -> BadRequestError', { timeout: 60_000 }, async () => {
    const prompt = Array.from({ length: 5000 }, (_, i) => 100 + (i % 1000));
    for (const stream of [false, true]) {
      await assert.rejects(async () => {
        const res = await client.completions.create({ model: MODEL_NAME, prompt, max_tokens: 4,
                                                      stream });
        if (stream)
          for await (const _ of res) { /* the error comes before any chunk */ }
      }, (err) => {
        assert.ok(err instanceof OpenAI.BadRequestError, `got ${err.constructor.name}: ${err}`);
        assert.equal(err.status, 400);
        assert.equal(err.code, 'context_length_exceeded');
        return true;
      });
    }
  });

  test('errors do not disturb the next request', { timeout: 60_000 }, async () => {
    const res = await client.chat.completions.create({ ...base, ...greedy });
    assert.equal(res.choices.length, 1);
  });
});
