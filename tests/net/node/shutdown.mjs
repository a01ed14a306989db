// SIGTERM drains: the listener closes at once, running requests finish
// (within --shutdown-timeout) or are cancelled past it, and the process
// exits 0. Under systemd (NOTIFY_SOCKET) the server says READY=1 once the
// model is warm, WATCHDOG=1 while the engine makes progress, STOPPING=1 on
// drain. The notification socket is a small Python listener (Node has no
// unix datagram sockets).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { requireModel, sleep, startServer, until } from './lib.mjs';

requireModel();

function stream(srv, body) {
  const st = { text: '', ended: false, status: 0 };
  const data = JSON.stringify(body);
  const req = http.request({ host: '127.0.0.1', port: srv.port, method: 'POST', path: '/v1/completions', agent: false,
    headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
    st.status = res.statusCode;
    res.on('data', (c) => (st.text += c));
    res.on('end', () => (st.ended = true));
    res.on('error', () => (st.ended = true));
  });
  req.on('error', (e) => { st.error = e; st.ended = true; });
  req.end(data);
  return st;
}

const refused = (port) => new Promise((resolve) => {
  const r = http.get({ host: '127.0.0.1', port, path: '/health', agent: false }, (res) => { res.resume(); resolve(false); });
  r.on('error', (e) => resolve(e.code === 'ECONNREFUSED'));
});

async function modelOf(srv) {
  const r = await fetch(`${srv.base()}/v1/models`).then((x) => x.json());
  return r.data[0];
}

test('SIGTERM lets a running stream finish, refuses new connections, exits 0', async () => {
  const srv = await startServer(['--shutdown-timeout', '60']);
  const m = await modelOf(srv);
  const st = stream(srv, { model: m.id, prompt: 'import os\n', max_tokens: 48, temperature: 0, ignore_eos: true, stream: true });
  assert.ok(await until(async () => st.text.includes('"text"'), 30000));
  srv.signal('SIGTERM');
  assert.ok(await until(() => refused(srv.port), 2000), 'still accepting after SIGTERM');
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null }, srv.log.slice(-3000));
  assert.ok(st.ended);
  assert.ok(st.text.endsWith('data: [DONE]\n\n'), `the stream was cut: ${st.text.slice(-300)}`);
  assert.match(srv.log, /shutdown: drained/);
});

test('past --shutdown-timeout the rest is cancelled with an error event, still exit 0', async () => {
  const srv = await startServer(['--shutdown-timeout', '0.5']);
  const m = await modelOf(srv);
  const st = stream(srv, { model: m.id, prompt: 'import os\n', max_tokens: m.max_model_len - 16, temperature: 0, ignore_eos: true, stream: true });
  assert.ok(await until(async () => st.text.includes('"text"'), 30000));
  const t0 = Date.now();
  srv.signal('SIGTERM');
  const r = await srv.stop();
  const ms = Date.now() - t0;
  assert.deepEqual(r, { code: 0, signal: null }, srv.log.slice(-3000));
  assert.ok(ms < 5000, `exit ${ms} ms after SIGTERM`);
  assert.ok(await until(() => st.ended, 2000));
  const last = st.text.trimEnd().split('\n\n').at(-1);
  assert.match(last, /^data: \{"error":\{.*"code":"cancelled"/);
  assert.ok(!st.text.includes('[DONE]'));
});

test('systemd notifications: READY=1, WATCHDOG=1, STOPPING=1', async (t) => {
  const py = ['/usr/bin/python3', 'python3'].find((p) => p.startsWith('/') ? fs.existsSync(p) : true);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specd-notify-'));
  const sock = path.join(dir, 'notify.sock');
  const listener = spawn(py, ['-u', '-c', [
    'import socket, sys',
    's = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)',
    's.bind(sys.argv[1])',
    'print("bound", flush=True)',
    'while True:',
    '    m = s.recv(4096).decode()',
    '    print(m.replace("\\n", "|"), flush=True)',
  ].join('\n'), sock], { stdio: ['ignore', 'pipe', 'inherit'] });
  let got = '';
  listener.stdout.on('data', (d) => (got += d));
  t.after(() => { listener.kill(); fs.rmSync(dir, { recursive: true, force: true }); });
  assert.ok(await until(() => got.includes('bound'), 10000), 'the python listener did not start');
  const srv = await startServer([], { NOTIFY_SOCKET: sock, WATCHDOG_USEC: '200000' });
  assert.ok(await until(() => /READY=1\|STATUS=serving /.test(got), 5000), `no READY=1: ${got}`);
  const before = (got.match(/WATCHDOG=1/g) || []).length;
  await sleep(700); // pings every 100 ms while idle
  const pings = (got.match(/WATCHDOG=1/g) || []).length - before;
  assert.ok(pings >= 3, `${pings} watchdog pings in 700 ms`);
  const r = await srv.stop();
  assert.deepEqual(r, { code: 0, signal: null });
  assert.ok(await until(() => got.includes('STOPPING=1'), 2000), `no STOPPING=1: ${got}`);
  assert.ok(got.indexOf('READY=1') < got.indexOf('STOPPING=1'));
});
