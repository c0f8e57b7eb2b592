import { defineConfig } from 'vitest/config';

// The Node suite in four tiers, each a vitest project chosen by folder or by
// file suffix: a new test joins its tier by where it is or how it is named,
// there is no list of files to keep. The fifth tier, workerd, is
// vitest.workers.config.mts (another pool, files named *.workerd.ts).
//
//   unit      pure code: no server, no socket, no child process, no database
//             server (in-memory SQLite and Hono's in-process `app.request`
//             are fine). test/unit/, test/fast/, test/architecture/, *.unit.test.ts
//   loopback  everything else: real HTTP servers on 127.0.0.1, SQLite files,
//             no database server, quick. The default tier.
//   database  needs PostgreSQL or Redis for some of its cases (skipped without
//             FENCEGATE_TEST_POSTGRES_URL / FENCEGATE_TEST_REDIS_URL):
//             *.postgres.test.ts, *.redis.test.ts, *.db.test.ts (SQLite and
//             PostgreSQL cases in one file), test/store/postgres*.test.ts,
//             test/db/, test/replicas/
//   slow      child processes, crash and kill, soak, browsers, several
//             processes, long waits, volume: *.slow.test.ts, test/faults/,
//             test/console/, test/docs/, test/examples/, test/workers/ (the
//             Node side of the Workers tier: wrangler dev, nested workerd
//             runs), test/mcp/ (an MCP SDK session against a gateway and an
//             MCP upstream in every test, with stream timeouts), test/deploy/
//             (the gateway as a child process: probes, reload, the
//             Dockerfile's stages, promtool)
//
// A file that matches several tiers goes to the first of slow, database,
// unit, loopback: each project excludes the patterns of those before it, so
// every file runs in exactly one project.
//
//   npm run test:fast   unit + loopback (no database server needed)
//   npx vitest run --project database   (or test:unit, test:db, test:slow)
//   npm test            every project, then the workerd tier

const SLOW = ['test/**/*.slow.test.ts', 'test/{faults,console,docs,examples,workers,mcp,deploy}/**/*.test.ts'];
const DATABASE = ['test/**/*.{postgres,redis,db}.test.ts', 'test/store/postgres*.test.ts', 'test/{db,replicas}/**/*.test.ts'];
const UNIT = ['test/**/*.unit.test.ts', 'test/{unit,fast,architecture}/**/*.test.ts'];
const LOOPBACK = ['test/**/*.test.ts'];

/** The options every tier shares (a project does not inherit the root's test options). */
const shared = { testTimeout: 30_000, hookTimeout: 30_000 };

/** A tier: its own patterns, minus those of the tiers before it. */
function tier(name: string, include: string[], ...before: string[][]) {
  return { test: { ...shared, name, include, exclude: ['**/node_modules/**', ...before.flat()] } };
}

export default defineConfig({
  test: {
    ...shared,
    projects: [
      // First match wins: a file is in the first tier whose patterns it matches.
      tier('slow', SLOW),
      tier('database', DATABASE, SLOW),
      tier('unit', UNIT, SLOW, DATABASE),
      tier('loopback', LOOPBACK, SLOW, DATABASE, UNIT),
    ],
    // Child-process and multi-process tests share one machine with 2 cores:
    // files run in parallel, tests inside a file run in order.
    fileParallelism: true,
    maxWorkers: 2,
    // The PostgreSQL skip notice, once per run instead of once per worker
    // (the root's global setup runs whichever projects are selected).
    globalSetup: ['test/helpers/postgres-notice.setup.ts'],
    // In CI a JSON report too, summed by .ci/summary.mjs into one closing line.
    reporters: process.env.CI ? ['default', 'json'] : ['default'],
    outputFile: { json: 'test-results/vitest-node.json' },
  },
});
