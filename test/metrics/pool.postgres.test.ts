/**
 * fencegate_store_pool_clients on the PostgreSQL store: the pool's clients
 * and the requests waiting for one, read from the store's pg.Pool at each
 * scrape, through a real Node gateway on a real PostgreSQL.
 */
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { command, paymentsRoute } from '../helpers/gateway.js';
import { startPgTestGateway, type PgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

const value = (text: string, state: string) => Number(new RegExp(`^fencegate_store_pool_clients\\{state="${state}"\\} (\\S+)$`, 'm').exec(text)?.[1]);

describe.skipIf(!POSTGRES_URL)('PostgreSQL pool gauges', () => {
  let up: FakeUpstream;
  let gw: PgTestGateway;
  beforeAll(async () => {
    up = await startUpstream();
    gw = await startPgTestGateway({ routes: [paymentsRoute(up.url)], prefix: 'fg_metrics_pool' });
  });
  afterAll(async () => {
    await gw?.close();
    await up?.close();
  });

  test('with every client checked out, an admission waits, and the scrape says so', async () => {
    const pool = gw.store.pool as pg.Pool;
    const idle = await (await fetch(`${gw.url}/_fencegate/metrics`)).text();
    expect(value(idle, 'waiting')).toBe(0);
    const held = await Promise.all(Array.from({ length: 6 }, () => pool.connect()));
    const pending = command(gw.url, '/payments/x', { fence: 1, entity: 'e', key: 'pool-1' });
    await new Promise((r) => setTimeout(r, 200));
    const scraping = fetch(`${gw.url}/_fencegate/metrics`).then((r) => r.text());
    await new Promise((r) => setTimeout(r, 200));
    for (const c of held) c.release();
    const text = await scraping;
    expect(value(text, 'waiting')).toBeGreaterThanOrEqual(1);
    expect(value(text, 'total')).toBe(6);
    expect((await pending).status).toBe(201);
  });
});
