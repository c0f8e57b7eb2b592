#!/usr/bin/env node
// A gateway child process built from the compiled package (`npm run build`
// first) as `fencegate serve` builds it, with the undici forwarder's
// test-only `deadlineGraceTurns` set from the command line: 0 is the negative
// control that aborts the moment the deadline is due, even with the answer
// already in the socket.
//
//   node test/faults/toolkit/grace-gateway-child.mjs CONFIG.json [GRACE_TURNS]
//
// Prints one JSON line {"msg":"listening","url":…} when ready.
import { readFileSync } from 'node:fs';
import { parseConfigText } from '../../../dist/config/load.js';
import { createUndiciForwarder, startGateway } from '../../../dist/entry/node.js';
import { createJsonLogger } from '../../../dist/http/logger.js';

const [configPath, turns] = process.argv.slice(2);
const config = parseConfigText(readFileSync(configPath, 'utf8'), configPath);
const logger = createJsonLogger({ level: process.env.FENCEGATE_LOG_LEVEL ?? 'info' });
const forwarder = createUndiciForwarder(turns === undefined ? {} : { deadlineGraceTurns: Number(turns) });
const running = await startGateway({ config, logger, forwarder });
logger.info('listening', { url: running.url, deadlineGraceTurns: turns ?? null });
process.on('SIGTERM', () => {
  running.close().then(
    () => process.exit(0),
    () => process.exit(1),
  );
});
