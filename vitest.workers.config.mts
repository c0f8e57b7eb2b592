// The workerd tier: the tests that run INSIDE workerd (the Workers runtime)
// against a local D1 (the other four tiers are the projects of vitest.config.ts):
//   WRANGLER_SEND_METRICS=false npx vitest run -c vitest.workers.config.mts
// The main config (vitest.config.ts, Node) does not pick these files up:
// they are named *.workerd.ts.
import { cloudflareTest, readD1Migrations } from '@cloudflare/vitest-pool-workers';
import { defineConfig } from 'vitest/config';

export default defineConfig(async () => {
  const migrations = await readD1Migrations('migrations/gateway/sqlite');
  return {
    plugins: [
      cloudflareTest({
        // Bindings, flags and compatibility date from the real wrangler.toml.
        wrangler: { configPath: './wrangler.toml' },
        miniflare: {
          bindings: { TEST_MIGRATIONS: migrations },
          // Miniflare by default sends every subrequest through a JS proxy
          // worker of its own (it drops CF-Connecting-IP). When the upstream
          // fails, that worker's fetch handler rejects, workerd prints an
          // "uncaught exception" for it, and the Worker under test gets the
          // error tunnelled from another worker (with an extra `remote: true`).
          // Off: the Worker's fetch goes to the network as on a deployment,
          // the forwarder's own `cf-*` filter is the only one the tests see,
          // and a green run prints no "uncaught exception". The env knob turns the
          // proxy back on for the negative control of workerd-output.test.ts.
          stripCfConnectingIp: process.env.FENCEGATE_TEST_MINIFLARE_OUTBOUND_PROXY === '1',
        },
      }),
    ],
    test: {
      include: ['test/workers/**/*.workerd.ts'],
      globalSetup: ['test/workers/fake-upstream.setup.ts', 'test/workers/reconcile-upstream.setup.ts'],
      setupFiles: ['test/workers/apply-migrations.setup.ts'],
      testTimeout: 30_000,
      hookTimeout: 30_000,
      maxWorkers: 1,
      reporters: process.env.CI ? ['default', 'json'] : ['default'],
      outputFile: { json: 'test-results/vitest-workerd.json' },
    },
  };
});
