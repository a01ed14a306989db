// A client that goes away cancels its request and frees its KV blocks, in
// each state a request can be in: queued, prefill, decode, and waiting for a
// non-streaming response. Within 1 s of the disconnect /metrics must show
// the request cancelled, nothing running and the KV cache back to idle.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { metrics, requireModel, sleep, startServer, until } from './lib.mjs';

requireModel();

let srv, model, ctx, idleKv;

before(async () => {
  // One running sequence, so that a second request queues; the smallest
  // prefill chunk, so that a long prompt stays in prefill for many steps.
  srv = await startServer(['--max-batch', '1', '--max-batch-tokens', '16']);
  const r = await fetch(`${srv.base()}/v1/models`).then((x) => x.json());
  model = r.data[0].id;
  ctx = r.data[0].max_model_len;
  idleKv = (await metrics(srv)).get('specd_kv_blocks_used');
});

after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `exit after SIGTERM:\n${srv.log.slice(-3000)}`);
});

// A request on its own socket; destroy() is the disconnect.
function open(path, body) {
  const data = JSON.stringify(body);
  const st = { bytes: 0, text: '', status: 0, closed: false };
  st.req = http.request({ host: '127.0.0.1', port: srv.port, method: 'POST', path, agent: false,
    headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
    st.status = res.statusCode;
    res.on('data', (c) => { st.bytes += c.length; st.text += c; });
    res.on('error', () => {});
  });
  st.req.on('error', () => {});
  st.req.on('socket', (s) => s.on('connect', () => (st.port = s.localPort)));
  st.req.end(data);
  return st;
}

const get = async (name) => (await metrics(srv)).get(name);
const cancelled = () => get('specd_requests_total{outcome="cancelled"}');

// Disconnects st and waits (at most 1 s) for the cancel to show.
async function disconnectAndCheck(st, wantCancelled, { running = 0, idle = true } = {}) {
  const t0 = Date.now();
  st.req.destroy();
  const ok = await until(async () => {
    const m = await metrics(srv);
    return m.get('specd_requests_total{outcome="cancelled"}') === wantCancelled &&
      m.get('specd_requests_running') === running && m.get('specd_queue_depth') === 0 &&
      (!idle || m.get('specd_kv_blocks_used') === idleKv);
  }, 1000, 5);
  const m = await metrics(srv);
  assert.ok(ok, `1 s after the disconnect: cancelled ${m.get('specd_requests_total{outcome="cancelled"}')} (want ${wantCancelled}), ` +
    `running ${m.get('specd_requests_running')}, queued ${m.get('specd_queue_depth')}, KV used ${m.get('specd_kv_blocks_used')} (idle ${idleKv})`);
  return Date.now() - t0;
}

// The log line of the request on that client port.
function logLine(st) {
  const re = new RegExp(`request \\d+ 499 finish=cancelled prompt=(\\d+) completion=(\\d+).* peer 127\\.0\\.0\\.1:${st.port}\\n`);
  return re.exec(srv.log);
}

const longDecode = () => ({ model, prompt: 'def main():', max_tokens: ctx - 32, temperature: 0, ignore_eos: true });

test('disconnect while queued', async () => {
  const c0 = await cancelled();
  const a = open('/v1/completions', { ...longDecode(), stream: true });
  assert.ok(await until(async () => a.bytes > 0, 30000), 'the first request produced nothing');
  const b = open('/v1/completions', { ...longDecode(), stream: true });
  assert.ok(await until(async () => (await get('specd_queue_depth')) === 1, 5000), 'the second request did not queue');
  await disconnectAndCheck(b, c0 + 1, { running: 1, idle: false });
  assert.equal(b.bytes, 0);
  assert.match(logLine(b)[0], /completion=0 /);
  await disconnectAndCheck(a, c0 + 2);
});

test('disconnect during prefill', async () => {
  // A prompt near the context length, 16 tokens per step: many prefill
  // steps. Disconnect while the KV blocks in use are fewer than the prompt
  // needs; the log then proves no token was generated.
  const n = ctx - 8;
  const full = Math.ceil(n / 16);
  let hit = false;
  for (let attempt = 0; attempt < 5 && !hit; attempt++) {
    const c0 = await cancelled();
    const ids = Array.from({ length: n }, (_, i) => 10 + (i % 50));
    const a = open('/v1/completions', { model, prompt: ids, max_tokens: 4, stream: true });
    let inPrefill = false;
    await until(async () => {
      const m = await metrics(srv);
      const used = m.get('specd_kv_blocks_used') - idleKv;
      inPrefill = m.get('specd_requests_running') === 1 && used > 0 && used < full - 4;
      return inPrefill || used >= full - 4 || a.bytes > 0;
    }, 30000, 2);
    await disconnectAndCheck(a, c0 + 1);
    const line = logLine(a);
    assert.ok(line, `no log line for the cancelled request:\n${srv.log.slice(-2000)}`);
    hit = inPrefill && line[2] === '0';
  }
  assert.ok(hit, 'never caught a request in prefill (5 attempts)');
});

test('disconnect during streaming decode', async () => {
  const c0 = await cancelled();
  const a = open('/v1/completions', { ...longDecode(), stream: true });
  assert.ok(await until(async () => (a.text.match(/"text":/g) || []).length >= 3, 30000), 'no tokens streamed');
  await disconnectAndCheck(a, c0 + 1);
  assert.ok(Number(logLine(a)[2]) > 0);
});

test('disconnect while waiting for a non-streaming response', async () => {
  const c0 = await cancelled();
  const s0 = await get('specd_engine_steps_total');
  const a = open('/v1/chat/completions', { model, messages: [{ role: 'user', content: 'Count to a thousand.' }], max_tokens: ctx - 64, temperature: 0, ignore_eos: true });
  // decoding: running, and the engine has stepped past the prefill
  assert.ok(await until(async () => (await get('specd_requests_running')) === 1 && (await get('specd_engine_steps_total')) > s0 + 8, 30000));
  await sleep(50);
  assert.equal(a.bytes, 0);
  await disconnectAndCheck(a, c0 + 1);
  assert.ok(Number(logLine(a)[2]) > 0);
});
