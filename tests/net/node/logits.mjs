// The logits through the official OpenAI client, with speculative decoding
// on. Log probabilities: chat's logprobs.content (one entry a token: its
// text, bytes, logprob and top_logprobs) and completions' parallel arrays,
// streamed and not, equal; greedy tokens are their position's likeliest;
// the tokens' bytes make the text; asking for logprobs changes no text.
// logit_bias and the penalties: a +100 bias makes every token that token,
// the penalties change a greedy text and keep it the same streamed.
// response_format json_object: a finished text is a JSON object, streamed
// the same; json_schema: a finished text is a document of the schema (keys
// in its order, types, bounds), streamed the same, and a schema outside the
// subset is a 400 naming response_format.json_schema.schema. The
// values themselves are checked against transformers in
// tests/engine/test_logits.c.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { closeServer, metrics, openServer, request, requireModel, specArgs, sseEvents } from './lib.mjs';

requireModel();

let srv, client, model;
before(async () => ({ srv, client, model } = await openServer([...specArgs().args, '--max-batch', '8'])));
after(() => closeServer(srv));

const MESSAGES = [{ role: 'user', content: 'Write a function that adds two numbers.' }];
const PROMPT = 'def fibonacci(n):';
const N = 24;

function checkEntry(e, top) {
  assert.equal(typeof e.token, 'string');
  assert.ok(e.logprob <= 0, `logprob ${e.logprob}`);
  assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => b >= 0 && b < 256));
  assert.equal(e.top_logprobs.length, top);
  for (let i = 1; i < top; i++) assert.ok(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob);
  assert.ok(e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0) <= 1 + 1e-5);
}

test('chat: one entry a token, greedy tokens the likeliest, bytes make the text, streamed the same', async () => {
  const plain = await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: N, temperature: 0, ignore_eos: true });
  const r = await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: N, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3 });
  const ch = r.choices[0];
  assert.equal(ch.message.content, plain.choices[0].message.content);
  assert.equal(plain.choices[0].logprobs, null);
  const content = ch.logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    checkEntry(e, 3);
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6);
  }
  assert.equal(Buffer.from(content.flatMap((e) => e.bytes)).toString('utf8'), ch.message.content);

  const s = await request(srv, 'POST', '/v1/chat/completions', {
    body: { model, messages: MESSAGES, max_tokens: N, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3, stream: true },
  });
  const got = [];
  let text = '';
  for (const e of sseEvents(s.text).slice(0, -1).map((x) => JSON.parse(x))) {
    const c = e.choices[0];
    text += c.delta.content ?? '';
    if (c.logprobs) got.push(...c.logprobs.content);
  }
  assert.equal(text, ch.message.content);
  assert.deepEqual(got.map((e) => e.token), content.map((e) => e.token));
  got.forEach((e, i) => assert.ok(Math.abs(e.logprob - content[i].logprob) < 1e-5));
});

test('completions: tokens, token_logprobs, top_logprobs and text_offset, streamed the same', async () => {
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0, ignore_eos: true, logprobs: 2 });
  const ch = r.choices[0];
  const lp = ch.logprobs;
  assert.equal(lp.tokens.length, r.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.tokens.join(''), ch.text);
  let off = 0;
  lp.tokens.forEach((t, i) => {
    assert.equal(lp.text_offset[i], off);
    off += Buffer.byteLength(t);
    assert.ok(Object.keys(lp.top_logprobs[i]).length <= 2);
    assert.ok(Math.abs(lp.top_logprobs[i][t] - lp.token_logprobs[i]) < 1e-6, `token ${i}`);
  });
  const stream = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0, ignore_eos: true, logprobs: 2, stream: true });
  const toks = [], offs = [];
  for await (const c of stream)
    for (const x of c.choices) if (x.logprobs) { toks.push(...x.logprobs.tokens); offs.push(...x.logprobs.text_offset); }
  assert.deepEqual(toks, lp.tokens);
  assert.deepEqual(offs, lp.text_offset);
});

test('completions echo: the prompt comes back first, with its tokens\' logprobs (lm-eval\'s loglikelihood)', async () => {
  // echo alone: the prompt's text, then the completion's
  const plain = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, temperature: 0 });
  const e = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, temperature: 0, echo: true });
  assert.equal(e.choices[0].text, PROMPT + plain.choices[0].text);
  assert.equal(e.choices[0].logprobs, null);
  // a greedy continuation's logprobs, then the same tokens given back in
  // the prompt (token ids, as lm-eval sends them): each prompt token's
  // logprob is the one it had when generated
  const tok = await request(srv, 'POST', '/tokenize', { body: { model, prompt: PROMPT } });
  const ids = JSON.parse(tok.text).tokens;
  const gen = await client.completions.create({ model, prompt: ids, max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 1 });
  const g = gen.choices[0].logprobs;
  // the continuation's ids (its text tokenized again: where that differs
  // from what was generated, the comparison below stops)
  const again = await request(srv, 'POST', '/tokenize', { body: { model, prompt: PROMPT + gen.choices[0].text } });
  const genIds = JSON.parse(again.text).tokens.slice(ids.length);
  const full = [...ids, ...genIds.slice(0, 4)];
  const body = { model, prompt: full, max_tokens: 1, temperature: 0, logprobs: 1, echo: true };
  const r = await request(srv, 'POST', '/v1/completions', { body });
  assert.equal(r.status, 200, r.text);
  const c = JSON.parse(r.text).choices[0];
  const lp = c.logprobs;
  assert.equal(lp.tokens.length, full.length + 1);
  assert.equal(lp.token_logprobs[0], null);
  assert.equal(lp.top_logprobs[0], null);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 1; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `entry ${i}`);
    assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    assert.ok(Object.keys(lp.top_logprobs[i]).length >= 1);
  }
  // the prompt's last tokens were the greedy continuation: their logprobs
  // are the generated ones, and each is its position's likeliest
  let same = 0;
  for (let i = 0; i < Math.min(4, genIds.length) && g.tokens[i] === lp.tokens[ids.length + i]; i++, same++) {
    assert.ok(Math.abs(lp.token_logprobs[ids.length + i] - g.token_logprobs[i]) < 1e-4, `prompt token ${ids.length + i}`);
    const top = lp.top_logprobs[ids.length + i];
    assert.ok(Math.abs(Math.max(...Object.values(top)) - lp.token_logprobs[ids.length + i]) < 1e-6);
  }
  assert.ok(same > 0, 'no generated token to compare');
  // streamed: the same text and entries
  const st = await request(srv, 'POST', '/v1/completions', { body: { ...body, stream: true } });
  const chunks = sseEvents(st.text).slice(0, -1).map((x) => JSON.parse(x));
  let text = '';
  const toks = [], lps = [], offs = [];
  for (const x of chunks) for (const ch of x.choices) {
    text += ch.text;
    if (ch.logprobs) { toks.push(...ch.logprobs.tokens); lps.push(...ch.logprobs.token_logprobs); offs.push(...ch.logprobs.text_offset); }
  }
  assert.equal(text, c.text);
  assert.deepEqual(toks, lp.tokens);
  assert.deepEqual(offs, lp.text_offset);
  lps.forEach((x, i) => assert.ok(x === lp.token_logprobs[i] || Math.abs(x - lp.token_logprobs[i]) < 1e-6));
  // max_tokens 0: the prompt alone, with the same entries (an evaluation's
  // scoring); without echo a 400
  const z = await request(srv, 'POST', '/v1/completions', { body: { ...body, max_tokens: 0 } });
  assert.equal(z.status, 200, z.text);
  const zc = JSON.parse(z.text);
  assert.equal(zc.choices[0].finish_reason, 'length');
  assert.equal(zc.usage.completion_tokens, 0);
  assert.equal(zc.usage.prompt_tokens, full.length);
  assert.deepEqual(zc.choices[0].logprobs.tokens, lp.tokens.slice(0, full.length));
  zc.choices[0].logprobs.token_logprobs.forEach((x, i) => assert.ok(x === lp.token_logprobs[i] || Math.abs(x - lp.token_logprobs[i]) < 1e-6));
  const z0 = await request(srv, 'POST', '/v1/completions', { body: { model, prompt: PROMPT, max_tokens: 0 } });
  assert.equal(z0.status, 400, z0.text);
  assert.equal(JSON.parse(z0.text).error.param, 'max_tokens');
  // chat has no echo
  const bad = await request(srv, 'POST', '/v1/chat/completions', { body: { model, messages: MESSAGES, echo: true } });
  assert.equal(bad.status, 400, bad.text);
});

test('sampled, with a seed: the same text with logprobs asked or not; n choices each with theirs', async () => {
  const base = { model, prompt: PROMPT, max_tokens: N, temperature: 0.9, seed: 7 };
  const a = await client.completions.create(base);
  const b = await client.completions.create({ ...base, logprobs: 0 });
  assert.equal(b.choices[0].text, a.choices[0].text);
  assert.ok(b.choices[0].logprobs.token_logprobs.every((x) => x <= 0));
  const n = await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: 8, temperature: 1, seed: 3, n: 2, logprobs: true });
  for (const c of n.choices) assert.equal(c.logprobs.content.length > 0, true);
});

test('bad logprobs options are 400s naming them', async () => {
  const post = (p, body) => request(srv, 'POST', p, { body });
  const cases = [
    ['/v1/chat/completions', { model, messages: MESSAGES, top_logprobs: 2 }, 'top_logprobs'],
    ['/v1/chat/completions', { model, messages: MESSAGES, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    ['/v1/chat/completions', { model, messages: MESSAGES, logprobs: 1 }, 'logprobs'],
    ['/v1/completions', { model, prompt: PROMPT, logprobs: 21 }, 'logprobs'],
    ['/v1/completions', { model, prompt: PROMPT, logprobs: true }, 'logprobs'],
  ];
  for (const [p, body, param] of cases) {
    const r = await post(p, body);
    assert.equal(r.status, 400, r.text);
    assert.equal(JSON.parse(r.text).error.param, param);
  }
});

test('logit_bias and the penalties', async () => {
  const ids = JSON.parse((await request(srv, 'POST', '/tokenize', { body: { model, prompt: ' return' } })).text).tokens;
  const tok = ids[ids.length - 1];
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 6, temperature: 0, logit_bias: { [tok]: 100 }, logprobs: 0 });
  assert.equal(r.usage.completion_tokens, 6);
  const one = r.choices[0].logprobs.tokens[0];
  assert.ok(r.choices[0].logprobs.tokens.every((t) => t === one), JSON.stringify(r.choices[0].logprobs.tokens));
  assert.ok(r.choices[0].logprobs.token_logprobs.every((x) => x > -1e-3));
  const plain = await client.completions.create({ model, prompt: PROMPT, max_tokens: N, temperature: 0, ignore_eos: true });
  const pen = { model, prompt: PROMPT, max_tokens: N, temperature: 0, ignore_eos: true, presence_penalty: 1.5, frequency_penalty: 2 };
  const p = await client.completions.create(pen);
  assert.notEqual(p.choices[0].text, plain.choices[0].text);
  const stream = await client.completions.create({ ...pen, stream: true });
  let got = '';
  for await (const c of stream) for (const x of c.choices) got += x.text;
  assert.equal(got, p.choices[0].text);
  for (const [body, param] of [[{ presence_penalty: 3 }, 'presence_penalty'], [{ logit_bias: { x: 1 } }, 'logit_bias'],
    [{ logit_bias: { 5: 101 } }, 'logit_bias.5'], [{ logit_bias: { 99999999: 1 } }, 'logit_bias']]) {
    const e = await request(srv, 'POST', '/v1/completions', { body: { model, prompt: PROMPT, ...body } });
    assert.equal(e.status, 400, e.text);
    assert.equal(JSON.parse(e.text).error.param, param, e.text);
  }
});

test('min_tokens: no stop string or end of text before it; more than max_tokens is a 400', async () => {
  const body = { model, prompt: PROMPT, max_tokens: 30, temperature: 0, stop: ['\n'] };
  const a = await client.completions.create(body);
  const b = await client.completions.create({ ...body, min_tokens: a.usage.completion_tokens + 1 });
  assert.ok(b.usage.completion_tokens > a.usage.completion_tokens);
  assert.ok(b.choices[0].text.startsWith(a.choices[0].text));
  const e = await request(srv, 'POST', '/v1/completions', { body: { ...body, max_tokens: 3, min_tokens: 5 } });
  assert.equal(e.status, 400, e.text);
  assert.equal(JSON.parse(e.text).error.param, 'min_tokens');
});

test('response_format json_object', async () => {
  let finished = 0;
  for (const [temperature, seed] of [[0, 1], [0.9, 2], [0.9, 5], [0.9, 9]]) {
    const body = { model, messages: MESSAGES, max_tokens: 96, temperature, seed, response_format: { type: 'json_object' } };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    if (c.finish_reason === 'stop') {
      const v = JSON.parse(c.message.content);
      assert.equal(typeof v, 'object');
      assert.ok(v !== null && !Array.isArray(v));
      assert.equal(c.message.content[0], '{');
      finished++;
    }
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let got = '';
    for await (const x of stream) for (const ch of x.choices) got += ch.delta.content ?? '';
    assert.equal(got, c.message.content);
  }
  assert.ok(finished > 0, 'no json_object text finished');
  const e = await request(srv, 'POST', '/v1/chat/completions', { body: { model, messages: MESSAGES, response_format: { type: 'json_schema' } } });
  assert.equal(e.status, 400, e.text);
  assert.equal(JSON.parse(e.text).error.param, 'response_format.json_schema');
});

test('response_format json_schema', async () => {
  const schema = {
    type: 'object',
    properties: {
      kind: { enum: ['cat', 'dog', 'bird'] },
      ok: { type: 'boolean' },
      tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 1 },
    },
    required: ['kind', 'ok', 'tags'],
    additionalProperties: false,
  };
  const response_format = { type: 'json_schema', json_schema: { name: 'pet', schema, strict: true } };
  const schemaCounts = async () => {
    const m = await metrics(srv);
    return [m.get('specd_json_schemas_compiled_total'), m.get('specd_json_schemas_found_total')];
  };
  const [compiled0, found0] = await schemaCounts();
  let finished = 0;
  // (the bundled model, trained on Python, pads with whitespace: the
  // schema's few tokens take a few hundred)
  for (const [temperature, seed] of [[0, 1], [0.9, 2]]) {
    const body = { model, messages: MESSAGES, max_tokens: 400, temperature, seed, response_format };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];

    if (c.finish_reason === 'stop') {
      const v = JSON.parse(c.message.content);
      assert.deepEqual(Object.keys(v), ['kind', 'ok', 'tags'], c.message.content);
      assert.ok(['cat', 'dog', 'bird'].includes(v.kind));
      assert.equal(typeof v.ok, 'boolean');
      assert.ok(Array.isArray(v.tags) && v.tags.length <= 1 && v.tags.every((t) => typeof t === 'string' && [...t].length <= 4));
      finished++;
    }
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let got = '';
    for await (const x of stream) for (const ch of x.choices) got += ch.delta.content ?? '';
    assert.equal(got, c.message.content);
  }
  assert.ok(finished > 0, 'no json_schema text finished');
  // four requests of one schema text: one compilation; the server's check of
  // each and the engine's look-up of each share it (8 look-ups, 7 found)
  const [compiled, found] = await schemaCounts();
  assert.equal(compiled - compiled0, 1, 'compilations of one schema text');
  assert.equal(found - found0, 7, 'look-ups that found the schema compiled');
  // numbers' bounds (pydantic's Field(ge=, le=, gt=) on float fields) and
  // a tuple (tuple[int, str]: prefixItems): a finished reply holds them,
  // its numbers written without an exponent
  const bounded = {
    type: 'object',
    properties: {
      p: { type: 'number', minimum: 0, maximum: 1 },
      t: { type: 'number', exclusiveMinimum: -273.15, maximum: 100 },
      xy: { type: 'array', prefixItems: [{ type: 'integer' }, { type: 'string', maxLength: 3 }], minItems: 2, maxItems: 2 },
    },
    required: ['p', 't', 'xy'],
    additionalProperties: false,
  };
  let held = 0;
  for (const [temperature, seed] of [[0, 1], [0.9, 2], [0.9, 3]]) {
    const body = { model, messages: MESSAGES, max_tokens: 400, temperature, seed, response_format: { type: 'json_schema', json_schema: { name: 'b', schema: bounded } } };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    if (c.finish_reason !== 'stop') continue;
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v), ['p', 't', 'xy'], c.message.content);
    assert.ok(v.p >= 0 && v.p <= 1 && v.t > -273.15 && v.t <= 100, c.message.content);
    assert.ok(v.xy.length === 2 && Number.isInteger(v.xy[0]) && typeof v.xy[1] === 'string' && [...v.xy[1]].length <= 3, c.message.content);
    assert.ok(!/[eE]/.test(c.message.content), c.message.content);
    held++;
  }
  assert.ok(held > 0, 'no bounded-number text finished');
  // strings' patterns and integers' multiples (pydantic's constr(pattern=),
  // Field(multiple_of=)): a finished reply holds them
  const patterned = {
    type: 'object',
    properties: {
      code: { type: 'string', pattern: '^[A-Z]{2}-\\d{3}$' },
      tag: { type: 'string', pattern: 'ab', maxLength: 6 },
      n: { type: 'integer', multipleOf: 7, minimum: 0, maximum: 100 },
    },
    required: ['code', 'tag', 'n'],
    additionalProperties: false,
  };
  let matched = 0;
  for (const [temperature, seed] of [[0, 1], [0.9, 2], [0.9, 3]]) {
    const body = { model, messages: MESSAGES, max_tokens: 400, temperature, seed, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: patterned } } };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    if (c.finish_reason !== 'stop') continue;
    const v = JSON.parse(c.message.content);
    assert.ok(/^[A-Z]{2}-\d{3}$/.test(v.code) && /ab/.test(v.tag) && [...v.tag].length <= 6, c.message.content);
    assert.ok(Number.isInteger(v.n) && v.n % 7 === 0 && v.n >= 0 && v.n <= 100, c.message.content);
    matched++;
  }
  assert.ok(matched > 0, 'no patterned text finished');
  for (const [bad, want] of [[{ type: 'string', pattern: '(?=a)' }, 'lookahead'], [{ type: 'object', minProperties: 1 }, 'minProperties'], [{ type: 'number', minimum: 2, maximum: 1 }, 'admit no number']]) {
    const e = await request(srv, 'POST', '/v1/chat/completions', {
      body: { model, messages: MESSAGES, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bad } } },
    });
    assert.equal(e.status, 400, e.text);
    const err = JSON.parse(e.text).error;
    assert.equal(err.param, 'response_format.json_schema.schema');
    assert.ok(err.message.includes(want), err.message);
  }
  const t = await request(srv, 'POST', '/v1/chat/completions', {
    body: { model, messages: MESSAGES, response_format: { type: 'json_schema', json_schema: { schema: 'x' } } },
  });
  assert.equal(t.status, 400, t.text);
});
