// Diagnostic (bench/tail.mjs): fencegate as `fencegate serve` starts it, with
// timestamps around each part of every proxied request, to say where a slow
// request's time went. Nothing of the gateway is changed: the store's admit
// and finish, the group committer's transactions, the forwarder and the
// response are wrapped from outside. On SIGTERM it writes everything it saw
// to TRACE_OUT (JSON) and exits:
//   requests: [t0, admitQueued→groupStart, admitGroup, admitSync, forward, finishWait, finishGroup, finishSync, respond, total, ...]
//   groups:   [start, size, beginMs, fnMs, commitMs]
//   gc:       [start, ms, kind]          (PerformanceObserver 'gc')
//   ckpt:     [start, ms, mode, log]     (the checkpoint worker's messages)
//   loopDelay: monitorEventLoopDelay's percentiles (ms)
// All times are performance.now() of this process, in ms.
//
//   node bench/servers/fencegate-traced.mjs DIST CONFIG
import { writeFileSync } from 'node:fs';
import { monitorEventLoopDelay, PerformanceObserver } from 'node:perf_hooks';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [distDir, configFile] = process.argv.slice(2);
const dist = (p) => import(pathToFileURL(join(resolve(distDir), p)).href);
const { readConfig } = await dist('config/read-file.js');
const { startGateway, openStore } = await dist('entry/node.js');
const { createJsonLogger } = await dist('http/logger.js');

const config = readConfig(configFile);
const store = await openStore(config.store);
const now = () => performance.now();

const groups = [];
const gcs = [];
const ckpts = [];
let lastGroupRec = null;
/** Each request in flight by its Idempotency-Key. */
const current = new Map();
/** The request started last: at one connection, the one in flight. */
let active = null;

// The group committer: each transaction's BEGIN, its decisions, its COMMIT.
const g = store.group;
if (g) {
  const lock = g.lock;
  const tryBegin = lock.tryBegin.bind(lock);
  const commit = lock.commit.bind(lock);
  let cur = null;
  lock.tryBegin = () => {
    const t = now();
    const r = tryBegin();
    cur = { start: t, beginMs: now() - t, fnStart: now() };
    return r;
  };
  lock.commit = () => {
    const t = now();
    commit();
    if (cur) groups.push([cur.start, -1, cur.beginMs, t - cur.fnStart, now() - t]);
    cur = null;
  };
  const run = g.run.bind(g);
  g.run = (fn) => {
    const rec = { queued: now(), start: 0, end: 0 };
    lastGroupRec = rec;
    return run(() => {
      rec.start = now();
      try {
        return fn();
      } finally {
        rec.end = now();
      }
    });
  };
}
const ck = store.checkpointer;
ck?.worker?.on('message', (m) => {
  if (m.type === 'ran') ckpts.push([now() - m.ms, m.ms, m.mode, m.log]);
  else ckpts.push([now(), 0, m.type, 0]);
});

// The store's two calls: from the call to the answer, and the group
// transaction's record of the decision (set synchronously by g.run inside).
for (const name of ['admit', 'finish']) {
  const orig = store[name].bind(store);
  store[name] = async (input) => {
    const t = now();
    const rec = current.get(input.key) ?? active;
    const p = orig(input);
    const grec = lastGroupRec;
    lastGroupRec = null;
    const v = await p;
    if (rec) rec[name] = { call: t, done: now(), g: grec };
    return v;
  };
}

const { createUndiciForwarder } = await dist('entry/node.js');
const forwarder = createUndiciForwarder();
const forward = forwarder.forward.bind(forwarder);
forwarder.forward = async (req) => {
  const t = now();
  const key = req.headers?.['idempotency-key'] ?? (typeof req.headers?.get === 'function' ? req.headers.get('idempotency-key') : undefined);
  const r = await forward(req);
  const rec = (key !== undefined ? current.get(key) : undefined) ?? active;
  if (rec) rec.forward = { call: t, done: now() };
  return r;
};

const requests = [];
const running = await startGateway({ config, store, forwarder, logger: createJsonLogger({ level: 'info' }) });
running.server.prependListener('request', (req, res) => {
  const key = req.headers['idempotency-key'];
  if (key === undefined) return;
  const rec = { t0: now(), key };
  current.set(key, rec);
  active = rec;
  res.once('finish', () => {
    rec.t1 = now();
    current.delete(key);
    requests.push(rec);
  });
});

const gcObs = new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcs.push([e.startTime, e.duration, e.detail?.kind ?? e.kind]);
});
gcObs.observe({ entryTypes: ['gc'] });
const loop = monitorEventLoopDelay({ resolution: 1 });
loop.enable();

console.log(JSON.stringify({ port: Number(new URL(running.url).port) }));

process.on('SIGTERM', () => {
  const flat = requests.map((r) => {
    const a = r.admit;
    const f = r.finish;
    const fw = r.forward;
    return {
      t0: r.t0,
      total: r.t1 - r.t0,
      beforeAdmit: a ? a.call - r.t0 : null,
      admitQueue: a?.g ? a.g.start - a.call : null,
      admitFn: a?.g ? a.g.end - a.g.start : null,
      admitAfter: a?.g ? a.done - a.g.end : null,
      betweenAdmitForward: a && fw ? fw.call - a.done : null,
      forward: fw ? fw.done - fw.call : null,
      betweenForwardFinish: fw && f ? f.call - fw.done : null,
      finishQueue: f?.g ? f.g.start - f.call : null,
      finishFn: f?.g ? f.g.end - f.g.start : null,
      finishAfter: f?.g ? f.done - f.g.end : null,
      respond: f ? r.t1 - f.done : null,
    };
  });
  const pct = (p) => loop.percentile(p) / 1e6;
  writeFileSync(
    process.env.TRACE_OUT,
    JSON.stringify({ requests: flat, groups, gc: gcs, ckpt: ckpts, loopDelay: { p50: pct(50), p99: pct(99), max: loop.max / 1e6, mean: loop.mean / 1e6 } }),
  );
  running.close().then(() => process.exit(0));
});
