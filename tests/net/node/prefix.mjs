// Automatic prefix caching through the server (the official OpenAI client):
// a conversation's next turn starts after the blocks its earlier turn left,
// usage.prompt_tokens_details.cached_tokens says how many, the text is the
// one a server without the cache gives, and /metrics counts the hits and
// the cached blocks (idle: none in use).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { closeServer, metrics, openServer, request, requireModel, specArgs, sseEvents } from './lib.mjs';

requireModel();

const BLOCK = 16;
let on, off;
before(async () => {
  on = await openServer([...specArgs().args, '--block-size', String(BLOCK)]);
  off = await openServer([...specArgs().args, '--block-size', String(BLOCK), '--no-prefix-cache']);
});
after(async () => {
  await closeServer(on.srv);
  await closeServer(off.srv);
});

const SYSTEM = 'You are a careful Python programmer. Answer with code only, no prose, and keep '
  + 'every function short, typed and documented with a one-line docstring.';
const N = 24;

async function chat(s, messages, extra = {}) {
  return s.client.chat.completions.create({ model: s.model, messages, max_tokens: N, temperature: 0, ...extra });
}

test('a next turn starts after the first turn\'s cached blocks, with the uncached text', async () => {
  const turn1 = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Write a function that adds two numbers.' }];
  const before = await metrics(on.srv); // (the server's own start-up requests count too)
  const a = await chat(on, turn1);
  const a0 = await chat(off, turn1);
  assert.equal(a.choices[0].message.content, a0.choices[0].message.content);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(a0.usage.prompt_tokens_details.cached_tokens, 0);

  // the same prompt again: every whole block but the one of the last token
  const again = await chat(on, turn1);
  const p = again.usage.prompt_tokens;
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, Math.floor((p - 1) / BLOCK) * BLOCK);
  assert.equal(again.choices[0].message.content, a.choices[0].message.content);

  // the next turn: the first turn's prompt and answer are cached
  const turn2 = [...turn1, { role: 'assistant', content: a.choices[0].message.content },
    { role: 'user', content: 'Now one that multiplies them.' }];
  const b = await chat(on, turn2);
  const b0 = await chat(off, turn2);
  assert.equal(b.choices[0].message.content, b0.choices[0].message.content);
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= Math.floor(a.usage.prompt_tokens / BLOCK) * BLOCK, `cached ${cached} of ${b.usage.prompt_tokens}`);
  assert.equal(cached % BLOCK, 0);
  assert.ok(cached < b.usage.prompt_tokens);
  assert.equal(b0.usage.prompt_tokens_details.cached_tokens, 0);

  const m = await metrics(on.srv);
  const delta = (k) => m.get(k) - before.get(k);
  assert.equal(delta('specd_prefix_cache_hit_tokens_total'),
    again.usage.prompt_tokens_details.cached_tokens + cached);
  assert.equal(delta('specd_prefix_cache_queried_tokens_total'),
    2 * a.usage.prompt_tokens + b.usage.prompt_tokens);
  assert.ok(m.get('specd_kv_blocks_cached') > 0);
  assert.equal(m.get('specd_kv_blocks_used'), 0);
  const m0 = await metrics(off.srv);
  assert.equal(m0.get('specd_prefix_cache_hit_tokens_total'), 0);
  assert.equal(m0.get('specd_kv_blocks_cached'), 0);
});

test('completions and a stream\'s usage chunk report the cached tokens', async () => {
  const prompt = `${SYSTEM}\n\ndef parse_config(path: str) -> dict:\n`;
  const first = await on.client.completions.create({ model: on.model, prompt, max_tokens: N, temperature: 0 });
  const r = await request(on.srv, 'POST', '/v1/completions', {
    body: { model: on.model, prompt, max_tokens: N, temperature: 0, stream: true, stream_options: { include_usage: true } },
  });
  assert.equal(r.status, 200);
  const chunks = sseEvents(r.text).slice(0, -1).map((e) => JSON.parse(e));
  const usage = chunks.at(-1).usage;
  assert.ok(usage, 'a usage chunk');
  assert.equal(usage.prompt_tokens, first.usage.prompt_tokens);
  assert.equal(usage.prompt_tokens_details.cached_tokens, Math.floor((usage.prompt_tokens - 1) / BLOCK) * BLOCK);
  const text = chunks.map((c) => c.choices[0]?.text ?? '').join('');
  assert.equal(text, first.choices[0].text);
});
