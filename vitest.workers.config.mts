// The tests that run INSIDE workerd (the Workers runtime) against a local D1:
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
        miniflare: { bindings: { TEST_MIGRATIONS: migrations } },
      }),
    ],
    test: {
      include: ['test/workers/**/*.workerd.ts'],
      globalSetup: ['test/workers/fake-upstream.setup.ts'],
      setupFiles: ['test/workers/apply-migrations.setup.ts'],
      testTimeout: 30_000,
      hookTimeout: 30_000,
      maxWorkers: 1,
      reporters: process.env.CI ? ['default', 'json'] : ['default'],
      outputFile: { json: 'test-results/vitest-workerd.json' },
    },
  };
});
