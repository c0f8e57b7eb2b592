#!/usr/bin/env node
// Sustained writes on a SQLite gateway store with the background
// checkpointer checkpointing often, until killed (test/store/checkpoint.slow.test.ts).
//
//   node test/store/helpers/checkpoint-writer.mjs DB_PATH [INTERVAL_MS RESTART_FRAMES]
//
// (default 2 ms and 100 frames: a checkpoint is nearly always running.)
// stdout: {"acked":[keys…]} for admissions whose answers were given (so
// durable), at most one line per event-loop turn; {"ckpt":"PASSIVE"|"RESTART",
// "copied":n} for each checkpoint that copied frames; {"pause":true} when the
// worker asks the writer to hold (a RESTART checkpoint follows at once).
import { SqliteGatewayStore } from '../../../dist/store/sqlite/index.js';

const [path, intervalMs = '2', restartFrames = '100'] = process.argv.slice(2);
const say = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const store = new SqliteGatewayStore({
  path,
  backgroundCheckpoint: {
    intervalMs: Number(intervalMs),
    restartFrames: Number(restartFrames),
    onMessage: (m) => {
      if (m.type === 'ran' && m.checkpointed > 0) say({ ckpt: m.mode, copied: m.checkpointed });
      if (m.type === 'pause') say({ pause: true });
    },
  },
});
let acked = [];
let flushing = false;
let n = 0;
const audit = { requestId: 'r', clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: '0' };
async function writer() {
  for (;;) {
    const key = `k-${++n}`;
    await store.admit({
      scope: 'r',
      key,
      entity: `e-${n}`,
      fence: 1n,
      fingerprint: 'f',
      mode: 'serial',
      ownerToken: `o-${n}`,
      lockMs: 60_000,
      retentionMs: 600_000,
      onUnknown: 'reject',
      audit,
    });
    acked.push(key);
    if (!flushing) {
      flushing = true;
      setImmediate(() => {
        flushing = false;
        say({ acked });
        acked = [];
      });
    }
  }
}
say({ ready: true });
for (let i = 0; i < 20; i++) writer();
