// Diagnostic (bench/http.mjs --only ...,fg-hono): fencegate exactly as
// `fencegate serve` builds it, but served the way it was before the Node
// listener (src/entry/node-listener.ts) existed: every request through the
// Hono app under @hono/node-server, proxied ones included. Beside fg-normal
// in the same run, it measures what skipping Hono's Request/Response buys.
import { createAdaptorServer } from '@hono/node-server';
import { readFileSync } from 'node:fs';
import { parseConfigText } from '../../dist/config/load.js';
import { createUndiciForwarder } from '../../dist/http/forward-undici.js';
import { createGateway } from '../../dist/http/gateway.js';
import { createJsonLogger } from '../../dist/http/logger.js';
import { openStore } from '../../dist/entry/node.js';

const config = parseConfigText(readFileSync(process.argv[2], 'utf8'));
const store = await openStore(config.store);
const gateway = createGateway({ config, store, forwarder: createUndiciForwarder(), logger: createJsonLogger(), admin: true });
const server = createAdaptorServer({ fetch: gateway.app.fetch });
server.listen(config.listen.port, config.listen.host, () => console.log(JSON.stringify({ port: server.address().port })));
process.on('SIGTERM', () => server.close(() => gateway.close().then(() => process.exit(0))));
