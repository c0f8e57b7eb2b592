#!/usr/bin/env node
// A `serve --workers N` group whose workers are a test gateway child
// (gateway-child.mjs for SQLite, pg-gateway-child.mjs for PostgreSQL; a
// check may be switched off in each of them: a negative control), run by
// the same primary as `fencegate serve --workers N` (dist/entry/cluster.js).
//
//   node test/helpers/cluster-child.mjs N gateway-child.mjs CONFIG.json [--checks-off fence|idempotency]
//   node test/helpers/cluster-child.mjs N pg-gateway-child.mjs CONFIG.json URL [--checks-off fence]
import { fileURLToPath } from 'node:url';
import { runPrimary } from '../../dist/entry/cluster.js';
import { createJsonLogger } from '../../dist/http/logger.js';

const [workers, script, ...args] = process.argv.slice(2);
const exec = fileURLToPath(new URL(`./${script}`, import.meta.url));
const code = await runPrimary({ workers: Number(workers), logger: createJsonLogger(), exec, args });
process.exit(code);
