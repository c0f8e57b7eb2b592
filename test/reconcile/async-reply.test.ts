import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { sameOrigin } from '../../src/http/pipeline/async-reply.js';
import { command, paymentsRoute, recordRows, startTestGateway, until, type TestGateway } from '../helpers/gateway.js';

// The async request-reply pattern on a route with `asyncReply` (DESIGN §3.12
// "Async replies"): a real upstream answers the command 202 with a Location,
// its status monitor answers 202 while the job runs and 200 (or 303 to the
// result) once it is done.

interface AsyncUpstream {
  url: string;
  /** Commands received (each one an effect). */
  commands: number;
  /** Status monitor requests received. */
  polls: number;
  /** What the status monitor answers for job n once done (default 200 with the result). */
  done: Set<number>;
  final: (job: number) => { status: number; headers?: Record<string, string>; body?: string };
  /** The command's Location (default: /jobs/<n>). */
  location: (job: number) => string;
  close(): Promise<void>;
}

async function asyncUpstream(): Promise<AsyncUpstream> {
  const up: AsyncUpstream = {
    url: '',
    commands: 0,
    polls: 0,
    done: new Set(),
    final: (job) => ({ status: 200, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ job, state: 'succeeded' }) }),
    location: (job) => `/jobs/${job}`,
    close: async () => {},
  };
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const jobs = /^\/jobs\/(\d+)$/.exec(req.url ?? '');
      if (req.method === 'POST') {
        const job = ++up.commands;
        res.writeHead(202, { location: up.location(job), 'content-type': 'application/json' });
        return res.end(JSON.stringify({ job, state: 'accepted' }));
      }
      if (req.method === 'GET' && jobs !== null) {
        up.polls++;
        const job = Number(jobs[1]);
        if (!up.done.has(job)) {
          res.writeHead(202, { location: `/jobs/${job}`, 'retry-after': '1' });
          return res.end(JSON.stringify({ job, state: 'running' }));
        }
        const f = up.final(job);
        res.writeHead(f.status, f.headers ?? {});
        return res.end(f.body ?? '');
      }
      if (req.method === 'GET' && req.url?.startsWith('/results/')) {
        up.polls++;
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ result: req.url }));
      }
      res.writeHead(404);
      res.end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  up.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  up.close = () => new Promise<void>((r) => server.close(() => r()));
  return up;
}

/** Another host: any request that reaches it is the SSRF the poll must never make. */
async function bystander(): Promise<{ url: string; hits: number; close(): Promise<void> }> {
  const b = { url: '', hits: 0, close: async () => {} };
  const server = createServer((_req, res) => {
    b.hits++;
    res.writeHead(200);
    res.end('secret');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  b.url = `http://localhost:${(server.address() as AddressInfo).port}`;
  b.close = () => new Promise<void>((r) => server.close(() => r()));
  return b;
}

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function start(up: AsyncUpstream, route: Record<string, unknown> = {}, background = false): Promise<TestGateway> {
  const gw = await startTestGateway({
    routes: [
      paymentsRoute(up.url, {
        mode: 'concurrent',
        // The background pass runs every `interval`; a test that wants the inline poll alone keeps it an hour away.
        asyncReply: { interval: background ? '100ms' : '1h', maxInterval: background ? '200ms' : '1h' },
        maxWaitMs: 2_000,
        ...route,
      }),
    ],
    config: { sweepInterval: '1h' },
  });
  closers.push(() => gw.close());
  return gw;
}

const send = (gw: TestGateway, key: string) => command(gw.url, '/payments/job', { fence: 1, entity: 'e1', key });

describe('async replies: a 202 with a Location is an interim answer', () => {
  it('the caller gets the 202; a retry while pending gets it replayed; once the monitor answers 200 the retry gets the final answer, reconciled', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    const gw = await start(up);
    const first = await send(gw, 'job-1');
    expect(first.status).toBe(202);
    // Kept as the upstream sent it.
    expect(first.headers.get('location')).toBe('/jobs/1');
    expect(await first.json()).toEqual({ job: 1, state: 'accepted' });
    expect(recordRows(gw.sqlite, 'job-1').map((r) => r.state)).toEqual(['outcome_unknown']);
    // The operator's listing says the gateway is still at it.
    expect((await gw.admin('/v1/idempotency')).body.items.find((r: { key: string }) => r.key === 'job-1')).toMatchObject({ reconcile: 'pending' });

    const pending = await send(gw, 'job-1');
    expect(pending.status).toBe(202);
    expect(pending.headers.get('idempotent-replayed')).toBe('true');
    // Replayed resolved against the URL the command went to: the same resource.
    expect(pending.headers.get('location')).toBe(`${up.url}/jobs/1`);
    expect(await pending.json()).toEqual({ job: 1, state: 'accepted' });
    expect(up.polls).toBe(1);

    up.done.add(1);
    const final = await send(gw, 'job-1');
    expect(final.status).toBe(200);
    expect(final.headers.get('fencegate-reconciled')).toBe('true');
    expect(await final.json()).toEqual({ job: 1, state: 'succeeded' });
    expect(recordRows(gw.sqlite, 'job-1').map((r) => r.state)).toEqual(['completed']);
    // One command upstream, whatever the retries.
    expect(up.commands).toBe(1);
    // The interim answer and its replay are counted as what they are, never as a refusal.
    const metrics = await (await fetch(`${gw.url}/_fencegate/metrics`)).text();
    expect(metrics).not.toMatch(/outcome="invalid"[^\n]* [1-9]/);
    expect(metrics).not.toMatch(/fencegate_rejections_total\{[^\n]* [1-9]/);
    expect(metrics).toMatch(/fencegate_decisions_total\{route="payments",outcome="replayed",status="202"\} 1/);
  });

  it('the background pass polls a record nobody retries until it is final', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    const gw = await start(up, {}, true);
    expect((await send(gw, 'job-2')).status).toBe(202);
    await until(() => up.polls >= 2, 'two background polls');
    expect(recordRows(gw.sqlite, 'job-2').map((r) => r.state)).toEqual(['outcome_unknown']);
    up.done.add(1);
    await until(() => recordRows(gw.sqlite, 'job-2')[0]?.state === 'completed', 'the record completed by the background pass');
    const res = await send(gw, 'job-2');
    expect(res.status).toBe(200);
    expect(res.headers.get('fencegate-reconciled')).toBe('true');
    expect(up.commands).toBe(1);
  });

  it('follows a 303 See Other once, to the result on the same origin', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    up.final = (job) => ({ status: 303, headers: { location: `/results/${job}` } });
    const gw = await start(up);
    expect((await send(gw, 'job-3')).status).toBe(202);
    up.done.add(1);
    const res = await send(gw, 'job-3');
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ result: '/results/1' });
    expect(res.headers.get('fencegate-reconciled')).toBe('true');
  });

  it('a monitor that answers 404 or 500 settles nothing: the interim 202 is still replayed', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    const gw = await start(up);
    expect((await send(gw, 'job-4')).status).toBe(202);
    up.done.add(1);
    for (const status of [404, 500, 410]) {
      up.final = () => ({ status, body: 'nope' });
      const res = await send(gw, 'job-4');
      expect(res.status).toBe(202);
      expect(recordRows(gw.sqlite, 'job-4').map((r) => r.state)).toEqual(['outcome_unknown']);
    }
    expect(up.commands).toBe(1);
  });

  it('asyncReply.pending: a monitor that answers 200 with the job still running is not the outcome; its later 200 is', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    const running = () => ({ status: 200, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ state: 'InProgress' }) });
    const gw = await start(up, { asyncReply: { interval: '1h', maxInterval: '1h', pending: { pointer: '/state', equals: 'InProgress' } } });
    expect((await send(gw, 'job-p')).status).toBe(202);
    up.done.add(1);
    up.final = running;
    const res = await send(gw, 'job-p');
    expect(res.status).toBe(202);
    expect(recordRows(gw.sqlite, 'job-p').map((r) => r.state)).toEqual(['outcome_unknown']);
    up.final = () => ({ status: 200, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ state: 'Succeeded' }) });
    const done = await send(gw, 'job-p');
    expect(done.status).toBe(200);
    expect(await done.json()).toEqual({ state: 'Succeeded' });
    expect(up.commands).toBe(1);
    // The control: without `pending`, the same "still running" 200 is taken as the outcome.
    const plain = await start(up);
    expect((await send(plain, 'job-q')).status).toBe(202);
    up.done.add(2);
    up.final = running;
    const taken = await send(plain, 'job-q');
    expect(taken.status).toBe(200);
    expect(await taken.json()).toEqual({ state: 'InProgress' });
  });

  it('never polls a Location on another host (SSRF): the record stays pending for an operator', async () => {
    const up = await asyncUpstream();
    const other = await bystander();
    closers.push(
      () => up.close(),
      () => other.close(),
    );
    up.location = () => `${other.url}/latest/meta-data`;
    const gw = await start(up, {}, true);
    expect((await send(gw, 'job-5')).status).toBe(202);
    const res = await send(gw, 'job-5');
    expect(res.status).toBe(202);
    await gw.running.gateway.reconcile();
    await gw.running.gateway.reconcile();
    expect(other.hits).toBe(0);
    expect(recordRows(gw.sqlite, 'job-5').map((r) => r.state)).toEqual(['outcome_unknown']);
    expect(up.commands).toBe(1);
  });

  it('a status query on the same route never releases a pending command: its "not found" is not asked for', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    // A short lock and no settle time: a "not found" from /status would be trusted at once.
    const gw = await start(up, { timeoutMs: 200, lockMarginMs: 100, reconcile: { path: '/status?key={key}', settleTime: '0s', interval: '1h' } });
    expect((await send(gw, 'job-7')).status).toBe(202);
    await new Promise((r) => setTimeout(r, 400));
    const pass = await gw.running.gateway.reconcile();
    expect(pass.asked).toEqual({});
    expect(recordRows(gw.sqlite, 'job-7').map((r) => r.state)).toEqual(['outcome_unknown']);
    expect((await send(gw, 'job-7')).status).toBe(202);
    expect(up.commands).toBe(1);
  });

  it('negative control: on a route without asyncReply the 202 is the final answer, replayed, never polled', async () => {
    const up = await asyncUpstream();
    closers.push(() => up.close());
    const gw = await start(up, { asyncReply: undefined });
    expect((await send(gw, 'job-6')).status).toBe(202);
    expect(recordRows(gw.sqlite, 'job-6').map((r) => r.state)).toEqual(['completed']);
    up.done.add(1);
    const res = await send(gw, 'job-6');
    expect(res.status).toBe(202);
    expect(up.polls).toBe(0);
  });
});

describe('sameOrigin: the one check a poll passes before it is made', () => {
  it('keeps the upstream origin only', () => {
    const up = 'http://127.0.0.1:9000/base';
    expect(sameOrigin(up, 'http://127.0.0.1:9000/jobs/1')?.href).toBe('http://127.0.0.1:9000/jobs/1');
    expect(sameOrigin(up, '/jobs/1', 'http://127.0.0.1:9000/base/x')?.href).toBe('http://127.0.0.1:9000/jobs/1');
    expect(sameOrigin(up, 'http://169.254.169.254/latest/meta-data')).toBeNull();
    expect(sameOrigin(up, 'http://127.0.0.1:9001/jobs/1')).toBeNull();
    expect(sameOrigin(up, 'https://127.0.0.1:9000/jobs/1')).toBeNull();
    expect(sameOrigin(up, 'http://user:pw@127.0.0.1:9000/jobs/1')).toBeNull();
    expect(sameOrigin(up, '//evil.example/jobs', 'http://127.0.0.1:9000/x')).toBeNull();
    expect(sameOrigin(up, 'not a url')).toBeNull();
  });
});
