#!/usr/bin/env node
// A `serve --workers N` group whose workers are test/helpers/gateway-child.mjs
// (a check may be switched off in each of them: a negative control), run by
// the same primary as `fencegate serve --workers N` (dist/entry/cluster.js).
//
//   node test/helpers/cluster-child.mjs N CONFIG.json [--checks-off fence|idempotency]
import { fileURLToPath } from 'node:url';
import { runPrimary } from '../../dist/entry/cluster.js';
import { createJsonLogger } from '../../dist/http/logger.js';

const [workers, ...args] = process.argv.slice(2);
const exec = fileURLToPath(new URL('./gateway-child.mjs', import.meta.url));
const code = await runPrimary({ workers: Number(workers), logger: createJsonLogger(), exec, args });
process.exit(code);
