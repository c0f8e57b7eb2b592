import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { notBeforeMs, reconcilePath, type ReconcileTarget } from '../../src/http/pipeline/reconcile.js';

describe('reconcile.path substitution (DESIGN §3.12)', () => {
  it('percent-encodes every variable, so a key cannot change the path or the query', () => {
    expect(reconcilePath('/v1/charges/{key}?entity={entity}&fence={fence}', { key: 'a/b?c=d&e f', entity: 'inv#7', fence: '42' })).toBe(
      '/v1/charges/a%2Fb%3Fc%3Dd%26e%20f?entity=inv%237&fence=42',
    );
  });

  it('a variable the record lacks (no entity, no fence): no query at all', () => {
    expect(reconcilePath('/v1/charges/{key}/{entity}', { key: 'k', entity: null })).toBeNull();
  });

  it('an entity "." or ".." (a dot segment, which URL parsing removes even as %2E%2E): no query at all', () => {
    for (const entity of ['.', '..']) expect(reconcilePath('/v1/customers/{entity}/charges/{key}', { key: 'k1', entity })).toBeNull();
    // Control: dots inside a value stay, encoded as they are.
    expect(reconcilePath('/v1/customers/{entity}/charges/{key}', { key: 'k.1', entity: 'a..b' })).toBe('/v1/customers/a..b/charges/k.1');
    expect(new URL(`https://psp.example${reconcilePath('/v1/customers/{entity}/charges/{key}', { key: 'k1', entity: 'a..b' })}`).pathname).toBe(
      '/v1/customers/a..b/charges/k1',
    );
  });

  it('a not-found is trusted the lock (timeoutMs + lockMarginMs) plus settleTime after the admission', () => {
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
    expect(notBeforeMs(c.routes[0] as ReconcileTarget['route'])).toBe(42_000);
  });
});
