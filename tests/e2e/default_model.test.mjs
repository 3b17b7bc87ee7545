// `metronome serve` with no --model (issue 37, item 1): the build's default
// model, metronome-tiny (docs/default-model.md). The banner and /v1/models
// say what it is, and a chat answer is English: most of its words are words
// of the corpora it was trained on. Skipped in a checkout without the trained
// model (models/metronome-tiny), whose build serves a random-weight model.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';

import { TESTDATA, startServer } from './lib/harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const shipped = path.join(here, '..', '..', 'models', 'metronome-tiny');
const card = fs.existsSync(path.join(shipped, 'metronome.json'))
  ? JSON.parse(fs.readFileSync(path.join(shipped, 'metronome.json'), 'utf8')) : null;

/// Lower-case words of the training corpora.
function corpusWords() {
  const words = new Set();
  for (const f of ['kjv_bible.txt', 'moby_dick.txt', 'sotu_all.txt', 'tinyshakespeare.txt'])
    for (const w of fs.readFileSync(path.join(TESTDATA, 'corpora', f), 'utf8')
      .toLowerCase().match(/[a-z]+/g))
      words.add(w);
  return words;
}

describe('the default model', { skip: card ? false : 'no models/metronome-tiny in this checkout' }, () => {
  let server;
  let client;

  before(async () => {
    server = await startServer([], { defaultModel: true });
    client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0,
                          timeout: 60_000 });
  });

  after(async () => {
    await server?.stop();
  });

  test('the banner and /v1/models name it and say what it is', async () => {
    const banner = new RegExp(`serving ${card.id} \\(cpu\\)`);
    assert.ok(await server.waitForLog(banner), server.log());
    assert.match(server.stdout(), banner);
    assert.ok(server.stdout().includes(`${card.id}: ${card.description}`), server.stdout());
    const res = await fetch(`${server.baseURL}/models`);
    const body = await res.json();
    assert.equal(body.data[0].id, card.id);
    assert.equal(body.data[0].description, card.description);
    assert.equal(body.data[0].max_model_len, 1024);
  });

  test('a chat answer is English and ends by itself', async () => {
    const words = corpusWords();
    const res = await client.chat.completions.create({
      model: card.id, messages: [{ role: 'user', content: 'Tell me about the sea and the ships.' }],
      max_tokens: 400, temperature: 0.8, top_p: 0.95, seed: 7 });
    const text = res.choices[0].message.content;
    const found = text.toLowerCase().match(/[a-z]+/g) ?? [];
    assert.ok(found.length >= 5, text);
    const known = found.filter((w) => words.has(w)).length;
    // Measured when the model was committed: 97-100% with seeds 1-5 and 7; a
    // random-weight model's subword soup, 25-40% (default_model_test.cpp).
    assert.ok(known >= 0.9 * found.length, `${known} of ${found.length} words known: ${text}`);
    // A paragraph ends in EOS: the answer stops before max_tokens.
    assert.equal(res.choices[0].finish_reason, 'stop', text);
  });
});
