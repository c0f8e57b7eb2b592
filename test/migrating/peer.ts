import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { inProcessGateway, type InProcessGateway } from '../helpers/in-process.js';

/**
 * A gateway on the exact file `examples/migrating/<name>.json` (the one
 * docs/migrating.md shows): only `upstream` (the in-process upstream) and
 * `store` (SQLite in memory) are replaced. Fences are off in every file, so
 * requests carry no fence headers.
 */
export function peerGateway(name: string): { g: InProcessGateway; file: any } {
  const file = JSON.parse(readFileSync(join(dirname(fileURLToPath(import.meta.url)), '../../examples/migrating', `${name}.json`), 'utf8'));
  const { store: _store, routes, ...rest } = file;
  const g = inProcessGateway({ routes: routes.map(({ upstream: _u, ...r }: Record<string, unknown>) => r), config: rest });
  return { g, file };
}

/** One request as the peer's clients send it: a key header (or none), a JSON body. */
export function send(
  g: InProcessGateway,
  path: string,
  o: { method?: string; key?: string; body?: string; headers?: Record<string, string> } = {},
): Promise<Response> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...o.headers };
  if (o.key !== undefined) headers['idempotency-key'] = o.key;
  const method = o.method ?? 'POST';
  const body = method === 'GET' || method === 'HEAD' ? null : (o.body ?? '{"amount":1200}');
  return Promise.resolve(g.gateway.app.request(path, { method, headers, body }));
}
