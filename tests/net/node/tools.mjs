// Tool calling through the official OpenAI client: the bundled model's files
// with Qwen2.5's chat template (whose tool format specd writes out), so that
// tools reach the prompt and the reply is read for <tool_call> blocks; then
// Llama 3.1's and Kimi-K2-Thinking's templates, the two other formats. The
// small model does not call tools, so this checks the request side (tools in
// the prompt, earlier calls and tool results in the history, tool_choice) and
// that the reply read for calls is the same text, streamed or not; the
// parser's calls are checked in tests/net/test_toolcall.c and their JSON in
// tests/net/test_openai.c.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { MODEL, SRCDIR, checkStream, openaiClass, request, requireModel, startServer } from './lib.mjs';

requireModel();

const OpenAI = await openaiClass();

// A model folder: the bundled model's files with a published template.
function modelWith(template) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-tools-'));
  for (const f of fs.readdirSync(MODEL))
    if (f !== 'tokenizer_config.json') fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = fs.readFileSync(path.join(SRCDIR, 'tests', 'golden', 'tokenizer', 'chat', template), 'utf8');
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));
  return dir;
}
const DIR = modelWith('qwen2.5.jinja');

let srv, client, name;
before(async () => {
  srv = await startServer([], {}, { model: DIR });
  client = new OpenAI({ baseURL: `${srv.base()}/v1`, apiKey: 'none', maxRetries: 0 });
  name = (await client.models.list()).data[0].id;
});
after(async () => {
  const r = await srv.stop();
  fs.rmSync(DIR, { recursive: true, force: true });
  assert.deepEqual(r, { code: 0, signal: null }, `exit after SIGTERM:\n${srv.log.slice(-3000)}`);
});

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city, now.',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer', minimum: 1 }, lat: { type: 'number', minimum: -90, maximum: 90 } }, required: ['city'] },
  },
}];
const MESSAGES = [{ role: 'user', content: 'What is the weather in Paris?' }];
const HISTORY = [
  ...MESSAGES,
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 1}' } }] },
  { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21.5, "sky": "clear"}' },
];
const N = 20;

const tokens = async (body) => {
  const r = await request(srv, 'POST', '/tokenize', { body: { model: name, ...body } });
  assert.equal(r.status, 200, r.text);
  return JSON.parse(r.text).tokens;
};

test('tools reach the prompt; tool_choice none leaves them out', async () => {
  const plain = await tokens({ messages: MESSAGES });
  const withTools = await tokens({ messages: MESSAGES, tools: TOOLS });
  const none = await tokens({ messages: MESSAGES, tools: TOOLS, tool_choice: 'none' });
  // the tools block: its instructions and the tool's JSON
  assert.ok(withTools.length > plain.length + 60, `${withTools.length} against ${plain.length}`);
  assert.deepEqual(none, plain);
  const r = await client.chat.completions.create({ model: name, messages: MESSAGES, tools: TOOLS, max_tokens: N, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, withTools.length);
});

test('a reply read for tool calls is the same text streamed or not', async () => {
  for (const messages of [MESSAGES, HISTORY]) {
    const r = await client.chat.completions.create({ model: name, messages, tools: TOOLS, max_tokens: N, temperature: 0 });
    const ch = r.choices[0];
    assert.equal(ch.message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls'].includes(ch.finish_reason), ch.finish_reason);
    const calls = ch.message.tool_calls ?? [];
    assert.equal(ch.finish_reason === 'tool_calls', calls.length > 0);
    for (const c of calls) {
      assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(c.type, 'function');
      assert.equal(typeof JSON.parse(c.function.arguments), 'object');
    }
    // the raw stream: content deltas, tool call deltas, the same finish
    const raw = await request(srv, 'POST', '/v1/chat/completions', {
      body: { model: name, messages, tools: TOOLS, max_tokens: N, temperature: 0, stream: true },
    });
    assert.equal(raw.status, 200, raw.text);
    const s = checkStream(raw.text, { chat: true, includeUsage: false });
    assert.equal(s.text, ch.message.content ?? '');
    assert.equal(s.finish, ch.finish_reason);
  }
});

test('earlier tool calls and results are the history the template prints', async () => {
  const hist = await tokens({ messages: HISTORY, tools: TOOLS });
  const r = await client.chat.completions.create({ model: name, messages: HISTORY, tools: TOOLS, max_tokens: 4, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, hist.length);
  // a tool result changes the prompt
  const other = structuredClone(HISTORY);
  other[2].content = '{"temp": -3}';
  assert.notDeepEqual(await tokens({ messages: other, tools: TOOLS }), hist);
});

test('what cannot be served is refused by name', async () => {
  const post = async (body) => request(srv, 'POST', '/v1/chat/completions', { body: { model: name, ...body } });
  const cases = [
    [{ messages: MESSAGES, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_time' } } }, 'tool_choice', 'invalid_value'],
    [{ messages: MESSAGES, tools: TOOLS, tool_choice: { type: 'function' } }, 'tool_choice', 'invalid_value'],
    [{ messages: MESSAGES, tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } }, 'response_format', 'invalid_value'],
    [{ messages: MESSAGES, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: {} } } } } }], tool_choice: 'required' }, 'tools', 'invalid_value'],
    [{ messages: MESSAGES, tool_choice: 'auto' }, 'tool_choice', 'invalid_value'],
    [{ messages: MESSAGES, tools: [{ type: 'function', function: { name: 'bad name' } }] }, 'tools[0]', 'invalid_value'],
    [{ messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: 'not json' } }] }] }, 'messages[0].tool_calls[0]', 'invalid_value'],
  ];
  for (const [body, param, code] of cases) {
    const r = await post(body);
    assert.equal(r.status, 400, r.text);
    const e = JSON.parse(r.text).error;
    assert.equal(e.param, param, r.text);
    assert.equal(e.code, code, r.text);
  }
});

// tool_choice required and a named function: the reply decodes to calls in
// the model's own format (Qwen2.5's <tool_call> blocks here, of the tools'
// parameters' schemas): a finished reply is tool_calls of the tools given,
// their arguments of the parameters' keys, types and bounds (days >= 1,
// lat within [-90, 90]), the same streamed; one cut at its length keeps the
// calls it finished, the unfinished one as content.
test('tool_choice required and a named function decode the reply to calls', async () => {
  const TWO = [...TOOLS, { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'] } } }];
  let called = 0;
  for (const [tool_choice, tools] of [[{ type: 'function', function: { name: 'get_weather' } }, TOOLS], ['required', TWO]]) {
    for (const [temperature, seed] of [[0, 1], [0.8, 3]]) {
      const body = { model: name, messages: MESSAGES, tools, tool_choice, max_tokens: 300, temperature, seed };
      const whole = await request(srv, 'POST', '/v1/chat/completions', { body });
      assert.equal(whole.status, 200, whole.text);
      const reply = JSON.parse(whole.text), ch = reply.choices[0];
      if (ch.finish_reason === 'length') {
        assert.equal((ch.message.tool_calls ?? []).length, 0);
        continue;
      }
      assert.equal(ch.finish_reason, 'tool_calls', whole.text);
      if (ch.message.content !== null) { // cut inside a call after others
        assert.equal(reply.usage.completion_tokens, 300, whole.text);
        assert.ok(ch.message.content.startsWith('<tool_call>'), whole.text);
      }
      assert.ok(ch.message.tool_calls.length >= 1);
      for (const c of ch.message.tool_calls) {
        assert.ok(/^call_[A-Za-z0-9]{24}$/.test(c.id), c.id);
        const args = JSON.parse(c.function.arguments);
        if (c.function.name === 'get_weather') {
          assert.equal(typeof args.city, 'string');
          assert.ok(Object.keys(args).every((k) => ['city', 'days', 'lat'].includes(k)));
          if ('days' in args) assert.ok(Number.isInteger(args.days) && args.days >= 1, c.function.arguments);
          if ('lat' in args) assert.ok(args.lat >= -90 && args.lat <= 90, c.function.arguments);
        } else {
          assert.equal(tool_choice, 'required');
          assert.equal(c.function.name, 'get_time');
          assert.ok(['UTC', 'CET'].includes(args.tz));
        }
        if (typeof tool_choice === 'object') assert.equal(c.function.name, 'get_weather');
      }
      called++;
      // streamed: the same calls, then finish_reason tool_calls
      const raw = await request(srv, 'POST', '/v1/chat/completions', { body: { ...body, stream: true } });
      assert.equal(raw.status, 200, raw.text);
      const chunks = raw.text.split('\n\n').filter((x) => x.startsWith('data: {')).map((x) => JSON.parse(x.slice(6)));
      const calls = [];
      let finish = null;
      for (const c of chunks) for (const x of c.choices) {
        for (const t of x.delta.tool_calls ?? []) {
          if (!calls[t.index]) calls[t.index] = { name: '', arguments: '' };
          calls[t.index].name += t.function?.name ?? '';
          calls[t.index].arguments += t.function?.arguments ?? '';
        }
        if (x.finish_reason) finish = x.finish_reason;
      }
      assert.equal(finish, 'tool_calls');
      assert.deepEqual(calls.map((c) => c.name), ch.message.tool_calls.map((c) => c.function.name));
      assert.deepEqual(calls.map((c) => c.arguments), ch.message.tool_calls.map((c) => c.function.arguments));
    }
  }
  assert.ok(called > 0, 'no forced call finished');
});

// The other formats the server reads: Llama 3.1's (a JSON reply, held to its
// end), Kimi-K2's and DeepSeek's V3.1 and R1 forms (a section of special
// tokens: such a reply's text keeps special tokens). Tools reach the prompt,
// and the reply is the same text streamed or not.
for (const template of ['llama3.1.jinja', 'kimi-k2-thinking.jinja', 'deepseek-v3.1.jinja', 'deepseek-r1.jinja']) {
  test(`${template}: tools in the prompt, the reply the same streamed or not`, async () => {
    const dir = modelWith(template);
    const other = await startServer([], {}, { model: dir });
    try {
      const tok = async (body) => {
        const r = await request(other, 'POST', '/tokenize', { body });
        assert.equal(r.status, 200, r.text);
        return JSON.parse(r.text).tokens.length;
      };
      assert.ok(await tok({ messages: MESSAGES, tools: TOOLS }) > await tok({ messages: MESSAGES }) + 40);
      const model = JSON.parse((await request(other, 'GET', '/v1/models')).text).data[0].id;
      for (const messages of [MESSAGES, HISTORY]) {
        const body = { model, messages, tools: TOOLS, max_tokens: N, temperature: 0 };
        const whole = await request(other, 'POST', '/v1/chat/completions', { body });
        assert.equal(whole.status, 200, whole.text);
        const ch = JSON.parse(whole.text).choices[0];
        assert.equal(ch.finish_reason === 'tool_calls', (ch.message.tool_calls ?? []).length > 0);
        const raw = await request(other, 'POST', '/v1/chat/completions', { body: { ...body, stream: true } });
        assert.equal(raw.status, 200, raw.text);
        const s = checkStream(raw.text, { chat: true, includeUsage: false });
        assert.equal(s.text, ch.message.content ?? '');
        assert.equal(s.finish, ch.finish_reason);
      }
      // a forced call decodes to this template's own call format (its
      // parser reads it back): tool_calls of the tool, or cut at its length
      for (const temperature of [0, 0.8]) {
        const body = { model, messages: MESSAGES, tools: TOOLS, tool_choice: 'required', max_tokens: 300, temperature, seed: 5 };
        const whole = await request(other, 'POST', '/v1/chat/completions', { body });
        assert.equal(whole.status, 200, whole.text);
        const ch = JSON.parse(whole.text).choices[0];
        if (ch.finish_reason === 'length') continue;
        assert.equal(ch.finish_reason, 'tool_calls', whole.text);
        assert.ok(ch.message.tool_calls.length >= 1, whole.text);
        for (const c of ch.message.tool_calls) {
          assert.equal(c.function.name, 'get_weather');
          assert.equal(typeof JSON.parse(c.function.arguments).city, 'string');
        }
      }
    } finally {
      const r = await other.stop();
      fs.rmSync(dir, { recursive: true, force: true });
      assert.deepEqual(r, { code: 0, signal: null }, other.log.slice(-2000));
    }
  });
}

// chat_template_kwargs: Qwen3's enable_thinking false opens the reply with an
// empty reasoning (the template's own text); a chat completion takes it too.
test('chat_template_kwargs enable_thinking reaches Qwen3\'s template', async () => {
  const dir = modelWith('qwen3.jinja');
  const other = await startServer([], {}, { model: dir });
  try {
    const tok = async (body) => {
      const r = await request(other, 'POST', '/tokenize', { body });
      assert.equal(r.status, 200, r.text);
      return JSON.parse(r.text).tokens;
    };
    const on = await tok({ messages: MESSAGES });
    const off = await tok({ messages: MESSAGES, chat_template_kwargs: { enable_thinking: false } });
    assert.deepEqual(await tok({ messages: MESSAGES, chat_template_kwargs: { enable_thinking: true } }), on);
    assert.ok(off.length > on.length, `${off.length} against ${on.length}`);
    assert.deepEqual(off.slice(0, on.length), on);
    const model = JSON.parse((await request(other, 'GET', '/v1/models')).text).data[0].id;
    const body = { model, messages: MESSAGES, max_tokens: 4, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
    const r = await request(other, 'POST', '/v1/chat/completions', { body });
    assert.equal(r.status, 200, r.text);
    assert.equal(JSON.parse(r.text).usage.prompt_tokens, off.length);
    const bad = await request(other, 'POST', '/v1/chat/completions', { body: { ...body, chat_template_kwargs: { foo: 1 } } });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(JSON.parse(bad.text).error.param, 'chat_template_kwargs.foo');
  } finally {
    const r = await other.stop();
    fs.rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(r, { code: 0, signal: null }, other.log.slice(-2000));
  }
});

// --reasoning-parser: DeepSeek-R1's later template opens the reasoning (it ends with
// <think>\n), so the bundled model's reply is reasoning up to a </think> (it
// writes one, as text) and content after it; under
// Qwen3's template the reply opens none and stays content. Streamed: the
// reasoning deltas add up to the same.
test('--reasoning-parser splits the reply into reasoning_content and content', async () => {
  for (const [template, reasons] of [['deepseek-r1-think.jinja', true], ['qwen3.jinja', false]]) {
    const dir = modelWith(template);
    const plain = await startServer([], {}, { model: dir });
    const parsed = await startServer(['--reasoning-parser', 'think'], {}, { model: dir });
    try {
      const model = JSON.parse((await request(plain, 'GET', '/v1/models')).text).data[0].id;
      const body = { model, messages: MESSAGES, max_tokens: N, temperature: 0 };
      const chat = async (srv, extra = {}) => {
        const r = await request(srv, 'POST', '/v1/chat/completions', { body: { ...body, ...extra } });
        assert.equal(r.status, 200, r.text);
        return r;
      };
      const text = JSON.parse((await chat(plain)).text).choices[0].message.content;
      const msg = JSON.parse((await chat(parsed)).text).choices[0].message;
      if (reasons) { // up to the first </think>, the newlines at its edges aside
        const at = text.indexOf('</think>');
        const r = (at < 0 ? text : text.slice(0, at)).replace(/^\n+|\n+$/g, '');
        assert.equal(msg.reasoning_content, r || null, template);
        assert.equal(msg.content, at < 0 ? '' : text.slice(at + 8).replace(/^\n+/, ''));
      } else {
        assert.equal(msg.reasoning_content, null);
        assert.equal(msg.content, text);
      }
      const raw = await chat(parsed, { stream: true });
      let reasoning = '', content = '';
      for (const line of raw.text.split('\n')) {
        if (!line.startsWith('data: {')) continue;
        const d = JSON.parse(line.slice(6)).choices[0]?.delta ?? {};
        reasoning += d.reasoning_content ?? '';
        content += d.content ?? '';
      }
      assert.equal(reasoning, msg.reasoning_content ?? '');
      assert.equal(content, msg.content);
      // a JSON constraint holds after the reasoning the prompt opened (R1),
      // or after one the model may open (Qwen3): the reasoning is the free
      // reply's (greedy), the content a document (json_object: any object)
      const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] };
      for (const rf of [{ type: 'json_schema', json_schema: { name: 'r', schema } }, { type: 'json_object' }]) {
        const c = JSON.parse((await chat(parsed, { max_tokens: 200, response_format: rf })).text).choices[0];
        if (c.finish_reason === 'stop') {
          const doc = JSON.parse(c.message.content);
          assert.ok(rf.type === 'json_object' ? doc && typeof doc === 'object' && !Array.isArray(doc)
            : Number.isInteger(doc.a), c.message.content);
        }
        if (reasons) {
          const free = JSON.parse((await chat(plain, { max_tokens: 200 })).text).choices[0].message.content;
          const at = free.indexOf('</think>');
          if (at >= 0) assert.equal(c.message.reasoning_content, free.slice(0, at).replace(/^\n+|\n+$/g, '') || null, rf.type);
        }
      }
    } finally {
      for (const s of [plain, parsed]) {
        const r = await s.stop();
        assert.deepEqual(r, { code: 0, signal: null }, s.log.slice(-2000));
      }
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
});
