/**
 * A worker process for the SIGKILL test. argv: <store descriptor JSON>
 * <workerId> <kind>. Runs `runWorker`; its handler reports the claim and then
 * never finishes, so only heartbeats keep its lease alive.
 */
import { openJobStore } from '../../../src/lease/open.js';
import { runWorker } from '../../../src/lease/runner/run-worker.js';

const [descriptor, workerId, kind] = process.argv.slice(2) as [string, string, string];
const store = await openJobStore(JSON.parse(descriptor), { migrate: false });
const reply = (message: unknown) => process.stdout.write(`${JSON.stringify(message)}\n`);

const worker = await runWorker({
  store,
  workerId,
  // Longer than a stalled fsync, so that only the kill ends the lease; the
  // test then waits this long for it.
  leaseMs: 5_000,
  heartbeatMs: 300,
  maxMissedHeartbeats: 3,
  jitterMs: 50,
  pollIntervalMs: 50,
  handlers: {
    [kind]: ({ job }) => {
      reply({ type: 'started', id: job.id, token: job.fencingToken });
      return new Promise(() => {}); // hangs until the process is killed
    },
  },
});
worker.events.on('heartbeat_ok', (e) => reply({ type: 'heartbeat_ok', id: e.jobId, token: e.fencingToken }));
reply({ type: 'ready' });
