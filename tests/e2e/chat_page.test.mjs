// The chat page at GET / (issue 37, item 2) in Debian's Chromium, driven by
// playwright-core, against `metronome serve` with an API key: the page asks
// for the key, streams an answer over /v1/ws, sends the conversation so far
// with the next message, stops a long answer with the Stop button (the
// server counts a cancellation), and shows the server's error for a bad
// setting. The last state is saved as a screenshot (docs/chat-page.png is
// one of these).
//
// Environment: METRONOME_CHROMIUM, the browser (default /usr/bin/chromium,
// Debian's package `chromium`, which tools/build.sh installs);
// METRONOME_SCREENSHOT, where the screenshot goes (default: the work dir).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { chromium } from 'playwright-core';

import { MODEL_NAME, WORK_DIR, eventually, parseMetrics, startServer } from './lib/harness.mjs';

const KEY = 'sk-e2e-page';
const CHROMIUM = process.env.METRONOME_CHROMIUM || '/usr/bin/chromium';
const SCREENSHOT = process.env.METRONOME_SCREENSHOT || path.join(WORK_DIR, 'chat-page.png');

let server;
let browser;
let page;
/// Every message the page sent on its WebSocket, parsed.
const sent = [];

before(async () => {
  assert.ok(fs.existsSync(CHROMIUM),
            `${CHROMIUM} is missing: install Debian's chromium (tools/build.sh does)`);
  server = await startServer(['--api-key', KEY]);
  // Headless, and without Chromium's sandbox: CI runs as root, where the
  // sandbox cannot start (playwright-core passes --no-sandbox by default).
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true,
                                    args: ['--disable-dev-shm-usage', '--disable-gpu'] });
  page = await browser.newPage({ viewport: { width: 1100, height: 720 }, colorScheme: 'light' });
  page.on('websocket', (ws) => ws.on('framesent', (f) => sent.push(JSON.parse(f.payload))));
  page.on('pageerror', (err) => { throw err; });
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

/// The metrics, with the key.
async function serverMetrics() {
  const res = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(res.status, 200);
  return parseMetrics(await res.text());
}

const lastAnswer = () => page.locator('.msg.assistant').last();

/// Types `text` into the composer and sends it with Enter.
async function say(text) {
  await page.fill('#prompt', text);
  await page.press('#prompt', 'Enter');
}

test('the page asks for the key, then streams an answer', { timeout: 120_000 }, async () => {
  const res = await page.goto(server.url + '/');
  assert.equal(res.status(), 200);
  assert.match(res.headers()['content-security-policy'], /default-src 'none'/);
  // The page probes /v1/models and finds it needs a key.
  await page.waitForFunction(() => /needs an API key/.test(document.getElementById('status').textContent));
  await page.fill('#api-key', KEY);
  await page.dispatchEvent('#api-key', 'change');
  await page.waitForFunction((name) => document.getElementById('model').textContent === name,
                             MODEL_NAME);

  await page.fill('#max-tokens', '40');
  await page.fill('#seed', '7');
  // Count the updates of the answer's text while it streams.
  await page.evaluate(() => {
    window.textUpdates = 0;
    new MutationObserver((records) => {
      for (const r of records)
        if (r.target.nodeType === Node.TEXT_NODE || r.target.classList?.contains('text'))
          window.textUpdates++;
    }).observe(document.getElementById('transcript'),
               { subtree: true, childList: true, characterData: true });
  });
  await say('Tell me about the sea.');
  await page.waitForSelector('.msg.assistant .stats', { timeout: 60_000 });
  const text = await lastAnswer().locator('.text').textContent();
  assert.ok(text.length > 0, 'the answer has text');
  assert.ok(await page.evaluate(() => window.textUpdates) >= 2,
            'the text arrived in several deltas, not at once');
  const stats = await lastAnswer().locator('.stats').textContent();
  assert.match(stats, /^40 tokens · TTFT \d+ ms · [\d.]+ tokens\/s · finish: length$/);
  assert.equal(await lastAnswer().getAttribute('aria-busy'), 'false');

  const chat = sent.filter((m) => m.type === 'chat');
  assert.equal(chat.length, 1);
  assert.deepEqual(chat[0].messages, [{ role: 'user', content: 'Tell me about the sea.' }]);
  assert.equal(chat[0].max_tokens, 40);
  assert.equal(chat[0].seed, 7);
  assert.equal(typeof chat[0].temperature, 'number');
  assert.equal(typeof chat[0].top_p, 'number');
  // The key went as the subprotocol, not in the URL.
  assert.equal(await page.evaluate(() => performance.getEntriesByType('resource')
    .some((e) => e.name.includes('api_key'))), false);
});

test('the next message carries the conversation; Stop cancels a long answer',
     { timeout: 120_000 }, async () => {
  const first = await lastAnswer().locator('.text').textContent();
  const before = await serverMetrics();
  await page.fill('#max-tokens', '3500');
  await say('Go on, at length.');
  // Text streams in, then the Stop button stops it.
  await page.waitForFunction(() => {
    const answers = document.querySelectorAll('.msg.assistant');
    return answers.length === 2 && answers[1].querySelector('.text').textContent.length > 20;
  }, null, { timeout: 60_000 });
  assert.equal(await page.isEnabled('#stop'), true);
  assert.equal(await page.isEnabled('#send'), false);
  await page.click('#stop');
  await eventually(async () => (await lastAnswer().locator('.stats').count()) === 1, 30_000);
  assert.match(await lastAnswer().locator('.stats').textContent(), /^stopped/);
  const stopped = await lastAnswer().locator('.text').textContent();
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(await lastAnswer().locator('.text').textContent(), stopped, 'no text after Stop');
  assert.equal(await page.isEnabled('#stop'), false);
  assert.equal(await page.isEnabled('#send'), true);

  const chat = sent.filter((m) => m.type === 'chat');
  assert.equal(chat.length, 2);
  assert.deepEqual(chat[1].messages, [
    { role: 'user', content: 'Tell me about the sea.' },
    { role: 'assistant', content: first },
    { role: 'user', content: 'Go on, at length.' },
  ]);
  const cancels = sent.filter((m) => m.type === 'cancel');
  assert.deepEqual(cancels, [{ type: 'cancel', id: chat[1].id }]);
  // The server ended it as cancelled, long before its 3500 tokens.
  const after = await eventually(async () => {
    const m = await serverMetrics();
    const key = 'metronome:request_cancelled_total';
    return (m.get(key) ?? 0) > (before.get(key) ?? 0) ? m : null;
  });
  assert.ok(after, 'the server counted a cancelled request');
  assert.equal(after.get('metronome:num_requests_running'), 0);
});

test('an error from the server is shown, and the page goes on', { timeout: 120_000 },
     async () => {
  await page.fill('#max-tokens', '24');
  await page.fill('#temperature', '5');
  await say('Be wild.');
  const error = page.locator('.msg.error').last();
  await error.waitFor({ timeout: 30_000 });
  assert.match(await error.textContent(), /invalid_value/);
  assert.match(await error.textContent(), /temperature/);
  assert.equal(await error.getAttribute('role'), 'alert');
  assert.equal(await page.isEnabled('#send'), true);

  // Fixed, the same connection answers again; the failed turn is not sent.
  await page.fill('#temperature', '0.7');
  await say('Once more, calmly.');
  await eventually(async () => (await page.locator('.msg.assistant .stats').count()) === 3, 60_000);
  assert.match(await lastAnswer().locator('.stats').textContent(), /24 tokens/);
  const chat = sent.filter((m) => m.type === 'chat');
  const last = chat[chat.length - 1];
  assert.deepEqual(last.messages.map((m) => m.role), ['user', 'assistant', 'user', 'assistant', 'user']);
  assert.equal(last.messages.at(-1).content, 'Once more, calmly.');
  assert.ok(!last.messages.some((m) => m.content === 'Be wild.'));

  fs.mkdirSync(path.dirname(SCREENSHOT), { recursive: true });
  await page.screenshot({ path: SCREENSHOT });
  assert.ok(fs.statSync(SCREENSHOT).size > 10_000);
});
