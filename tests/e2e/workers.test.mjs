// Workers over loopback with real processes (issue 38, item 2;
// docs/scale-out.md): `metronome serve --worker-listen` and `metronome
// worker --connect` processes on the tiny model, all on CPU executors.
// A worker killed with SIGKILL mid-stream: the streams it held end with an
// engine error and [DONE] (no hang), the others finish, the front end keeps
// serving on the rest, and no KV page stays in use anywhere. A worker
// stopped with SIGSTOP (a network partition, as the front end sees it) is
// removed within the heartbeat timeout and joins again, into its own slot,
// when it resumes; a worker that is started again after its kill does too.
// A worker of another model is refused, exits 2 and says why. A front end
// without replicas of its own (--data-parallel 0) serves through its
// workers alone: not ready before the first joins, a client leaving
// mid-stream frees its pages on the worker, 503 once no worker is left.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';

import {
  BIN, MODEL_NAME, eventually, freePort, metrics, openStream, postJson, sseData, startServer,
  stopProcess, tinyModel,
} from './lib/harness.mjs';

const HEARTBEAT = ['--set', 'workers.heartbeat_ms=200', '--set', 'workers.timeout_ms=1000'];
const TIMEOUT_MS = 1000;

/// Starts `metronome worker` joining `port` as `name` (`model`: the front
/// end's tiny model unless given). `attached` resolves once it says it is
/// attached, or rejects with its output when it exits first.
function spawnWorker(port, name, { model = tinyModel() } = {}) {
  const args = ['worker', '--model', model, '--connect', `127.0.0.1:${port}`, '--name', name,
                ...HEARTBEAT];
  const proc = spawn(BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  const exited = new Promise((resolve) => proc.on('close', (code, signal) => resolve({ code, signal })));
  const attached = new Promise((resolve, reject) => {
    proc.stdout.on('data', (chunk) => {
      out += chunk.toString();
      if (/attached to .* as replica \d+/.test(out))
        resolve();
    });
    proc.stderr.on('data', (c) => { out += c.toString(); });
    exited.then((e) => reject(new Error(`worker ${name} exited ${JSON.stringify(e)}:\n${out}`)));
  });
  attached.catch(() => {}); // a caller that does not wait for it checks the exit
  return { proc, name, exited, attached, output: () => out,
           replica: () => Number(/as replica (\d+)/.exec(out)?.[1]) };
}

/// spawnWorker, resolved once attached.
async function startWorker(port, name, options) {
  const w = spawnWorker(port, name, options);
  await w.attached;
  return w;
}

async function up(server, replica) {
  return (await metrics(server)).get(`metronome:replica_up{replica="${replica}"}`);
}

/// Nothing runs or waits anywhere, no request actor is alive and no KV page
/// is in use, the workers' included (their gauges come with the heartbeat).
async function settled(server) {
  return eventually(async () => {
    const m = await metrics(server);
    return m.get('metronome:num_requests_running') === 0
      && m.get('metronome:num_requests_waiting') === 0
      && m.get('metronome:request_actors_alive') === 0
      && m.get('metronome:kv_cache_usage_perc') === 0 ? m : null;
  }, 20_000, 100);
}

const LONG = { prompt: 'a long story', max_tokens: 400, ignore_eos: true, temperature: 0 };

test('a worker killed mid-stream: its streams fail cleanly, the rest go on', async (t) => {
  const wport = await freePort();
  const server = await startServer(['--worker-listen', `127.0.0.1:${wport}`, ...HEARTBEAT]);
  const workers = [];
  t.after(async () => {
    for (const w of workers)
      await stopProcess(w.proc);
    await server.stop();
  });
  workers.push(await startWorker(wport, 'w1'));
  workers.push(await startWorker(wport, 'w2'));
  const [w1, w2] = workers;
  assert.equal(w1.replica(), 1, w1.output());
  assert.equal(w2.replica(), 2, w2.output());
  assert.ok(await eventually(async () => (await up(server, 1)) === 1 && (await up(server, 2)) === 1));

  // Six long streams: the router spreads them over the three replicas.
  const streams = Array.from({ length: 6 }, () => openStream(server, LONG));
  await Promise.all(streams.map((s) => s.started));
  const placed = await metrics(server);
  const onW1 = placed.get('metronome:replica_routed_requests_total{replica="1"}');
  assert.ok(onW1 >= 1, 'no stream was placed on w1');
  assert.ok(placed.get('metronome:replica_routed_requests_total{replica="2"}') >= 1);

  w1.proc.kill('SIGKILL');
  const results = await Promise.all(streams.map((s) => s.done));
  let failed = 0;
  for (const r of results) {
    assert.equal(r.status, 200);
    const events = sseData(r.body);
    assert.equal(events.at(-1), '[DONE]', r.body.slice(-300));
    const last = JSON.parse(events.at(-2));
    if (last.error) {
      ++failed;
      assert.equal(last.error.code, 'engine_failure', r.body.slice(-300));
      assert.match(last.error.message, /worker running this request was lost/);
    } else {
      assert.equal(last.choices[0].finish_reason, 'length', r.body.slice(-300));
    }
  }
  assert.equal(failed, onW1, 'each stream on the killed worker fails, and only those');
  assert.equal(await up(server, 1), 0);

  // The front end keeps serving on the others.
  for (let i = 0; i < 4; ++i) {
    const r = await postJson(server, '/v1/completions',
                             { model: MODEL_NAME, prompt: `after ${i}`, max_tokens: 8 });
    assert.equal(r.status, 200, r.body);
  }
  const m = await settled(server);
  assert.ok(m, 'requests or KV pages left behind');
  assert.equal(m.get('metronome:replica_kv_cache_usage_perc{replica="2"}'), 0);
  assert.equal(m.get('metronome:worker_events_total{event="lost"}'), 1);

  // Started again, it gets its slot back and takes requests.
  workers[0] = await startWorker(wport, 'w1');
  assert.equal(workers[0].replica(), 1, workers[0].output());
  assert.ok(await eventually(async () => (await up(server, 1)) === 1));
});

test('a stopped worker is removed within the timeout and joins again when it resumes',
     async (t) => {
  const wport = await freePort();
  const server = await startServer(['--worker-listen', `127.0.0.1:${wport}`, ...HEARTBEAT]);
  const w = await startWorker(wport, 'w1');
  t.after(async () => {
    w.proc.kill('SIGCONT');
    await stopProcess(w.proc);
    await server.stop();
  });
  assert.ok(await eventually(async () => (await up(server, 1)) === 1));
  const stream = openStream(server, { ...LONG, max_tokens: 2000 });
  await stream.started;

  const stoppedAt = Date.now();
  w.proc.kill('SIGSTOP');
  assert.ok(await eventually(async () => (await up(server, 1)) === 0, 10_000, 20));
  const detectedMs = Date.now() - stoppedAt;
  // The timeout, plus a heartbeat interval and a poll's slack.
  assert.ok(detectedMs <= TIMEOUT_MS + 200 + 800, `detected after ${detectedMs} ms`);
  const r = await stream.done;
  assert.equal(sseData(r.body).at(-1), '[DONE]', r.body.slice(-300));
  const ok = await postJson(server, '/v1/completions',
                            { model: MODEL_NAME, prompt: 'while stopped', max_tokens: 8 });
  assert.equal(ok.status, 200, ok.body);

  w.proc.kill('SIGCONT');
  assert.ok(await eventually(async () => (await up(server, 1)) === 1, 15_000, 100),
            `did not join again:\n${w.output()}`);
  assert.ok(await settled(server), 'requests or KV pages left behind');
});

test('a worker of another model is refused and says why', async (t) => {
  const wport = await freePort();
  const server = await startServer(['--worker-listen', `127.0.0.1:${wport}`, ...HEARTBEAT]);
  t.after(() => server.stop());
  // The build's default model: another tokenizer and shape.
  const other = path.join(path.dirname(BIN), 'models', 'default');
  const w = spawnWorker(wport, 'stranger', { model: other });
  const { code } = await w.exited;
  assert.equal(code, 2, w.output());
  assert.match(w.output(), /refused this worker: .*another model/);
  assert.ok(await server.waitForLog(/worker stranger refused: the worker serves another model/),
            server.log());
  assert.equal(await up(server, 1), 0);
});

test('a front end without local replicas serves through its workers alone', async (t) => {
  const wport = await freePort();
  // The server is not healthy until a worker has joined: start both; the
  // worker retries until the front end listens.
  const w = spawnWorker(wport, 'only');
  let server;
  t.after(async () => {
    await stopProcess(w.proc);
    await server?.stop();
  });
  [server] = await Promise.all([
    startServer(['--worker-listen', `127.0.0.1:${wport}`, '--data-parallel', '0', ...HEARTBEAT]),
    w.attached]);
  assert.equal(w.replica(), 0, w.output());
  assert.ok(await server.waitForLog(/serving tiny \(workers\)/), server.log());
  assert.match(server.stdout(), /serving tiny \(workers\)/);
  const r = await postJson(server, '/v1/completions',
                           { model: MODEL_NAME, prompt: 'through the worker', max_tokens: 8 });
  assert.equal(r.status, 200, r.body);
  assert.equal(JSON.parse(r.body).usage.completion_tokens, 8);

  // A client that leaves mid-stream: the worker's scheduler, which watches
  // its request actor across the connection, cancels it and frees its
  // pages (the worker's gauges come with its heartbeat).
  const abort = new AbortController();
  const res = await fetch(`${server.url}/v1/completions`, {
    method: 'POST', signal: abort.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_NAME, stream: true, ...LONG, max_tokens: 2000 }),
  });
  const reader = res.body.getReader();
  await reader.read();
  const busy = await eventually(async () => {
    const m = await metrics(server);
    return m.get('metronome:replica_kv_cache_usage_perc{replica="0"}') > 0 ? m : null;
  }, 5_000, 50);
  assert.ok(busy, 'the stream never showed on the worker');
  abort.abort();
  await reader.read().catch(() => {});
  assert.ok(await settled(server), 'the left request kept pages or a request on the worker');

  w.proc.kill('SIGKILL');
  await w.exited;
  const gone = await eventually(async () => {
    const x = await postJson(server, '/v1/completions',
                             { model: MODEL_NAME, prompt: 'nobody left', max_tokens: 8 });
    return x.status === 503 ? x : null;
  }, 10_000, 100);
  assert.ok(gone, 'no 503 once the only worker was gone');
  assert.match(JSON.parse(gone.body).error.message, /none of its replicas is up/);
});
