/**
 * A gateway (startGateway, SQLite, undici) and a loopback upstream in one
 * process; one request with a caller's traceparent. Prints one JSON line:
 * whether tracing loaded, the status, the trace headers the upstream got,
 * and whether /metrics answered with the build info.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseConfig } from '../../../src/config/load.js';
import { startGateway } from '../../../src/entry/node.js';
import { silentLogger } from '../../../src/http/logger.js';
import { loadTracing } from '../../../src/observe/tracing.js';

const seen: Record<string, string | undefined> = {};
const upstream = createServer((req, res) => {
  seen.traceparent = req.headers.traceparent as string | undefined;
  seen.tracestate = req.headers.tracestate as string | undefined;
  req.resume();
  req.on('end', () => res.writeHead(201, { 'content-type': 'application/json' }).end('{}'));
});
await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
const dir = mkdtempSync(join(tmpdir(), 'fg-no-otel-'));
const config = parseConfig({
  listen: { host: '127.0.0.1', port: 0 },
  store: { sqlite: join(dir, 'g.db'), synchronous: 'NORMAL' },
  routes: [
    {
      name: 'payments',
      match: { path: '/payments/*', methods: ['POST'] },
      upstream: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`,
      entity: { header: 'X-Fence-Entity' },
      fence: 'required',
      idempotency: 'required',
    },
  ],
});
const gw = await startGateway({ config, logger: silentLogger, env: {} });
const res = await fetch(`${gw.url}/payments/x`, {
  method: 'POST',
  headers: { 'x-execution-fence': '1', 'x-fence-entity': 'e', 'idempotency-key': 'k', traceparent: process.argv[2]!, tracestate: 'vendor=1' },
  body: '{}',
});
const metrics = await (await fetch(`${gw.url}/_fencegate/metrics`)).text();
console.log(
  JSON.stringify({
    loaded: await loadTracing(),
    status: res.status,
    ...seen,
    buildInfo: /^fencegate_build_info\{/m.test(metrics),
    processMetrics: /^process_cpu_user_seconds_total /m.test(metrics),
  }),
);
await gw.close();
upstream.close();
rmSync(dir, { recursive: true, force: true });
