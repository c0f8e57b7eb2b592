#!/usr/bin/env node
// The MCP fault campaign, for humans (docs/faults.md "MCP calls under
// faults"): each way an MCP tools/call can lose its answer (client resume,
// server stream close, client timeout, route timeout, server SIGKILL,
// gateway SIGKILL, a task retried from a new session), real SDK client and
// a counting SDK server with a status tool, on a route without `reconcile`
// (before) and with it (after). It runs the CI version,
// test/faults/mcp-campaign.slow.test.ts, with more trials, and prints a line
// per path and mode and the table.
//
//   npm run build && node bench/mcp-campaign.mjs [--trials 5]
//
// Exits with the test run's status (1 when a duplicate or, with reconcile, a
// key left to an operator was seen where none is allowed).
import { spawnSync } from 'node:child_process';

const at = process.argv.indexOf('--trials');
const trials = at === -1 ? '5' : process.argv[at + 1];
if (!/^[1-9][0-9]*$/.test(trials ?? '')) {
  console.error('--trials takes a positive integer');
  process.exit(2);
}
const run = spawnSync('npx', ['vitest', 'run', 'test/faults/mcp-campaign.slow.test.ts'], {
  env: { ...process.env, MCP_CAMPAIGN_TRIALS: trials },
  encoding: 'utf8',
  maxBuffer: 64 * 1024 * 1024,
});
for (const line of `${run.stdout}`.split('\n')) {
  if (line.startsWith('[{"path"') || line.startsWith('|') || line.startsWith('MCP fault campaign')) console.log(line);
}
if (run.status !== 0)
  console.error(
    `${run.stdout}`
      .split('\n')
      .filter((l) => /FAIL|Error/.test(l))
      .join('\n'),
  );
process.exit(run.status ?? 1);
