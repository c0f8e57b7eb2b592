#!/usr/bin/env node
// Another process on a gateway's SQLite file that takes the write lock and
// keeps it: BEGIN IMMEDIATE and a write, then nothing until told. The test
// may SIGSTOP it while it holds the lock (a paused process), or let it go.
//
//   node test/store/helpers/sqlite-locker.mjs DB_PATH MARKER_PATH [read]
//
// With `read` it holds a read transaction instead (BEGIN and a SELECT): no
// lock a writer waits for, only a snapshot the checkpointer must keep.
//
// stdout: {"msg":"locked"} once the lock is held, {"msg":"committed"} after.
// stdin, one command a line:
//   commit              write MARKER_PATH, then COMMIT (lets the lock go)
//   commit-after <ms>   the same, <ms> after the command arrived
// MARKER_PATH is written just BEFORE the COMMIT: while it does not exist,
// the lock is certainly still held.
import { writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import Database from 'better-sqlite3';

const [dbPath, marker, mode] = process.argv.slice(2);
const db = new Database(dbPath);
db.pragma('busy_timeout = 10000');
if (mode === 'read') {
  db.exec('BEGIN');
  db.prepare('SELECT count(*) FROM fence_entities').get();
} else {
  db.exec('BEGIN IMMEDIATE');
  db.prepare(
    "INSERT INTO fence_entities (entity, fence, accepted_at) VALUES ('sqlite-locker', 1, 0) ON CONFLICT (entity) DO UPDATE SET fence = fence + 1",
  ).run();
}
console.log(JSON.stringify({ msg: 'locked', pid: process.pid }));

let done = false;
const commit = () => {
  if (done) return;
  done = true;
  writeFileSync(marker, 'released');
  db.exec('COMMIT');
  console.log(JSON.stringify({ msg: 'committed' }));
};

createInterface({ input: process.stdin }).on('line', (line) => {
  const [cmd, arg] = line.trim().split(/\s+/);
  if (cmd === 'commit') commit();
  else if (cmd === 'commit-after') setTimeout(commit, Number(arg));
});
process.stdin.on('end', () => {
  commit();
  db.close();
});
