import { afterAll, beforeAll, describe } from 'vitest';
import { startTestGateway, type RouteInput, type TestGateway } from '../helpers/gateway.js';
import { startPgTestGateway, type PgTestGateway } from '../helpers/pg-gateway.js';
import { POSTGRES_URL } from '../helpers/postgres.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { contractRoutes, describeHttpContract } from './contract.js';

// The one black-box HTTP contract (./contract.ts) against the Node gateway
// (startGateway, as `fencegate serve` runs it) on each of its stores. The
// Workers build answers the same contract under `wrangler dev`
// (test/workers/wrangler-dev.test.ts).

async function refusedUrl(): Promise<string> {
  return `http://127.0.0.1:${await freePort()}`;
}

describe('HTTP contract: Node gateway on SQLite', () => {
  let up: FakeUpstream;
  let gw: TestGateway;
  beforeAll(async () => {
    up = await startUpstream();
    gw = await startTestGateway({ routes: contractRoutes(up.url, await refusedUrl()) as RouteInput[] });
  });
  afterAll(async () => {
    await gw?.close();
    await up?.close();
  });
  describeHttpContract(() => ({ gatewayUrl: gw.url, upstream: up }));
});

describe.skipIf(!POSTGRES_URL)('HTTP contract: Node gateway on PostgreSQL', () => {
  let up: FakeUpstream;
  let gw: PgTestGateway;
  beforeAll(async () => {
    up = await startUpstream();
    gw = await startPgTestGateway({ routes: contractRoutes(up.url, await refusedUrl()) as RouteInput[], prefix: 'fg_contract' });
  });
  afterAll(async () => {
    await gw?.close();
    await up?.close();
  });
  describeHttpContract(() => ({ gatewayUrl: gw.url, upstream: up }));
});
