import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { prepareConfig } from '../../src/config/prepare.js';

// `{ "env": … }` for every URL and secret of the configuration, resolved once
// at start-up; a missing variable names its field (CONTRIBUTING.md convention 4).

const route = { name: 'payments', match: { path: '/payments/*' }, upstream: 'http://127.0.0.1:9' };
const refused = (fn: () => unknown): string[] => {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as ConfigError).issues;
  }
  throw new Error('the configuration was accepted');
};

describe('{ "env": … } in the configuration', () => {
  it('resolves a route upstream, the PostgreSQL URLs and the secrets', () => {
    const env = {
      UP: 'https://api.example.com/v1',
      PG: 'postgres://u@db/x',
      PG_LISTEN: 'postgres://u@db-direct/x',
      HASH: 'h'.repeat(40),
      JWT: 's'.repeat(40),
      FENCE: 'f'.repeat(40),
      TOKEN: 'sk_live_1',
    };
    const config = parseConfig(
      {
        store: { postgres: { env: 'PG' }, listenUrl: { env: 'PG_LISTEN' }, pooler: 'transaction' },
        credentialHashKey: { env: 'HASH' },
        auth: { secret: { env: 'JWT' }, issuer: 'i', audience: 'a' },
        fence: { signed: { secret: { env: 'FENCE' } } },
        routes: [{ ...route, upstream: { env: 'UP' }, upstreamHeaders: { Authorization: { env: 'TOKEN', prefix: 'Bearer ' } } }],
      },
      { env },
    );
    expect(config.routes[0]!.upstream).toBe('https://api.example.com/v1');
    expect(config.routes[0]!.upstreamHeaders).toEqual({ Authorization: 'Bearer sk_live_1' });
    expect(config.store).toMatchObject({ postgres: 'postgres://u@db/x', listenUrl: 'postgres://u@db-direct/x' });
    expect(config.credentialHashKey).toBe(env.HASH);
    expect(config.auth?.secret).toBe(env.JWT);
    expect(config.fence.signed?.secret).toBe(env.FENCE);
  });

  it('names the field of each missing variable, once, and validates the resolved value', () => {
    const issues = refused(() =>
      parseConfig(
        {
          store: { postgres: { env: 'NO_PG' } },
          routes: [
            { ...route, upstream: { env: 'NO_UP' } },
            { ...route, name: 'b', upstream: { env: 'BAD_UP' } },
          ],
        },
        { env: { BAD_UP: 'ftp://x' } },
      ),
    );
    expect(issues).toEqual([
      'routes[0].upstream: environment variable NO_UP is not set',
      'store.postgres: environment variable NO_PG is not set',
      expect.stringMatching(/^routes\[1\]\.upstream: must be an http/),
    ]);
  });

  it('an empty variable is a missing one', () => {
    expect(refused(() => parseConfig({ routes: [{ ...route, upstream: { env: 'UP' } }] }, { env: { UP: '' } }))).toEqual([
      'routes[0].upstream: environment variable UP is not set',
    ]);
  });

  it('without an explicit environment, secrets stay { env } for the gateway to read (the Worker entry), URLs come from process.env', () => {
    process.env.FENCEGATE_TEST_ENV_UPSTREAM = 'http://127.0.0.1:7';
    try {
      const config = parseConfig({ credentialHashKey: { env: 'NOT_HERE' }, routes: [{ ...route, upstream: { env: 'FENCEGATE_TEST_ENV_UPSTREAM' } }] });
      expect(config.routes[0]!.upstream).toBe('http://127.0.0.1:7');
      expect(config.credentialHashKey).toEqual({ env: 'NOT_HERE' });
    } finally {
      delete process.env.FENCEGATE_TEST_ENV_UPSTREAM;
    }
  });

  it('accepts and ignores a top-level $schema', () => {
    expect(parseConfig({ $schema: './fencegate.schema.json', routes: [route] }).routes).toHaveLength(1);
  });

  it('prepareConfig (the Node entry, before the store) refuses secrets the gateway would refuse later', async () => {
    const config = parseConfig({ credentialHashKey: { env: 'H' }, routes: [{ ...route, upstreamHeaders: { 'X-Key': { env: 'K' } } }] });
    await expect(prepareConfig(config, {})).rejects.toMatchObject({
      issues: ['routes[0].upstreamHeaders.X-Key: environment variable K is not set', 'credentialHashKey: environment variable H is not set'],
    });
    await expect(prepareConfig(config, { H: 'x'.repeat(32), K: 'k' })).resolves.toBeDefined();
  });
});
