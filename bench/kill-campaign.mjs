#!/usr/bin/env node
// The kill campaign, for humans (docs/faults.md): the gateway SIGKILLed at
// three moments of a charge's life (w1 admitted, not yet at the upstream;
// w2 performed by the upstream, not yet answered; w3 answered, the finish
// not yet written), restarted, the same key retried; one reconcile interval
// later it counts duplicate executions and keys still needing an operator.
// Each store runs the route without `reconcile` (before) and with it (after,
// and after with a status endpoint that lags 2 s). The CI version is
// test/faults/kill-campaign.slow.test.ts; both run test/faults/kill-campaign.ts.
//
//   npm run build && node bench/kill-campaign.mjs [--trials 10] [--postgres URL | --sqlite-only]
//       [--variants before,after,after-lag] [--windows w1,w2,w3] [--control] [--replicas 2]
//
// --postgres URL (or FENCEGATE_TEST_POSTGRES_URL) adds PostgreSQL (a fresh
// schema, dropped after). --control adds the negative control (settle time 0,
// a status endpoint lagging 30 s): it must REPORT duplicates; so must
// `--variants lies` (a status endpoint that answers 404 for every key). --replicas 2
// runs two gateway processes on the one store: the caller fails over to the
// other one at once, the killed one is restarted meanwhile. Prints a line
// per trial and a table; exits 1 when a non-control variant had a duplicate,
// a reconcile variant left a key to an operator, or the harness failed.
import '../test/lease/helpers/ts-register.mjs';
// The test helpers' "PostgreSQL suites are skipped" notice is not for this program.
process.env.FENCEGATE_PG_SKIP_NOTICE = '1';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    trials: { type: 'string', default: '10' },
    postgres: { type: 'string' },
    'sqlite-only': { type: 'boolean', default: false },
    'postgres-only': { type: 'boolean', default: false },
    variants: { type: 'string', default: 'before,after,after-lag' },
    windows: { type: 'string', default: 'w1,w2,w3' },
    control: { type: 'boolean', default: false },
    replicas: { type: 'string', default: '1' },
    quiet: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (values.help) {
  console.log(
    'usage: node bench/kill-campaign.mjs [--trials N] [--postgres URL | --sqlite-only | --postgres-only] [--variants before,after,after-lag,control,lies] [--windows w1,w2,w3] [--control] [--replicas N] [--quiet]',
  );
  process.exit(0);
}
const trials = Number(values.trials);
if (!Number.isSafeInteger(trials) || trials < 1) throw new Error('--trials must be a positive integer');
const replicas = Number(values.replicas);
if (replicas !== 1 && replicas !== 2) throw new Error('--replicas is 1 or 2');
const postgresUrl = values['sqlite-only'] ? undefined : (values.postgres ?? process.env.FENCEGATE_TEST_POSTGRES_URL);
if (values['postgres-only'] && !postgresUrl) throw new Error('--postgres-only needs --postgres URL or FENCEGATE_TEST_POSTGRES_URL');

const { runKillCampaign, formatReport, VARIANTS, WINDOWS } = await import('../test/faults/kill-campaign.ts');
const byName = Object.fromEntries(Object.values(VARIANTS).map((v) => [v.name, v]));
const variants = values.variants.split(',').map((n) => {
  if (!byName[n]) throw new Error(`unknown variant ${n} (before, after, after-lag, control, lies)`);
  return byName[n];
});
if (values.control && !variants.includes(VARIANTS.control)) variants.push(VARIANTS.control);
const windows = values.windows.split(',').map((w) => {
  if (!WINDOWS.includes(w)) throw new Error(`unknown window ${w} (w1, w2, w3)`);
  return w;
});
const backends = [...(values['postgres-only'] ? [] : ['sqlite']), ...(postgresUrl ? ['postgres'] : [])];

const stamp = () => new Date().toISOString().slice(11, 19);
const reports = [];
for (const backend of backends) {
  for (const variant of variants) {
    const report = await runKillCampaign({
      backend,
      postgresUrl,
      variant,
      trials,
      windows,
      replicas,
      log: values.quiet ? undefined : (line) => console.log(`[${stamp()}] ${line}`),
    });
    console.log(formatReport(report));
    for (const e of report.harnessErrors) console.log(`HARNESS ERROR ${e}`);
    reports.push(report);
  }
}

// The table of docs/faults.md.
const secs = (ms) => (ms === null ? '–' : `${(ms / 1000).toFixed(1)} s`);
console.log(
  '\n| store | route | window | trials | duplicates | keys needing an operator | settled by the retry | kill to answer, median / max | restart, median |',
);
console.log('|---|---|---|---:|---:|---:|---:|---|---|');
for (const r of reports) {
  for (const [w, s] of Object.entries(r.windows)) {
    const settle = s.settleMedianMs === null ? '–' : `${secs(s.settleMedianMs)} / ${secs(s.settleMaxMs)}`;
    console.log(
      `| ${r.backend === 'sqlite' ? 'SQLite' : 'PostgreSQL'}${r.replicas > 1 ? ` ×${r.replicas}` : ''} | ${r.variant} | ${w} | ${s.trials} | ${s.duplicates} | ${s.needsOperator} | ${s.settled} | ${settle} | ${secs(s.restartMedianMs)} |`,
    );
  }
}
// The controls (control, lies) must show duplicates; every other route none.
const isControl = (r) => r.variant === 'control' || r.variant === 'lies';
const failed = reports.filter(
  (r) => r.harnessErrors.length > 0 || (!isControl(r) && r.total.duplicates > 0) || (r.variant.startsWith('after') && r.total.needsOperator > 0),
);
const controlCaught = reports.filter(isControl).every((r) => r.total.duplicates > 0);
if (!controlCaught) console.log('\nTHE CONTROL SHOWED NO DUPLICATE: the campaign could not see one');
process.exit(failed.length > 0 || !controlCaught ? 1 : 0);
