// Loopback load: 256 concurrent streaming clients, bounded in time. Every
// stream must be well-formed and complete, with no error; afterwards the
// server's resident memory must be back to its idle level.
//
// "Idle level" is measured, not assumed: a first full round (same 256
// clients) brings the allocator's pools, the engine's batch buffers and the
// connection structures to their working size; RSS once idle after it is the
// baseline. Three more rounds (768 requests) follow, and RSS once idle again
// may exceed the baseline by at most 8 MiB: a leak of 11 KiB per request or
// more fails. LeakSanitizer (the CI build) checks the exit on top of that.
// The ASan quarantine is turned off for this server, since it would hold
// freed memory (up to 256 MiB) out of reuse and look like growth.
//
// The model is the small test model (tests/net/fixtures/tiny-chat, 2 layers,
// hidden 64) whatever the other tests serve: this test measures the server
// (connections, SSE, queueing, memory), and a model 50 times cheaper per
// token keeps four rounds of 256 streams within a minute on a 2-core CI
// machine under ASan.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { SMALL_MODEL, checkStream, metrics, requireModel, rssBytes, sleep, startServer, until } from './lib.mjs';

requireModel(SMALL_MODEL);

const CLIENTS = 256;
const TOKENS = 12;
const ROUND_MS = 120000;
let srv, model;

before(async () => {
  const asan = process.env.ASAN_OPTIONS ? `${process.env.ASAN_OPTIONS}:` : '';
  srv = await startServer(['--max-queued', String(CLIENTS)], { ASAN_OPTIONS: `${asan}quarantine_size_mb=0` }, { model: SMALL_MODEL });
  model = (await fetch(`${srv.base()}/v1/models`).then((x) => x.json())).data[0].id;
});

after(async () => {
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, `exit after SIGTERM:\n${srv.log.slice(-3000)}`);
});

// One streaming client on its own connection; resolves with the parsed stream.
function client(i) {
  const chat = i % 2 === 0;
  const body = JSON.stringify(chat
    ? { model, messages: [{ role: 'user', content: `Request ${i}: print a number.` }], max_tokens: TOKENS, temperature: 0.7, seed: i, stream: true, stream_options: { include_usage: true } }
    : { model, prompt: `# request ${i}\nx = `, max_tokens: TOKENS, temperature: 0.7, seed: i, stream: true, stream_options: { include_usage: true } });
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: srv.port, method: 'POST', agent: false,
      path: chat ? '/v1/chat/completions' : '/v1/completions',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      const parts = [];
      res.on('data', (c) => parts.push(c));
      res.on('end', () => {
        try {
          if (res.statusCode !== 200) throw new Error(`status ${res.statusCode}: ${Buffer.concat(parts)}`);
          const text = new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(parts));
          const s = checkStream(text, { chat, includeUsage: true });
          if (s.usage.completion_tokens < 1 || s.usage.completion_tokens > TOKENS) throw new Error(`completion_tokens ${s.usage.completion_tokens}`);
          if (s.finish === 'length' && s.usage.completion_tokens !== TOKENS) throw new Error('length finish before max_tokens');
          resolve(s);
        } catch (e) {
          reject(new Error(`client ${i}: ${e.message}`));
        }
      });
      res.on('error', (e) => reject(new Error(`client ${i}: ${e.message}`)));
    });
    req.on('error', (e) => reject(new Error(`client ${i}: ${e.message}`)));
    req.end(body);
  });
}

async function round() {
  const t0 = Date.now();
  let timer;
  const timeout = new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`round not done in ${ROUND_MS} ms`)), ROUND_MS); });
  const res = await Promise.race([Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i))), timeout]);
  clearTimeout(timer);
  return { res, ms: Date.now() - t0 };
}

async function idleRss() {
  const idle = await until(async () => {
    const m = await metrics(srv);
    return m.get('specd_requests_running') === 0 && m.get('specd_queue_depth') === 0 && m.get('specd_http_connections') <= 1;
  }, 10000);
  assert.ok(idle, 'the server did not go idle');
  await sleep(200);
  return rssBytes(srv.child.pid);
}

test(`${CLIENTS} concurrent streaming clients, all complete, memory back to idle`, async () => {
  const m0 = await metrics(srv);
  const first = await round();
  assert.equal(first.res.length, CLIENTS);
  const base = await idleRss();
  let total = CLIENTS;
  for (let r = 0; r < 3; r++) {
    const { res, ms } = await round();
    assert.equal(res.length, CLIENTS);
    total += res.length;
    console.log(`# round ${r + 2}: ${CLIENTS} streams in ${ms} ms`);
  }
  const end = await idleRss();
  console.log(`# RSS idle after the first round ${(base / 2 ** 20).toFixed(1)} MiB, after ${total} requests ${(end / 2 ** 20).toFixed(1)} MiB`);
  assert.ok(end <= base + 8 * 2 ** 20, `RSS grew from ${base} to ${end} bytes over ${total - CLIENTS} requests`);
  const m = await metrics(srv);
  const done = (k) => m.get(`specd_requests_total{outcome="${k}"}`) - m0.get(`specd_requests_total{outcome="${k}"}`);
  assert.equal(done('stop') + done('length'), total);
  for (const k of ['cancelled', 'error', 'rejected', 'overloaded']) assert.equal(done(k), 0, k);
  assert.equal(m.get('specd_kv_blocks_used'), m0.get('specd_kv_blocks_used'));
});
