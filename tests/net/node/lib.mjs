// Helpers shared by the end-to-end tests of `specd serve`: start the server
// on a free port, wait until it is ready, read /metrics, stop it, and read a
// process's resident memory. The server under test is $SPECD_BIN (meson sets
// it); the model is $SPECD_E2E_MODEL, else the bundled models/specd-tiny,
// else the small test model tests/net/fixtures/tiny-chat.
import { spawn, execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const SRCDIR = process.env.SD_SRCDIR || process.cwd();
export const BIN = process.env.SPECD_BIN || path.join(SRCDIR, 'build', 'specd');
const BUNDLED = path.join(SRCDIR, 'models', 'specd-tiny');
// 2 layers, hidden 64: for tests that measure the server, not the model.
export const SMALL_MODEL = path.join(SRCDIR, 'tests', 'net', 'fixtures', 'tiny-chat');
export const MODEL = process.env.SPECD_E2E_MODEL ||
  (fs.existsSync(path.join(BUNDLED, 'config.json')) ? BUNDLED : SMALL_MODEL);

// Speculative decoding for a server under test, so that usage and /metrics
// carry real statistics: the model's own MTP layer when it has one, else the
// n-gram proposer; a fixed draft length, since the adaptive one may rightly
// choose none.
export function specArgs(model = MODEL) {
  const cfg = JSON.parse(fs.readFileSync(path.join(model, 'config.json'), 'utf8'));
  const mtp = (cfg.num_nextn_predict_layers || 0) > 0;
  return { mtp, args: ['--spec', mtp ? 'mtp' : 'ngram', '--spec-k', '2'] };
}

// The official OpenAI client (npm `openai`): it lives in this folder
// (package.json + package-lock.json), installed on first use.
export async function openaiClass() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  if (!fs.existsSync(path.join(here, 'node_modules', 'openai', 'package.json')))
    execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: here, stdio: 'inherit' });
  return (await import('openai')).default;
}

// A server of the test file's (args) with the OpenAI client on it and the
// served model's name: { srv, client, model }.
export async function openServer(args) {
  const srv = await startServer(args);
  const OpenAI = await openaiClass();
  const client = new OpenAI({ baseURL: `${srv.base()}/v1`, apiKey: 'none', maxRetries: 0 });
  const model = (await client.models.list()).data[0].id;
  return { srv, client, model };
}

// Stops a test file's server: it must exit 0 on SIGTERM.
export async function closeServer(srv) {
  const r = await srv.stop();
  if (r.code !== 0 || r.signal !== null)
    throw new Error(`exit after SIGTERM: ${JSON.stringify(r)}\n${srv.log.slice(-3000)}`);
}

// Without a model there is nothing to serve: meson's "skipped" (77), with the reason.
export function requireModel(model = MODEL) {
  if (!fs.existsSync(path.join(model, 'config.json'))) {
    console.log(`skipped: no model at ${model} (set SPECD_E2E_MODEL)`);
    process.exit(77);
  }
  if (!fs.existsSync(BIN)) {
    console.log(`FAIL: no specd binary at ${BIN}`);
    process.exit(1);
  }
  console.log(`# model ${model}`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls fn until it returns a truthy value or ms pass; returns the last value.
export async function until(fn, ms, every = 20) {
  const end = Date.now() + ms;
  let v;
  for (;;) {
    v = await fn();
    if (v || Date.now() > end) return v;
    await sleep(every);
  }
}

// Starts `specd serve` on an ephemeral port; resolves once it logged "ready".
export async function startServer(args = [], env = {}, opts = {}) {
  const child = spawn(BIN, ['serve', '--model', opts.model || MODEL, '--port', '0', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const srv = { child, log: '', port: 0, exited: null };
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      srv.exited = { code, signal };
      resolve(srv.exited);
    });
  });
  child.stderr.on('data', (d) => {
    srv.log += d;
    if (process.env.SPECD_E2E_VERBOSE) process.stderr.write(d);
  });
  srv.base = () => `http://127.0.0.1:${srv.port}`;
  // Sends sig once (a second SIGTERM means "cancel everything now").
  srv.signal = (sig = 'SIGTERM') => {
    srv.signalled = true;
    if (!srv.exited) child.kill(sig);
  };
  // SIGTERM unless already signalled, then the exit status; SIGKILL past timeoutMs.
  srv.stop = async (sig = 'SIGTERM', timeoutMs = 60000) => {
    if (!srv.signalled) srv.signal(sig);
    const t = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    const r = await exited;
    clearTimeout(t);
    return r;
  };
  const ready = await until(() => srv.exited || /specd info: ready: /.test(srv.log), opts.readyMs || 180000, 50);
  const m = /listening on http:\/\/[^ ]+:(\d+)/.exec(srv.log);
  if (!ready || srv.exited || !m) {
    child.kill('SIGKILL');
    throw new Error(`specd serve did not become ready:\n${srv.log}`);
  }
  srv.port = Number(m[1]);
  return srv;
}

// One request through node:http (no client library): status, headers, body text.
export function request(srv, method, pathname, { body, headers = {}, raw = false } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : raw ? body : JSON.stringify(body);
    const req = http.request(
      {
        host: '127.0.0.1', port: srv.port, method, path: pathname, agent: false,
        headers: { ...(data !== undefined ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } : {}), ...headers },
      },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString('utf8'), bytes: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    if (data !== undefined) req.write(data);
    req.end();
  });
}

// /metrics as a map "name{labels}" -> number.
export async function metrics(srv, headers = {}) {
  const r = await request(srv, 'GET', '/metrics', { headers });
  if (r.status !== 200) throw new Error(`/metrics: ${r.status} ${r.text}`);
  const m = new Map();
  for (const line of r.text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return m;
}

// Resident memory of a process in bytes (VmRSS of /proc/PID/status).
export function rssBytes(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /VmRSS:\s+(\d+) kB/.exec(s);
  return Number(m[1]) * 1024;
}

// `specd generate` for the same request: its stdout without the final newline.
export function generate(args) {
  return new Promise((resolve, reject) => {
    execFile(BIN, ['generate', '--model', MODEL, ...args], { maxBuffer: 1 << 24 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`specd generate ${args.join(' ')}: ${err.message}\n${stderr}`));
      else resolve(stdout.endsWith('\n') ? stdout.slice(0, -1) : stdout);
    });
  });
}

// Parses an SSE body strictly: it must be a sequence of `data: X\n\n`
// events and nothing else. Returns the payloads.
export function sseEvents(text) {
  const events = [];
  let i = 0;
  while (i < text.length) {
    if (!text.startsWith('data: ', i)) throw new Error(`SSE: expected "data: " at ${i}: ${JSON.stringify(text.slice(i, i + 80))}`);
    const end = text.indexOf('\n\n', i);
    if (end < 0) throw new Error(`SSE: unterminated event at ${i}`);
    const payload = text.slice(i + 6, end);
    if (payload.includes('\n')) throw new Error(`SSE: newline inside an event: ${JSON.stringify(payload)}`);
    events.push(payload);
    i = end + 2;
  }
  return events;
}

// Checks one complete OpenAI stream (chat or completions); returns
// { text, finish, usage }. Throws with the reason when malformed.
export function checkStream(text, { chat, includeUsage }) {
  const ev = sseEvents(text);
  if (ev.at(-1) !== '[DONE]') throw new Error(`stream does not end with [DONE]: ${ev.at(-1)}`);
  const chunks = ev.slice(0, -1).map((e) => JSON.parse(e));
  if (chunks.some((c) => c.error)) throw new Error(`error event: ${JSON.stringify(chunks.find((c) => c.error))}`);
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const id = chunks[0]?.id;
  let out = '';
  let finish = null;
  let usage = null;
  chunks.forEach((c, k) => {
    if (c.object !== object || c.id !== id) throw new Error(`chunk ${k}: object ${c.object} id ${c.id}`);
    if (usage) throw new Error('a chunk after the usage chunk');
    if (c.usage) {
      if (c.choices.length !== 0) throw new Error('usage chunk with choices');
      usage = c.usage;
      return;
    }
    if (finish) throw new Error('a chunk after finish_reason');
    const ch = c.choices[0];
    if (chat) {
      if (k === 0 && ch.delta.role !== 'assistant') throw new Error('first chat chunk lacks the role');
      if (k > 0 && ch.delta.role !== undefined) throw new Error('role after the first chunk');
      out += ch.delta.content ?? '';
    } else {
      out += ch.text;
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  });
  if (!finish) throw new Error('no finish_reason');
  if (includeUsage && !usage) throw new Error('no usage chunk');
  if (!includeUsage && usage) throw new Error('usage chunk not asked for');
  return { text: out, finish, usage };
}
