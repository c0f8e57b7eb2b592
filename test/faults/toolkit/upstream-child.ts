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

const { effectsFile, port } = JSON.parse(process.argv[2] ?? '{}') as { effectsFile: string; port?: number };
const effects: Effect[] = [];
const one = (v: string | string[] | undefined) => (v === undefined ? null : Array.isArray(v) ? v.join(', ') : v);

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url?.startsWith('/__effects')) {
    // `?entity=E`: only that entity's effects (cheap to poll during a soak).
    const entity = new URL(req.url, 'http://x').searchParams.get('entity');
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(entity === null ? effects : effects.filter((e) => e.entity === entity)));
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
    appendFileSync(effectsFile, `${JSON.stringify(e)}\n`);
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ effect: e.seq, fence: e.fence, entity: e.entity, key: e.key }));
  });
});
server.keepAliveTimeout = 30_000;
server.listen(port ?? 0, '127.0.0.1', () => {
  const { port: bound } = server.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ type: 'listening', url: `http://127.0.0.1:${bound}` })}\n`);
});
