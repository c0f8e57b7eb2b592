import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { reconcilePath } from '../../src/http/pipeline/reconcile.js';
import { notBefore, trustedAt, type ReconcileTarget } from '../../src/http/pipeline/reconcile-rules.js';

describe('reconcile.path substitution (DESIGN §3.12)', () => {
  it('percent-encodes every variable, so a key cannot change the path or the query', () => {
    expect(reconcilePath('/v1/charges/{key}?entity={entity}&fence={fence}', { key: 'a/b?c=d&e f', entity: 'inv#7', fence: '42' })).toBe(
      '/v1/charges/a%2Fb%3Fc%3Dd%26e%20f?entity=inv%237&fence=42',
    );
  });

  it('a variable the record lacks (no entity, no fence): no query at all', () => {
    expect(reconcilePath('/v1/charges/{key}/{entity}', { key: 'k', entity: null })).toBeNull();
  });

  it("{request_id}: the attempt's request id, percent-encoded; a record that keeps none (written before it was kept) is not asked about", () => {
    expect(reconcilePath('/v1/requests/{request_id}?key={key}', { key: 'k 1', request_id: '0b6c9a3e-1f2d-4c5b-8a7e-9d0c1b2a3f4e' })).toBe(
      '/v1/requests/0b6c9a3e-1f2d-4c5b-8a7e-9d0c1b2a3f4e?key=k%201',
    );
    expect(reconcilePath('/v1/requests/{request_id}', { key: 'k', request_id: null })).toBeNull();
  });

  it('an entity "." or ".." (a dot segment, which URL parsing removes even as %2E%2E): no query at all', () => {
    for (const entity of ['.', '..']) expect(reconcilePath('/v1/customers/{entity}/charges/{key}', { key: 'k1', entity })).toBeNull();
    // Control: dots inside a value stay, encoded as they are.
    expect(reconcilePath('/v1/customers/{entity}/charges/{key}', { key: 'k.1', entity: 'a..b' })).toBe('/v1/customers/a..b/charges/k.1');
    expect(new URL(`https://psp.example${reconcilePath('/v1/customers/{entity}/charges/{key}', { key: 'k1', entity: 'a..b' })}`).pathname).toBe(
      '/v1/customers/a..b/charges/k1',
    );
  });

  it("a not-found is trusted settleTime after the attempt's own lock end; without one, the lock plus settleTime after the admission", () => {
    const c = parseConfig({
      routes: [
        {
          name: 'c',
          match: { path: '/c' },
          upstream: 'http://127.0.0.1:9',
          timeoutMs: 10_000,
          lockMarginMs: 2_000,
          reconcile: { path: '/c/{key}', settleTime: '30s' },
        },
      ],
    });
    const route = c.routes[0] as ReconcileTarget['route'];
    expect(notBefore(route)).toEqual({ settleMs: 30_000, legacyBoundMs: 42_000 });
    // This process's estimate for the hint, from the same two.
    const createdAt = new Date(1_000_000);
    expect(trustedAt({ route, createdAt, attemptUntil: new Date(5_000_000) })).toBe(5_030_000);
    expect(trustedAt({ route, createdAt, attemptUntil: null })).toBe(1_042_000);
  });
});
