import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { explainIssues, knownKeys, nearest } from '../../src/config/explain.js';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { ConfigSchema } from '../../src/config/schema.js';

// Configuration errors an operator can act on (src/config/explain.ts): the
// nearest known key, "required", the kinds of a union. The known keys come
// from the schema, so the tests also run the formatter over a schema of their own.

const route = { name: 'p', match: { path: '/p/*' }, upstream: 'http://127.0.0.1:9' };
const issuesOf = (input: unknown): string[] => {
  try {
    parseConfig(input);
  } catch (err) {
    if (err instanceof ConfigError) return err.issues;
    throw err;
  }
  throw new Error('the configuration parsed');
};

describe('configuration errors', () => {
  it.each([
    [{ routes: [{ ...route, timeoutMS: 5 }] }, 'routes[0]: unknown key "timeoutMS" (did you mean "timeoutMs"?)'],
    [{ routes: [{ ...route, retenion: '1h' }] }, 'routes[0]: unknown key "retenion" (did you mean "retention"?)'],
    [{ routes: [route], lisen: {} }, '(root): unknown key "lisen" (did you mean "listen"?)'],
    [{ routes: [route], metrics: { enable: true } }, 'metrics: unknown key "enable" (did you mean "enabled"?)'],
    [{ routes: [{ ...route, match: { path: '/p/*', method: ['POST'] } }] }, 'routes[0].match: unknown key "method" (did you mean "methods"?)'],
    [{ routes: [route], somethingElse: 1 }, '(root): unknown key "somethingElse"'],
    [{ routes: [{ name: 'p', match: { path: '/p/*' } }] }, 'routes[0].upstream: required'],
    [{ routes: [{ name: 'p', upstream: 'http://x' }] }, 'routes[0].match: required'],
    [{}, 'routes: required'],
    [{ routes: [route], store: { mysql: 'x' } }, 'store: unknown kind "mysql" (expected one of "sqlite", "postgres", "d1")'],
    [{ routes: [route], store: {} }, 'store: needs one of "sqlite", "postgres", "d1"'],
    [{ routes: [route], store: 'fencegate.db' }, 'store: expected an object with one of "sqlite", "postgres", "d1"'],
    [{ routes: [{ ...route, entity: { cookie: 'job' } }] }, 'routes[0].entity: unknown kind "cookie" (expected one of "header", "path", "json")'],
  ])('%j → %s', (input, line) => {
    expect(issuesOf(input)).toContain(line);
  });

  it('other messages are zod’s, unchanged', () => {
    expect(issuesOf({ routes: [{ ...route, timeoutMs: 0 }] })).toEqual([expect.stringMatching(/^routes\[0\]\.timeoutMs: Too small/)]);
    expect(issuesOf({ routes: [{ ...route, upstream: 'ftp://x' }] })).toEqual(['routes[0].upstream: must be an http:// or https:// URL']);
  });

  it('the known keys are the schema’s: a field added to a schema is suggested with no edit to the formatter', () => {
    const schema = z.strictObject({ a: z.strictObject({ brandNewField: z.number().default(1) }).prefault({}) });
    const r = schema.safeParse({ a: { brandNewFeild: 2 } });
    expect(r.success).toBe(false);
    expect(explainIssues(r.error!.issues, { a: { brandNewFeild: 2 } }, schema)).toEqual(['a: unknown key "brandNewFeild" (did you mean "brandNewField"?)']);
    expect(knownKeys(ConfigSchema, ['routes', 0])).toEqual(expect.arrayContaining(['timeoutMs', 'upstream', 'idempotencyKeyFrom']));
    expect(knownKeys(ConfigSchema, ['store'])).toEqual([
      'sqlite',
      'synchronous',
      'postgres',
      'poolSize',
      'queryTimeout',
      'schema',
      'pooler',
      'listenUrl',
      'd1',
    ]);
  });

  it('nearest: a case difference wins, a far key suggests nothing', () => {
    expect(nearest('timeoutMS', ['timeoutMs', 'timeout'])).toBe('timeoutMs');
    expect(nearest('xyz', ['listen', 'store'])).toBeNull();
  });
});
