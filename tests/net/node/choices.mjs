// n > 1 through the official OpenAI client: one request, n choices, each an
// engine request of its own. Greedy choices equal the n = 1 text; a seeded
// request's choice i equals the n = 1 request with seed + i (each choice its
// own draw); the stream carries every choice's role, text and finish under
// its index, and usage sums the choices' completions over one prompt; a
// client that leaves cancels every choice. A batch of prompts is n choices
// of each, prompt-major.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { closeServer, metrics, openServer, request, requireModel, specArgs, sseEvents, until } from './lib.mjs';

requireModel();

let srv, client, model;
before(async () => ({ srv, client, model } = await openServer([...specArgs().args, '--max-batch', '8'])));
after(() => closeServer(srv));

const PROMPT = 'def fibonacci(n):';
const MESSAGES = [{ role: 'user', content: 'Write a function that adds two numbers.' }];
const N = 20;

test('greedy: n choices, each the n = 1 text; usage counts the prompt once', async () => {
  const one = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0 });
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0, n: 3 });
  assert.equal(r.choices.length, 3);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.equal(c.text, one.choices[0].text);
    assert.equal(c.finish_reason, one.choices[0].finish_reason);
  });
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 3 * one.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const chat = await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: N, temperature: 0, n: 2 });
  assert.equal(chat.choices.length, 2);
  assert.equal(chat.choices[0].message.content, chat.choices[1].message.content);
  assert.equal(chat.choices[1].index, 1);
});

test('sampled with a seed: choice i is the n = 1 request with seed + i', async () => {
  const seed = 1234;
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 1, seed, n: 4 });
  assert.equal(r.choices.length, 4);
  for (let i = 0; i < 4; i++) {
    const one = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 1, seed: seed + i });
    assert.equal(r.choices[i].text, one.choices[0].text, `choice ${i}`);
  }
  // four draws: not all the same text (the bundled model samples widely at
  // temperature 1; a fixed seed makes this deterministic)
  assert.ok(new Set(r.choices.map((c) => c.text)).size > 1, JSON.stringify(r.choices.map((c) => c.text)));
});

test('streaming: every choice has its role, its text and one finish under its index', async () => {
  const full = await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: N, temperature: 1, seed: 99, n: 3 });
  const r = await request(srv, 'POST', '/v1/chat/completions', {
    body: { model, messages: MESSAGES, max_tokens: N, temperature: 1, seed: 99, n: 3, stream: true, stream_options: { include_usage: true } },
  });
  assert.equal(r.status, 200);
  const ev = sseEvents(r.text);
  assert.equal(ev.at(-1), '[DONE]');
  const chunks = ev.slice(0, -1).map((e) => JSON.parse(e));
  const text = ['', '', ''], finish = [null, null, null], seen = [false, false, false];
  let usage = null;
  for (const c of chunks) {
    assert.equal(c.id, chunks[0].id);
    assert.equal(usage, null, 'a chunk after the usage chunk');
    if (c.usage) {
      assert.equal(c.choices.length, 0);
      usage = c.usage;
      continue;
    }
    assert.equal(c.choices.length, 1);
    const ch = c.choices[0];
    assert.ok(ch.index >= 0 && ch.index < 3, `index ${ch.index}`);
    assert.equal(finish[ch.index], null, `a chunk of choice ${ch.index} after its finish`);
    if (!seen[ch.index]) assert.equal(ch.delta.role, 'assistant', `choice ${ch.index}'s first chunk`);
    else assert.equal(ch.delta.role, undefined);
    seen[ch.index] = true;
    text[ch.index] += ch.delta.content ?? '';
    finish[ch.index] = ch.finish_reason;
  }
  for (let i = 0; i < 3; i++) {
    assert.equal(text[i], full.choices[i].message.content, `choice ${i}`);
    assert.equal(finish[i], full.choices[i].finish_reason);
  }
  assert.equal(usage.completion_tokens, full.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, full.usage.prompt_tokens);
  // the official client reads the same stream
  const stream = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, temperature: 0, n: 2, stream: true });
  const got = ['', ''];
  for await (const c of stream) for (const ch of c.choices) got[ch.index] += ch.text;
  assert.equal(got[0], got[1]);
  assert.ok(got[0].length > 0);
});

test('a batch of prompts: n choices of each, prompt-major, usage over every prompt once', async () => {
  const B = 'class Stack:';
  const a = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0 });
  const b = await client.completions.create({ model, prompt: B, max_tokens: N, temperature: 0 });
  const r = await client.completions.create({ model, prompt: [PROMPT, B], max_tokens: N, temperature: 0, n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(r.choices.map((c) => c.text), [a, a, b, b].map((x) => x.choices[0].text));
  assert.equal(r.usage.prompt_tokens, a.usage.prompt_tokens + b.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 2 * (a.usage.completion_tokens + b.usage.completion_tokens));
  // token-id prompts too, and a batch of one is the plain request
  const ids = JSON.parse((await request(srv, 'POST', '/tokenize', { body: { model, prompt: B } })).text).tokens;
  const t = await client.completions.create({ model, prompt: [ids, PROMPT], max_tokens: N, temperature: 0 });
  assert.deepEqual(t.choices.map((c) => c.text), [b.choices[0].text, a.choices[0].text]);
  const one = await client.completions.create({ model, prompt: [B], max_tokens: N, temperature: 0 });
  assert.equal(one.choices.length, 1);
  assert.equal(one.choices[0].text, b.choices[0].text);
  // streamed: each choice under its index
  const stream = await client.completions.create({ model, prompt: [PROMPT, B], max_tokens: N, temperature: 0, stream: true });
  const got = ['', ''];
  for await (const c of stream) for (const ch of c.choices) got[ch.index] += ch.text;
  assert.deepEqual(got, [a.choices[0].text, b.choices[0].text]);
  // a prompt past the context names the prompt; /tokenize takes one prompt
  const big = await request(srv, 'POST', '/v1/completions', { body: { model, prompt: [PROMPT, new Array(100000).fill(5)] } });
  assert.equal(big.status, 400, big.text);
  assert.equal(JSON.parse(big.text).error.param, 'prompt');
  const tk = await request(srv, 'POST', '/tokenize', { body: { model, prompt: [PROMPT, B] } });
  assert.equal(tk.status, 400, tk.text);
  assert.equal(JSON.parse(tk.text).error.param, 'prompt');
  const many = await request(srv, 'POST', '/v1/completions', { body: { model, prompt: [PROMPT, B], n: 65 } });
  assert.equal(many.status, 400, many.text);
  assert.equal(JSON.parse(many.text).error.param, 'n');
});

test('a client that leaves cancels every choice', async () => {
  const get = async (name) => (await metrics(srv)).get(name);
  const before = await get('specd_requests_total{outcome="cancelled"}');
  const data = JSON.stringify({ model, prompt: PROMPT, max_tokens: 2000, temperature: 0, ignore_eos: true, n: 4, stream: true });
  const req = http.request({ host: '127.0.0.1', port: srv.port, method: 'POST', path: '/v1/completions', agent: false,
    headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => res.on('data', () => {}).on('error', () => {}));
  req.on('error', () => {});
  req.end(data);
  assert.ok(await until(async () => (await get('specd_requests_running')) === 4, 10000), 'four choices running');
  req.destroy();
  const ok = await until(async () => {
    const m = await metrics(srv);
    return m.get('specd_requests_running') === 0 && m.get('specd_queue_depth') === 0 &&
      m.get('specd_requests_total{outcome="cancelled"}') === before + 1;
  }, 2000, 10);
  assert.ok(ok, 'the choices did not all end on the disconnect');
});

test('n out of range is a 400 naming n', async () => {
  for (const n of [0, 129, 'two']) {
    const r = await request(srv, 'POST', '/v1/completions', { body: { model, prompt: PROMPT, n } });
    assert.equal(r.status, 400, r.text);
    assert.equal(JSON.parse(r.text).error.param, 'n');
  }
});
