import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Child-process and multi-process tests share one machine with 2 cores:
    // files run in parallel, tests inside a file run in order.
    fileParallelism: true,
    maxWorkers: 2,
    // The PostgreSQL skip notice, once per run instead of once per worker.
    globalSetup: ['test/helpers/postgres-notice.setup.ts'],
    // In CI a JSON report too, summed by .ci/summary.mjs into one closing line.
    reporters: process.env.CI ? ['default', 'json'] : ['default'],
    outputFile: { json: 'test-results/vitest-node.json' },
  },
});
