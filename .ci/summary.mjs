// Sums the vitest JSON reports of `npm test` (Node and workerd runs) into
// one plain closing line: "tests: N passed, N failed, N skipped".
import { existsSync, readFileSync } from 'node:fs';

const files = ['test-results/vitest-node.json', 'test-results/vitest-workerd.json'];
let passed = 0;
let failed = 0;
let skipped = 0;
for (const f of files) {
  if (!existsSync(f)) {
    console.error(`missing ${f}: that test run did not report`);
    failed++;
    continue;
  }
  const r = JSON.parse(readFileSync(f, 'utf8'));
  passed += r.numPassedTests;
  failed += r.numFailedTests;
  skipped += r.numPendingTests + (r.numTodoTests ?? 0);
}
console.log(`tests: ${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(failed > 0 || passed === 0 ? 1 : 0);
