/**
 * The few `cloudflare:*` modules the workerd tests import, typed for the
 * repository's tsconfig (which has Node types, not @cloudflare/workers-types).
 * The full declarations ship in @cloudflare/vitest-pool-workers/types.
 */
declare module 'cloudflare:workers' {
  /** The bindings of wrangler.toml (D1 `DB`, [vars]) plus the test-only ones of vitest.workers.config.mts. */
  export const env: Record<string, unknown> & {
    DB: import('../../src/store/d1/index.js').D1DatabaseLike;
    TEST_MIGRATIONS: { name: string; queries: string[] }[];
    FENCEGATE_CONFIG: string;
  };
}

declare module 'cloudflare:test' {
  export interface ExecutionContext {
    waitUntil(promise: Promise<unknown>): void;
    passThroughOnException(): void;
  }
  export function createExecutionContext(): ExecutionContext;
  export function waitOnExecutionContext(ctx: ExecutionContext): Promise<void>;
  export function createScheduledController(options?: { scheduledTime?: number; cron?: string }): unknown;
  export function reset(): Promise<void>;
  export function applyD1Migrations(db: unknown, migrations: { name: string; queries: string[] }[], migrationsTableName?: string): Promise<void>;
}
