import { describe } from 'vitest';
import { runnerSuite } from './runner-suite.js';
import { POSTGRES_URL, postgresDatabase } from './helpers/stores.js';

describe.skipIf(!POSTGRES_URL)('PostgreSQL', () => {
  // The runner-only tests run once, on SQLite (runner.sqlite.slow.test.ts).
  runnerSuite('PostgreSQL', postgresDatabase, 'store-dependent');
});
