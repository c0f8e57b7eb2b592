#!/usr/bin/env node
// A gateway child process on the PostgreSQL store, for the replica tests'
// negative control. Built from the compiled package (`npm run build` first)
// as `fencegate serve --database-url URL` builds it, except that the test may
// ask for a store wrapper that switches a check off. The production code has
// no such switch, and must not get one (CONTRIBUTING.md convention 7).
//
//   node test/helpers/pg-gateway-child.mjs CONFIG.json DATABASE_URL [--checks-off fence]
//
// Prints one JSON line {"msg":"listening","url":…} when ready; SIGTERM
// drains in-flight requests and exits 0.
import { readFileSync } from 'node:fs';
import { parseConfigText } from '../../dist/config/load.js';
import { signalReady } from '../../dist/entry/cluster.js';
import { startGateway } from '../../dist/entry/node.js';
import { createJsonLogger } from '../../dist/http/logger.js';
import { openStore } from '../../dist/entry/open-store.js';

const [configPath, databaseUrl, flag, off] = process.argv.slice(2);
if (!configPath || !databaseUrl) throw new Error('usage: pg-gateway-child.mjs CONFIG.json DATABASE_URL [--checks-off fence]');
const config = parseConfigText(readFileSync(configPath, 'utf8'), configPath);
// The URL replaces the file's; its other PostgreSQL settings (poolSize, queryTimeout) stay, as with --database-url.
config.store = { poolSize: 10, ...('postgres' in config.store ? config.store : {}), postgres: databaseUrl };
const logger = createJsonLogger({ level: process.env.FENCEGATE_LOG_LEVEL ?? 'info' });

const real = await openStore(config.store, { logger });
let store = real;
if (flag === '--checks-off' && off === 'fence') {
  // The store never sees the fence: nothing is compared, nothing refused.
  store = {
    kind: real.kind,
    admit: (i) => real.admit({ ...i, fence: null }),
    finish: (i) => real.finish(i),
    recordRejection: (i) => real.recordRejection(i),
    waitForChange: (t, ms, s) => real.waitForChange(t, ms, s),
    listRejections: (q) => real.listRejections(q),
    getEntity: (e) => real.getEntity(e),
    getRecords: (k) => real.getRecords(k),
    sweep: (o) => real.sweep(o),
    getFenceHistory: (e, p) => real.getFenceHistory(e, p),
    listRecords: (q) => real.listRecords(q),
    resolveRecord: (i) => real.resolveRecord(i),
    listOperatorActions: (p) => real.listOperatorActions(p),
    auditStats: () => real.auditStats(),
    close: () => real.close(),
  };
} else if (flag !== undefined) {
  throw new Error(`unknown option ${flag} ${off}`);
}

const running = await startGateway({ config, store, logger });
logger.info('listening', { url: running.url, store: 'postgres', checksOff: off ?? null, pid: process.pid });
process.on('SIGTERM', () => {
  running.close().then(
    () => process.exit(0),
    () => process.exit(1),
  );
});
// In a group (test/helpers/cluster-child.mjs): tells the primary that this worker is up, once SIGTERM is handled.
signalReady();
