-- fencegate/d1: the per-request scratch row of the D1 admission batch.
-- D1 has no interactive transactions, only batch(): a list of statements run
-- as one transaction, with no way to branch in JavaScript between them. The
-- admission (DESIGN §3.5 a-h) therefore carries its intermediate state in one
-- row of this table, keyed by a fresh id per batch: every conditional
-- statement reads it (is a decision taken yet? which record state was seen?)
-- and writes it, the last SELECT returns the decision, and the batch deletes
-- the row. A batch that fails rolls back as a whole, so no row outlives its
-- batch and the table is always empty between transactions.
-- Harmless on the embedded SQLite store, which never writes to it.

CREATE TABLE IF NOT EXISTS admission_scratch (
  id               TEXT    PRIMARY KEY NOT NULL,
  -- The database clock, read once per batch (G6): every expiry test of the
  -- batch compares against this one value, as the SQLite store does.
  now              INTEGER NOT NULL,
  -- NULL while the admission goes on; then 'stale-fence', 'replay',
  -- 'idempotency-key-reused', 'idempotency-in-progress', 'outcome-unknown'
  -- or 'entity-busy'. Still NULL at the end means forward.
  decision         TEXT,
  current_fence    INTEGER,
  -- The idempotency record as it was seen, after the expired-completed delete.
  rec_state        TEXT,
  rec_fingerprint  TEXT,
  rec_owner        TEXT,
  rec_locked_until INTEGER,
  -- 1: the record was in_progress with an expired lock (its gateway died).
  mark_unknown     INTEGER NOT NULL DEFAULT 0,
  -- onUnknown: retry takes over the record held by this owner token.
  takeover_from    TEXT,
  -- Retry-After source: the record lock or the serial slot that blocks us.
  busy_until       INTEGER
) STRICT;
