/**
 * A claimer in its own process. argv: <store descriptor JSON> <workerId>.
 * Commands on stdin: `claim [max]` (claim until nothing is left, or until it
 * holds `max`; reply with what it got), `extend <round>` (try to extend every
 * lease of that round), `exit`.
 */
import { createInterface } from 'node:readline';
import { openJobStore } from '../../../src/lease/open.js';
import type { Lease } from '../../../src/lease/types.js';

const [descriptor, workerId] = process.argv.slice(2) as [string, string];
const store = await openJobStore(JSON.parse(descriptor), { migrate: false, leaseMs: 120_000 });
const rounds: Lease[][] = [];
const reply = (message: unknown) => process.stdout.write(`${JSON.stringify(message)}\n`);

reply({ type: 'ready' });
for await (const line of createInterface({ input: process.stdin })) {
  const [command, arg] = line.split(' ');
  if (command === 'claim') {
    const got: Lease[] = [];
    const max = arg === undefined ? Infinity : Number(arg);
    let busy = 0;
    while (got.length < max) {
      let lease: Lease | null;
      try {
        ({ lease } = await store.claim({ workerId }));
      } catch (err) {
        // SQLITE_BUSY past the busy timeout is a fault, not an answer: like
        // runWorker, try again (nothing was claimed: the transaction never began).
        if ((err as { code?: string }).code !== 'SQLITE_BUSY') throw err;
        busy++;
        continue;
      }
      if (!lease) break;
      got.push(lease);
    }
    rounds.push(got);
    reply({ type: 'claimed', busy, claims: got.map((l) => ({ id: l.id, token: l.fencingToken, previousOwnerId: l.previousOwnerId })) });
  } else if (command === 'extend') {
    const results = await Promise.all((rounds[Number(arg)] ?? []).map((l) => store.extend(l)));
    reply({ type: 'extended', ok: results.filter((r) => r.ok).length, lost: results.filter((r) => !r.ok).length });
  } else if (command === 'exit') {
    break;
  }
}
await store.close();
process.exit(0);
