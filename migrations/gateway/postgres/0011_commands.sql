-- fencegate gateway, PostgreSQL: the command log (DESIGN §4.1 `commands`),
-- one row per outcome of a request the gateway decided on: an admitted
-- request's finish (written by the finish's own statement, so in its
-- transaction: src/store/postgres/commands.ts), and the transient refusals
-- that have no finish (entity-busy, idempotency-in-progress,
-- payload-too-large). Ids, hashes and bounded text, never bodies, tokens or
-- query strings. Swept by `commandRetention` (DESIGN §4.4). Tables and
-- indexes only (DESIGN §4.5): no function changes.
CREATE TABLE IF NOT EXISTS commands (
  id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at                 timestamptz NOT NULL,
  route              text,
  method             text,
  path               text,
  entity             text,
  fence              bigint,
  idempotency_key    text,
  scope              text,
  caller             text,
  tool               text,
  outcome            text        NOT NULL,
  decision           text,
  status             integer,
  upstream_ms        double precision,
  request_id         text,
  client_request_id  text,
  payload_sha256     text
);

-- The sweeper (by age), an entity's story and a key's attempts (newest first).
CREATE INDEX IF NOT EXISTS commands_at ON commands (at);
CREATE INDEX IF NOT EXISTS commands_entity ON commands (entity, id);
CREATE INDEX IF NOT EXISTS commands_key ON commands (idempotency_key, id);
