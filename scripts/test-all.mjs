// `npm test` (after the build): every tier, each writing a vitest JSON
// report, then one closing line summed over all of them:
// "tests: N passed, M failed, K skipped". The tiers (vitest.config.ts says
// which files each one holds):
//   unit, loopback, database, slow  vitest projects of vitest.config.ts,
//                                   run together as the Node run
//   workerd                         vitest.workers.config.mts, its own pool
// The exit code is non-zero when either run failed, also when the Node run
// failed first: the Workers run still goes, so that the summary covers
// everything.
//
// The reports are the ones .ci/summary.mjs reads in CI
// (test-results/vitest-node.json, test-results/vitest-workerd.json).
// Arguments (`npm test -- test/gateway/`, `npm test -- --project database`)
// go to the Node run only, and the Workers run is left out.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';

const runs = [
  {
    name: 'node',
    args: ['run', '--reporter=default', '--reporter=json', '--outputFile.json=test-results/vitest-node.json'],
    report: 'test-results/vitest-node.json',
  },
  {
    name: 'workerd',
    args: ['run', '-c', 'vitest.workers.config.mts', '--reporter=default', '--reporter=json', '--outputFile.json=test-results/vitest-workerd.json'],
    report: 'test-results/vitest-workerd.json',
  },
];

const extra = process.argv.slice(2);
const selected = extra.length > 0 ? [{ ...runs[0], args: [...runs[0].args, ...extra] }] : runs;
const vitest = new URL('../node_modules/vitest/vitest.mjs', import.meta.url).pathname;

let passed = 0;
let failed = 0;
let skipped = 0;
let exit = 0;
const notes = [];
const failures = [];
for (const run of selected) {
  // A report left from an earlier run must not be counted for this one.
  rmSync(run.report, { force: true });
  const r = spawnSync(process.execPath, [vitest, ...run.args], { stdio: 'inherit', env: process.env });
  if (r.status !== 0) exit = 1;
  if (!existsSync(run.report)) {
    notes.push(`the ${run.name} run wrote no report (exit ${r.status ?? r.signal})`);
    failed++;
    exit = 1;
    continue;
  }
  const j = JSON.parse(readFileSync(run.report, 'utf8'));
  passed += j.numPassedTests;
  failed += j.numFailedTests;
  skipped += j.numPendingTests + (j.numTodoTests ?? 0);
  failures.push(...failuresOf(run.name, j));
  // A file that failed to load fails no test, but fails the run.
  if (j.numFailedTestSuites > 0 && j.numFailedTests === 0) notes.push(`${j.numFailedTestSuites} ${run.name} test file(s) failed to run`);
}
// The failed tests are named again here, next to the closing line: a CI log
// cut to its tail still says which test failed and why.
for (const f of failures) console.log(f);
for (const n of notes) console.log(n);
console.log(`tests: ${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(exit !== 0 || failed > 0 || passed === 0 ? 1 : 0);

function failuresOf(runName, report) {
  const out = [];
  for (const file of report.testResults ?? []) {
    const path = String(file.name ?? '').replace(process.cwd() + '/', '');
    if (file.status === 'failed' && (file.assertionResults ?? []).length === 0) {
      out.push(`FAILED (${runName}) ${path}: ${firstLine(file.message)}`);
    }
    for (const t of file.assertionResults ?? []) {
      if (t.status !== 'failed') continue;
      out.push(`FAILED (${runName}) ${path} > ${t.fullName}: ${firstLine((t.failureMessages ?? [])[0])}`);
    }
  }
  return out;
}

function firstLine(text) {
  return String(text ?? '')
    .split('\n', 1)[0]
    .slice(0, 300);
}
