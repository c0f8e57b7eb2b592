#!/usr/bin/env node
// A lost answer, reconciled with no operator (docs/design.md §3.12):
//
//   A worker charges a customer through the gateway. The payment provider
//   does charge, but answers too late: the worker's call times out (504) and
//   the record is outcome_unknown. Without `reconcile` every retry would get
//   409 outcome-unknown until an operator looked the charge up. With it, the
//   worker's retry makes the gateway ask the provider's status endpoint by the
//   Idempotency-Key, and the retry gets the charge back: one charge, no
//   operator, the decision in the audit log under operator "reconciler".
//
//   npm run demo:reconcile        (builds, then runs on a temporary SQLite file)
//
// Exits 0 when the retry got the charge and the provider charged once, 1 otherwise.
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseConfig } from '../dist/config/load.js';
import { startGateway } from '../dist/entry/node.js';
import { silentLogger } from '../dist/http/logger.js';

const t0 = Date.now();
let step = 0;
const tty = process.stdout.isTTY;
const paint = (code, s) => (tty ? `\x1b[${code}m${s}\x1b[0m` : s);
const say = (text) => console.log(`${paint(2, `${String(((Date.now() - t0) / 1000).toFixed(1)).padStart(5)}s`)}  ${paint(1, `${++step}.`.padEnd(3))} ${text}`);
const detail = (text) => console.log(`${' '.repeat(11)}${paint(2, text)}`);
let failures = 0;
const check = (cond, good, wrong = good) =>
  cond ? console.log(`${' '.repeat(11)}${paint(32, '✔')} ${good}`) : (failures++, console.log(`${' '.repeat(11)}${paint(31, '✘')} ${wrong}`));

// The provider: charges every POST it gets (it does not deduplicate keys), slowly; finds a charge by its key.
const charges = [];
const sockets = new Set();
const provider = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    const url = new URL(req.url, 'http://provider');
    const reply = (status, body) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.method === 'POST' && url.pathname === '/v1/charges') {
      const charge = { id: `ch_${charges.length + 1}`, key: req.headers['idempotency-key'], amount: 4200, currency: 'eur' };
      charges.push(charge);
      // Charged at once, answered after the gateway has given up on it.
      setTimeout(() => !res.destroyed && reply(201, charge), 1_500).unref();
      return;
    }
    const m = /^\/v1\/charges\/by-key\/(.+)$/.exec(url.pathname);
    if (req.method === 'GET' && m) {
      const charge = charges.find((c) => c.key === decodeURIComponent(m[1]));
      return charge ? reply(200, charge) : reply(404, { error: 'no such charge' });
    }
    reply(404, { error: 'not found' });
  });
});
provider.on('connection', (s) => (sockets.add(s), s.on('close', () => sockets.delete(s))));
await new Promise((r) => provider.listen(0, '127.0.0.1', r));
const providerUrl = `http://127.0.0.1:${provider.address().port}`;

const dir = mkdtempSync(join(tmpdir(), 'fencegate-demo-reconcile-'));
const config = parseConfig({
  listen: { host: '127.0.0.1', port: 0 },
  store: { sqlite: join(dir, 'gateway.db') },
  routes: [
    {
      name: 'charges',
      match: { path: '/v1/charges', methods: ['POST'] },
      upstream: providerUrl,
      fence: 'off',
      mode: 'concurrent',
      timeoutMs: 500,
      reconcile: { path: '/v1/charges/by-key/{key}', settleTime: '30s' },
    },
  ],
});
const { url, close } = await startGateway({ config, logger: silentLogger, env: {} });

try {
  const key = `charge-order-1042-${randomUUID().slice(0, 8)}`;
  const pay = () =>
    fetch(`${url}/v1/charges`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-fence-entity': 'order-1042' },
      body: JSON.stringify({ amount: 4200, currency: 'eur' }),
    });

  say(`The worker charges order 1042 through the gateway (Idempotency-Key ${key}).`);
  detail('The provider charges at once but answers after 1.5 s; the route gives it 500 ms.');
  const first = await pay();
  await first.arrayBuffer();
  check(first.status === 504, `the worker's call timed out: ${first.status} upstream-timeout, the outcome is unknown`, `expected 504, got ${first.status}`);
  const [rec] = (await (await fetch(`${url}/_fencegate/v1/idempotency`)).json()).items;
  check(rec?.state === 'outcome_unknown', `the record is outcome_unknown (reconcile: ${rec?.reconcile})`, `record: ${JSON.stringify(rec)}`);
  check(charges.length === 1, `the provider did charge: ${charges[0]?.id}`);

  say('The worker retries with the same key.');
  detail('The admission says outcome-unknown; the gateway asks GET /v1/charges/by-key/{key} instead of answering 409.');
  const retry = await pay();
  const body = await retry.json();
  check(
    retry.status === 200 && body.id === 'ch_1',
    `the retry got the charge back: ${retry.status} ${JSON.stringify(body)}`,
    `retry: ${retry.status} ${JSON.stringify(body)}`,
  );
  check(retry.headers.get('fencegate-reconciled') === 'true', 'marked fencegate-reconciled: true (and idempotent-replayed: true)');

  say('Once more, as a worker that crashed after the retry would.');
  const again = await pay();
  await again.arrayBuffer();
  check(again.status === 200 && again.headers.get('fencegate-reconciled') === 'true', 'the stored answer is replayed, still marked reconciled');

  say('What happened, by the books.');
  check(charges.length === 1, `the provider charged once (${charges.length} charge${charges.length === 1 ? '' : 's'})`);
  const actions = (await (await fetch(`${url}/_fencegate/v1/operator-actions`)).json()).items;
  check(
    actions.length === 1 && actions[0].operator === 'reconciler' && actions[0].action === 'resolve-completed',
    `no operator: one audited action, ${actions[0]?.action} by "${actions[0]?.operator}"`,
    `operator actions: ${JSON.stringify(actions)}`,
  );
  const metrics = await (await fetch(`${url}/_fencegate/metrics`)).text();
  detail(metrics.split('\n').find((l) => l.startsWith('fencegate_reconcile_attempts_total{route="charges",result="found"}')) ?? '(no reconcile metric)');
} finally {
  await close();
  for (const s of sockets) s.destroy();
  await new Promise((r) => provider.close(r));
  rmSync(dir, { recursive: true, force: true });
}

console.log(failures === 0 ? paint(32, '\nOK: the lost answer was reconciled, one charge, no operator.') : paint(31, `\nFAILED: ${failures} check(s).`));
process.exit(failures === 0 ? 0 : 1);
