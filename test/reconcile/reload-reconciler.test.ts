/**
 * A SIGHUP reload retires the old gateway with its background reconcile
 * pass stopped (src/entry/node.ts retire → Gateway.stopBackground): once
 * reload() has resolved, no status query starts under the replaced config,
 * so a route whose reconcile the operator removed (its status endpoint
 * answers 404 for everything) has no more records released by it.
 */
import { createServer } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { startTestGateway, until } from '../helpers/gateway.js';

describe('reload and the old background reconcile pass', () => {
  const open: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const c of open.splice(0).reverse()) await c();
  });

  it('no status query is started with the old config after reload() resolved', async () => {
    let statusCalls = 0;
    const server = createServer((req, res) => {
      if (req.method === 'GET' && req.url!.startsWith('/charges/by-key/')) {
        statusCalls++;
        // A slow status endpoint that (wrongly) says "not found".
        setTimeout(() => res.writeHead(404).end(), 200);
        return;
      }
      // POST /charges: read, never answer (the answer is lost: outcome_unknown).
      req.resume();
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    open.push(
      () =>
        new Promise((r) => {
          server.closeAllConnections();
          server.close(r);
        }),
    );
    const upstream = `http://127.0.0.1:${(server.address() as any).port}`;
    const base = {
      name: 'charges',
      match: { path: '/charges', methods: ['POST'] },
      upstream,
      fence: 'off',
      mode: 'concurrent',
      timeoutMs: 300,
      lockMarginMs: 100,
      maxWaitMs: 0,
    };
    const withReconcile = { ...base, reconcile: { path: '/charges/by-key/{key}', settleTime: '100ms', interval: '1h', concurrency: 1 } };
    const g = await startTestGateway({ routes: [withReconcile] });
    open.push(() => g.close());
    for (const key of ['k1', 'k2', 'k3']) {
      const res = await fetch(`${g.url}/charges`, { method: 'POST', headers: { 'idempotency-key': key, 'content-type': 'application/json' }, body: '{}' });
      await res.text();
    }
    expect((await g.sqlite.getRecords('k3'))[0]?.state).toBe('outcome_unknown');
    g.sqlite.db.prepare('UPDATE idempotency_records SET created_at = created_at - 60000').run();

    // A background pass is running (the timer fired) when SIGHUP arrives.
    const pass = g.running.gateway.reconcile();
    await until(() => statusCalls === 1, 'first status query');
    // The operator removes reconcile from the route: its status endpoint is not to be trusted.
    await g.running.reload(parseConfig({ ...g.config, routes: [base] } as any));
    const callsAtReload = statusCalls;
    await pass;
    await new Promise((r) => setTimeout(r, 300));
    // Queries started after the reload, under the configuration that was replaced, and the
    // records they released; at most the one query already in flight may have been answered.
    const startedAfter = statusCalls - callsAtReload;
    const left = (await Promise.all(['k1', 'k2', 'k3'].map((k) => g.sqlite.getRecords(k)))).filter((r) => r.length > 0).length;
    expect({ startedAfter, recordsLeft: left }).toEqual({ startedAfter: 0, recordsLeft: 2 });
  });
});
