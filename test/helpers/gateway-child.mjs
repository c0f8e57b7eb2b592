#!/usr/bin/env node
// A gateway child process for the multi-process tests, built from the
// compiled package (`npm run build` first) exactly as `fencegate serve`
// builds it, except that a test may ask for a store wrapper that switches a
// check off (a negative control). The production code has no such switch.
//
//   node test/helpers/gateway-child.mjs CONFIG.json [--checks-off fence|idempotency]
//
// Prints one JSON line {"msg":"listening","url":…} when ready; SIGTERM
// drains in-flight requests and exits 0.
import { readFileSync } from 'node:fs';
import { parseConfigText } from '../../dist/config/load.js';
import { signalReady } from '../../dist/entry/cluster.js';
import { startGateway } from '../../dist/entry/node.js';
import { createJsonLogger } from '../../dist/http/logger.js';
import { createSqliteStore } from '../../dist/store/sqlite/index.js';

const [configPath, flag, off] = process.argv.slice(2);
const config = parseConfigText(readFileSync(configPath, 'utf8'), configPath);
const logger = createJsonLogger({ level: process.env.FENCEGATE_LOG_LEVEL ?? 'info' });

const real = createSqliteStore({ path: config.store.sqlite, synchronous: config.store.synchronous });
const wrap = (overrides) => ({
  kind: real.kind,
  admit: (i) => real.admit(i),
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
  ...overrides,
});
let store = real;
if (flag === '--checks-off' && off === 'fence') store = wrap({ admit: (i) => real.admit({ ...i, fence: null }) });
else if (flag === '--checks-off' && off === 'idempotency') {
  store = wrap({ admit: (i) => real.admit({ ...i, key: null }), finish: (i) => real.finish({ ...i, key: null }) });
} else if (flag !== undefined) throw new Error(`unknown option ${flag} ${off}`);

const running = await startGateway({ config, store, logger });
logger.info('listening', { url: running.url, checksOff: off ?? null, pid: process.pid });
process.on('SIGTERM', () => {
  running.close().then(
    () => process.exit(0),
    () => process.exit(1),
  );
});
// In a group (test/helpers/cluster-child.mjs): tells the primary that this worker is up, once SIGTERM is handled.
signalReady();
