import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { describe, expect, it } from 'vitest';
import { SCHEMA_FILE, configJsonSchemaText } from '../../src/config/json-schema.js';
import { parseConfig } from '../../src/config/load.js';
import { ROOT } from '../helpers/child.js';
import { run } from '../deploy/proc.js';

// examples/fencegate.schema.json is the zod schema's JSON Schema
// (`fencegate config schema`), committed for editors; it must never drift
// from the schema that validates at start-up.

const committed = readFileSync(join(ROOT, SCHEMA_FILE), 'utf8');
const example = JSON.parse(readFileSync(join(ROOT, 'examples', 'fencegate.example.json'), 'utf8'));
// ajv (through @modelcontextprotocol/sdk, a dev dependency) checks files against it as an editor would.
const ajv = new Ajv2020({ strict: false, allErrors: true });
(addFormats as unknown as (a: Ajv2020) => void)(ajv);
const validate = ajv.compile(JSON.parse(committed));
const route = { name: 'payments', match: { path: '/payments/*' }, upstream: 'http://127.0.0.1:9' };

describe('the committed JSON Schema', () => {
  it(`is what the zod schema generates now (regenerate: node dist/entry/cli.js config schema > ${SCHEMA_FILE})`, () => {
    expect(committed).toBe(configJsonSchemaText());
  });

  it('is what `fencegate config schema` prints', async () => {
    const r = await run(['config', 'schema'], { keepStdout: true });
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(committed);
  });

  it('the example names it in "$schema", validates against it, and parses', () => {
    expect(example.$schema).toBe('./fencegate.schema.json');
    expect(validate(example), JSON.stringify(validate.errors)).toBe(true);
    expect(parseConfig(example).routes[0]!.name).toBe('payments');
  });

  it('the compose configuration (deploy/fencegate.compose.json) validates against it and parses with its environment', () => {
    const compose = JSON.parse(readFileSync(join(ROOT, 'deploy', 'fencegate.compose.json'), 'utf8'));
    expect(validate(compose), JSON.stringify(validate.errors)).toBe(true);
    const config = parseConfig(compose, { env: { DATABASE_URL: 'postgres://u@db/x', FENCEGATE_UPSTREAM: 'https://api.example.com' } });
    expect(config.store).toMatchObject({ postgres: 'postgres://u@db/x' });
    expect(config.routes[0]!.upstream).toBe('https://api.example.com');
  });

  it('offers { "env": … } where the resolver takes it, and nowhere else', () => {
    const withEnv = {
      store: { postgres: { env: 'DATABASE_URL' } },
      credentialHashKey: { env: 'HASH_KEY' },
      routes: [
        {
          ...route,
          upstream: { env: 'UPSTREAM', prefix: 'https://' },
          tls: { ca: { env: 'CA_PEM' }, cert: './client.pem', key: { pem: '-----BEGIN PRIVATE KEY-----' } },
          upstreamHeaders: { Authorization: { env: 'TOKEN', prefix: 'Bearer ' } },
        },
      ],
    };
    expect(validate(withEnv), JSON.stringify(validate.errors)).toBe(true);
    // Not every string: a route's name or path is never read from the environment.
    expect(validate({ routes: [{ ...route, name: { env: 'NAME' } }] })).toBe(false);
    // A misspelt key in the reference is flagged as the parser would flag it.
    expect(validate({ routes: [{ ...route, upstream: { enV: 'UPSTREAM' } }] })).toBe(false);
  });
});
