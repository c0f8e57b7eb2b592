/**
 * The fake upstream as a PROCESS, deliberately NOT idempotent: every request
 * that arrives whole is one more effect (a charge, a message), appended to
 * an effects file before it is answered (so a kill loses no record) and kept
 * in memory for `GET /__effects[?entity=E]`. It records the fence, entity and key each
 * effect came with, so duplicates and out-of-order effects are visible.
 *
 *   node --import <ts loader> upstream-child.ts '{"effectsFile":"/tmp/…/effects.ndjson"}'
 *
 * Prints {"type":"listening","url":…}.
 *
 * For the kill campaign (test/faults/kill-campaign.ts), a status endpoint
 * and two faults, all off unless asked for:
 * - `GET /payments/status/{key}`: 200 with the effect when one with that
 *   `Idempotency-Key` is recorded, else 404 (a provider's "look the charge up
 *   by your own reference", DESIGN §3.12). `statusLagMs`: an effect is
 *   visible there only that long after it was recorded (a lagging read
 *   replica); `statusLies`: always 404, even for a performed charge.
 * - `holdAnswerFor`: the next POST with that key is performed (its effect
 *   recorded) but never answered; prints {"type":"answer-held","key":…} once
 *   the effect is on file, so the test can kill the gateway in that window.
 * Set at start in the JSON argument, or later with `POST /__control {…}`.
 */
import { appendFileSync } from 'node:fs';
import { createServer } from 'node:http';

export interface Effect {
  /** 1-based arrival order. */
  seq: number;
  method: string;
  path: string;
  entity: string | null;
  fence: string | null;
  key: string | null;
  requestId: string | null;
}

interface Faults {
  statusLagMs: number;
  statusLies: boolean;
  holdAnswerFor: string | null;
}

const { effectsFile, port, ...initial } = JSON.parse(process.argv[2] ?? '{}') as { effectsFile: string; port?: number } & Partial<Faults>;
const effects: Effect[] = [];
const faults: Faults = { statusLagMs: 0, statusLies: false, holdAnswerFor: null, ...initial };
/** When each effect was recorded (Date.now()), by seq: the status endpoint's lag is measured from it. */
const recordedAt: number[] = [];
let statusCalls = 0;
const one = (v: string | string[] | undefined) => (v === undefined ? null : Array.isArray(v) ? v.join(', ') : v);

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url?.startsWith('/__effects')) {
    // `?entity=E`: only that entity's effects (cheap to poll during a soak).
    const entity = new URL(req.url, 'http://x').searchParams.get('entity');
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(entity === null ? effects : effects.filter((e) => e.entity === entity)));
    return;
  }
  if (req.method === 'GET' && req.url === '/__status-calls') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ statusCalls }));
    return;
  }
  const status = req.method === 'GET' || req.method === 'HEAD' ? /^\/payments\/status\/([^/?]+)$/.exec(req.url ?? '') : null;
  if (status) {
    statusCalls++;
    const key = decodeURIComponent(status[1]!);
    const now = Date.now();
    const e = faults.statusLies ? undefined : effects.find((x) => x.key === key && recordedAt[x.seq]! + faults.statusLagMs <= now);
    res.writeHead(e ? 200 : 404, { 'content-type': 'application/json' });
    res.end(JSON.stringify(e ? { effect: e.seq, fence: e.fence, entity: e.entity, key: e.key } : { error: 'no such charge' }));
    return;
  }
  if (req.method === 'POST' && req.url === '/__control') {
    let body = '';
    req.setEncoding('utf8').on('data', (c: string) => (body += c));
    req.on('end', () => {
      Object.assign(faults, JSON.parse(body || '{}'));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(faults));
    });
    return;
  }
  req.resume();
  req.on('end', () => {
    const e: Effect = {
      seq: effects.length + 1,
      method: req.method ?? '',
      path: req.url ?? '',
      entity: one(req.headers['x-fence-entity']),
      fence: one(req.headers['x-execution-fence']),
      key: one(req.headers['idempotency-key']),
      requestId: one(req.headers['x-request-id']),
    };
    effects.push(e);
    recordedAt[e.seq] = Date.now();
    appendFileSync(effectsFile, `${JSON.stringify(e)}\n`);
    if (e.key !== null && e.key === faults.holdAnswerFor && e.method === 'POST') {
      // Performed, never answered: the answer is lost with whoever waits for it.
      faults.holdAnswerFor = null;
      process.stdout.write(`${JSON.stringify({ type: 'answer-held', key: e.key, seq: e.seq })}\n`);
      return;
    }
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ effect: e.seq, fence: e.fence, entity: e.entity, key: e.key }));
  });
});
server.keepAliveTimeout = 30_000;
server.listen(port ?? 0, '127.0.0.1', () => {
  const { port: bound } = server.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ type: 'listening', url: `http://127.0.0.1:${bound}` })}\n`);
});
