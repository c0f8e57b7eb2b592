// Prints, once a second, the CPU each kind of process used in that second,
// in % of one core (from /proc, Linux): PostgreSQL, the fencegate gateways
// (`cli.js serve`), the benchmark's upstream and load generator, the rest.
// Run it next to `node bench/http.mjs --only …` to see which process holds
// a core and which waits.
//
//   node bench/cpu-by-process.mjs > cpu.log &  node bench/http.mjs --only fg-postgres …
import { readdirSync, readFileSync } from 'node:fs';

function kindOf(comm, cmdline) {
  if (comm.startsWith('postgres')) return 'postgres';
  if (!comm.startsWith('node')) return 'other';
  if (cmdline.includes('cli.js')) return 'gateway';
  if (cmdline.includes('upstream')) return 'upstream';
  if (cmdline.includes('load')) return 'load';
  return 'node (other)';
}

/** Clock ticks (10 ms) of CPU per kind, over the processes alive now. */
function sample() {
  const ticks = {};
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      const fields = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
      const kind = kindOf(comm, readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' '));
      ticks[kind] = (ticks[kind] ?? 0) + Number(fields[11]) + Number(fields[12]);
    } catch {
      // gone meanwhile
    }
  }
  return ticks;
}

let before = sample();
setInterval(() => {
  const now = sample();
  const used = {};
  // A process that ended within the second takes its ticks with it: read the quiet seconds, not the edges.
  for (const kind of Object.keys(now)) {
    const d = now[kind] - (before[kind] ?? 0);
    if (d > 0) used[kind] = `${d}%`;
  }
  before = now;
  console.log(new Date().toISOString().slice(11, 19), JSON.stringify(used));
}, 1000);
