/** The one line that says the PostgreSQL suites are skipped (printed once per run: ./postgres-notice.setup.ts). */
export const POSTGRES_SKIP_NOTICE =
  '[fencegate] FENCEGATE_TEST_POSTGRES_URL is not set: the PostgreSQL suites are SKIPPED. ' +
  'Set it (e.g. postgres://postgres@127.0.0.1:5432/test) to run them; CI always does.';
