// vitest globalSetup (vitest.config.ts): says once per run, in the main
// process, that the PostgreSQL suites are skipped, instead of once per test
// worker. The workers inherit FENCEGATE_PG_SKIP_NOTICE, which keeps
// test/helpers/postgres.ts from saying it again.
import { POSTGRES_SKIP_NOTICE } from './postgres-notice.js';

export default function setup(): void {
  if (process.env.FENCEGATE_TEST_POSTGRES_URL || process.env.FENCEGATE_PG_SKIP_NOTICE) return;
  process.env.FENCEGATE_PG_SKIP_NOTICE = '1';
  console.warn(POSTGRES_SKIP_NOTICE);
}
