// Connection limits of the real server (issue 39, item 2), run under a
// small file descriptor limit (ulimit -n): the default max_connections is
// sized from it, /health is answered while the connection table is full,
// other requests over the limit get 503 with Retry-After, a freed slot is
// used again; with a limit set above the descriptors, failed accepts
// (EMFILE) are logged at most once a second and the server recovers; a
// client trickling its request is cut at server.header_timeout_s.

import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';

import { MODEL_NAME, eventually, postJson, rawRequest, sleep, startServer } from './lib/harness.mjs';

/// An idle TCP connection (connected, never sends).
function connect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => resolve(s));
    s.once('error', reject);
    s.on('close', () => {});
  });
}

const completion = { model: MODEL_NAME, prompt: 'hi', max_tokens: 2 };

test('default max_connections from ulimit -n; /health answers while full; 503 + Retry-After',
     { timeout: 120_000 }, async () => {
  const FD_LIMIT = 256;
  const server = await startServer([], { fdLimit: FD_LIMIT });
  const sockets = [];
  try {
    const m = /accepting up to (\d+) connections \(file descriptor limit (\d+)\)/.exec(server.log());
    assert.ok(m, server.log());
    assert.equal(Number(m[2]), FD_LIMIT);
    const limit = Number(m[1]);
    assert.equal(limit, FD_LIMIT - 128 - Math.floor(FD_LIMIT / 10));
    // Fill the table. Accepts are in connection order, so every later
    // connection comes after these.
    for (let i = 0; i < limit; ++i)
      sockets.push(await connect(server.port));

    for (let i = 0; i < 3; ++i) {
      const h = await rawRequest(server, { path: '/health' });
      assert.equal(h.status, 200, h.body);
      assert.equal(JSON.parse(h.body).status, 'ok');
      assert.equal(h.headers.connection, 'close');
    }
    const r = await postJson(server, '/v1/completions', completion);
    assert.equal(r.status, 503, r.body);
    assert.equal(r.headers['retry-after'], '1');
    assert.equal(JSON.parse(r.body).error.code, 'too_many_connections');

    // A connection that leaves gives its slot back.
    sockets.pop().destroy();
    const ok = await eventually(async () =>
      (await postJson(server, '/v1/completions', completion)).status === 200, 10_000);
    assert.equal(ok, true);
    assert.doesNotMatch(server.log(), /accept failed/);
    assert.ok(await server.waitForLog(/connection limit reached/), server.log());
  } finally {
    sockets.forEach((s) => s.destroy());
    await server.stop();
  }
});

test('accept failures (EMFILE) are logged at most once a second, and the server recovers',
     { timeout: 120_000 }, async () => {
  const server = await startServer(['--set', 'server.max_connections=100000'], { fdLimit: 128 });
  const sockets = [];
  try {
    assert.ok(await server.waitForLog(/is not below the file descriptor limit/), server.log());
    // More connections than descriptors: the kernel completes them, accept
    // fails with EMFILE.
    for (let i = 0; i < 200; ++i)
      sockets.push(await connect(server.port));
    const before = server.log().split('\n').filter((l) => l.includes('accept failed')).length;
    await sleep(3_000);
    const lines = server.log().split('\n').filter((l) => l.includes('accept failed'));
    assert.ok(lines.length >= 1, server.log().slice(-2000));
    assert.match(lines[0], /Too many open files/);
    // About one report a second (the old loop wrote one every 100 ms).
    assert.ok(lines.length - before <= 4, `${lines.length - before} reports in 3 s:\n${lines.join('\n')}`);
    sockets.forEach((s) => s.destroy());
    sockets.length = 0;
    const healthy = await eventually(async () => {
      try {
        return (await rawRequest(server, { path: '/health' })).status === 200;
      } catch {
        return false;
      }
    }, 15_000);
    assert.equal(healthy, true, 'the server did not accept again');
  } finally {
    sockets.forEach((s) => s.destroy());
    await server.stop();
  }
});

test('a client trickling its request is cut at server.header_timeout_s', { timeout: 60_000 },
     async () => {
  const server = await startServer(['--set', 'server.header_timeout_s=1']);
  try {
    const s = await connect(server.port);
    const closed = new Promise((resolve) => s.once('close', resolve));
    s.on('error', () => {});
    s.write(`GET /health HTTP/1.1\r\nHost: 127.0.0.1:${server.port}\r\n`);
    const t0 = Date.now();
    const timer = setInterval(() => { if (!s.destroyed) s.write('X'); }, 200);
    const outcome = await Promise.race([closed.then(() => 'closed'), sleep(6_000).then(() => 'open')]);
    clearInterval(timer);
    s.destroy();
    assert.equal(outcome, 'closed', 'a trickling client kept its connection');
    assert.ok(Date.now() - t0 < 4_000);
  } finally {
    await server.stop();
  }
});
