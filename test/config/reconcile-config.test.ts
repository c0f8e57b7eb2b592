import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';

const route = (reconcile: unknown, over: Record<string, unknown> = {}) => ({
  routes: [{ name: 'charges', match: { path: '/charges' }, upstream: 'http://127.0.0.1:1', ...over, ...(reconcile === undefined ? {} : { reconcile }) }],
});

/** The one line the start-up error has for `reconcile`. */
function refusal(reconcile: unknown, over: Record<string, unknown> = {}): string {
  try {
    parseConfig(route(reconcile, over));
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    const issues = (err as ConfigError).issues;
    expect(issues).toHaveLength(1);
    return issues[0]!;
  }
  throw new Error('the configuration was accepted');
}

describe('routes[].reconcile (docs/configuration.md)', () => {
  it('defaults: GET, found [200], notFound [404], settleTime 30s, maxAge 24h', () => {
    const c = parseConfig(route({ path: '/v1/charges?idempotency_key={key}' }));
    expect(c.routes[0]!.reconcile).toEqual({
      method: 'GET',
      path: '/v1/charges?idempotency_key={key}',
      headers: {},
      found: [200],
      notFound: [404],
      settleTime: 30_000,
      interval: 10_000,
      maxAge: 86_400_000,
      concurrency: 4,
    });
  });

  it("refused where keys belong to a caller, a tenant or a credential: the query, by key alone, could find another caller's command", () => {
    const rc = { path: '/v1/charges/{key}' };
    expect(refusal(rc, { keyScope: { header: 'X-Tenant' } })).toMatch(/routes\[0\]\.reconcile: not available where idempotency keys are scoped/);
    expect(refusal(rc, { credentialBinding: 'scope' })).toMatch(/routes\[0\]\.reconcile: not available where/);
    expect(refusal(rc, { credentialHeaders: ['X-Api-Key'] })).toMatch(/routes\[0\]\.reconcile: not available where/);
    expect(() => parseConfig({ auth: { secret: 'x'.repeat(32), issuer: 'https://id.test', audience: 'fg' }, ...route(rc) })).toThrow(
      /routes\[0\]\.reconcile: not available where/,
    );
    // Control: the same route with keys per route alone is accepted.
    expect((parseConfig(route(rc)).routes[0]!.reconcile as { path?: string } | undefined)?.path).toBe('/v1/charges/{key}');
  });

  it('absent: the route has none (nothing changes)', () => {
    expect(parseConfig(route(undefined)).routes[0]!.reconcile).toBeUndefined();
  });

  it('a template that does not identify the command stops start-up with one line naming the field', () => {
    expect(refusal({ path: '/v1/charges/{entity}' })).toMatch(/^routes\[0\]\.reconcile\.path: .*\{key\}.*\{request_id\}/);
  });

  it('a method with a body is refused', () => {
    expect(refusal({ method: 'POST', path: '/c/{key}' })).toMatch(/^routes\[0\]\.reconcile\.method: .*GET or HEAD/);
  });

  it('an unknown variable and a 2xx as not-found are refused', () => {
    expect(refusal({ path: '/c/{key}/{tenant}' })).toMatch(/^routes\[0\]\.reconcile\.path: unknown variable \{tenant\}/);
    expect(refusal({ path: '/c/{key}', notFound: [200] })).toMatch(/^routes\[0\]\.reconcile\.notFound\[0\]: /);
  });

  it("{request_id} (the attempt's request id, kept with its record) identifies the command, alone or with {key}", () => {
    expect((parseConfig(route({ path: '/c/by-request/{request_id}' })).routes[0]!.reconcile as { path?: string } | undefined)?.path).toBe(
      '/c/by-request/{request_id}',
    );
    expect((parseConfig(route({ path: '/c/{key}?request={request_id}' })).routes[0]!.reconcile as { path?: string } | undefined)?.path).toBe(
      '/c/{key}?request={request_id}',
    );
  });

  it('not with onUnknown "retry", not on an mcp route', () => {
    expect(refusal({ path: '/c/{key}' }, { onUnknown: 'retry' })).toMatch(/^routes\[0\]\.reconcile: .*onUnknown/);
    expect(refusal({ path: '/c/{key}' }, { protocol: 'mcp' })).toMatch(/^routes\[0\]\.reconcile: .*mcp/);
  });
});
