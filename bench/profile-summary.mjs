// Splits a V8 CPU profile (`node --cpu-prof`, e.g. from `bench/http.mjs
// --cpu-prof DIR` or bench/profile-http.mjs) by part of a proxied request.
//
//   node bench/profile-summary.mjs FILE.cpuprofile [--requests N] [--from MS --to MS]
//
// Each sample is charged to the part of the first frame, walking from the
// sampled function towards the root, that lies in a file of a known part:
// native functions (a better-sqlite3 statement's run, a hash's digest, a
// socket's writev) have no file and go to their JavaScript caller. Node's
// own modules (node:*) are charged to the part that called into them when
// it is fencegate's, undici's or Hono's, else to "node:http and sockets".
// With --requests N, also µs of CPU per request.
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { option as opt } from './args.mjs';

const file = process.argv[2];
const requests = Number(opt('requests', 0));
const prof = JSON.parse(readFileSync(file, 'utf8'));
const from = Number(opt('from', 0)) * 1e6;
const to = opt('to', null) === null ? Infinity : Number(opt('to')) * 1e6;

/** The part of a file, or null for a frame that says nothing by itself (native, node:*). */
function partOf(url, fn) {
  if (fn === '(garbage collector)') return 'GC';
  if (fn === '(idle)') return 'idle';
  if (fn === '(program)') return 'V8/native (program)';
  if (url === '') return null;
  if (url.includes('better-sqlite3')) return 'store';
  if (/\/(dist|src)\/store\//.test(url)) {
    if (url.includes('group-commit') || url.includes('write-lock') || url.includes('wal-sync')) return 'store: BEGIN/COMMIT (group commit)';
    if (url.includes('checkpoint')) return 'store: checkpointer';
    return 'store: statements';
  }
  if (/\/(dist|src)\/core\/(admission|admission-types)/.test(url)) return 'decision rules (core)';
  if (/\/(dist|src)\/core\/fingerprint|json-duplicates/.test(url)) return 'fingerprint/hash';
  if (/\/(dist|src)\/http\/(logger|refusal-log)/.test(url)) return 'logging';
  if (/\/(dist|src)\/http\/(metrics|store-timing)|prom-client|tdigest|bintrees/.test(url)) return 'metrics';
  if (/\/(dist|src)\/http\/tracing/.test(url)) return 'fencegate other';
  if (/\/(dist|src)\/http\/forward-undici|node_modules\/undici\//.test(url)) return 'undici forward';
  if (/node_modules\/(hono|@hono)\//.test(url)) return 'Hono';
  if (/\/(dist|src)\/entry\/node-listener|\/(dist|src)\/http\/(inbound|body)/.test(url)) return 'HTTP in/out (fencegate listener, body)';
  if (/\/(dist|src)\//.test(url)) return 'fencegate other';
  if (url.startsWith('node:')) return null;
  return 'other';
}

const byId = new Map(prof.nodes.map((n) => [n.id, n]));
const parent = new Map();
for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const cache = new Map();
/** The file each sample is charged to (the frame that decided its part), for --files. */
const fileOf = new Map();
function classify(id) {
  if (cache.has(id)) return cache.get(id);
  let cur = id;
  let result = null;
  let sawNode = false;
  while (cur !== undefined) {
    const n = byId.get(cur);
    const { url, functionName } = n.callFrame;
    const p = partOf(url, functionName);
    if (p !== null) {
      result = p;
      fileOf.set(id, `${url.replace(/^.*\/(dist|src|node_modules)\//, '$1/')} ${url.includes('node_modules') ? '' : functionName}`);
      break;
    }
    if (url.startsWith('node:')) sawNode = true;
    cur = parent.get(cur);
  }
  if (result === null) result = sawNode ? 'node:http and sockets' : 'V8/native (program)';
  cache.set(id, result);
  return result;
}

const totals = new Map();
let t = prof.startTime;
let counted = 0;
let busy = 0;
for (let i = 0; i < prof.samples.length; i++) {
  t += prof.timeDeltas[i];
  const rel = t - prof.startTime;
  if (rel < from || rel > to) continue;
  const dt = prof.timeDeltas[i + 1] ?? prof.timeDeltas[i];
  const part = classify(prof.samples[i]);
  totals.set(part, (totals.get(part) ?? 0) + dt);
  counted += dt;
  if (part !== 'idle') busy += dt;
}
const rows = [...totals].filter(([p]) => p !== 'idle').sort((a, b) => b[1] - a[1]);
console.log(
  `${basename(file)}: ${(counted / 1e6).toFixed(2)} s sampled, ${(busy / 1e6).toFixed(2)} s busy (${((100 * busy) / counted).toFixed(0)}%)${requests ? `, ${requests} requests: ${(busy / requests).toFixed(1)} µs of CPU per request` : ''}`,
);
console.log(`| part | % of busy samples |${requests ? ' µs per request |' : ''}`);
console.log(`|---|---:|${requests ? '---:|' : ''}`);
for (const [part, us] of rows) console.log(`| ${part} | ${((100 * us) / busy).toFixed(1)} |${requests ? ` ${(us / requests).toFixed(1)} |` : ''}`);
// --files N: the N files (and functions) that most samples were charged to.
const files = Number(opt('files', 0));
if (files > 0) {
  const by = new Map();
  t = prof.startTime;
  for (let i = 0; i < prof.samples.length; i++) {
    t += prof.timeDeltas[i];
    const rel = t - prof.startTime;
    if (rel < from || rel > to) continue;
    const k = fileOf.get(prof.samples[i]) ?? classify(prof.samples[i]);
    by.set(k, (by.get(k) ?? 0) + (prof.timeDeltas[i + 1] ?? prof.timeDeltas[i]));
  }
  for (const [k, us] of [...by].sort((a, b) => b[1] - a[1]).slice(0, files)) console.log(`  ${((100 * us) / busy).toFixed(1)}%  ${k}`);
}
