-- fencegate_admit: the admission decision, DESIGN §3.5 a–h, in one statement
-- (`SELECT * FROM fencegate_admit(...)`), so it is one transaction and one
-- round trip: a gateway that dies mid-call, a terminated session or a server
-- restart leaves either all of it or none of it. The store conformance suite
-- (test/store/conformance.ts) holds it to the same answers as the SQLite store.
--
-- Lock order, everywhere: the fence_entities row first, then the
-- idempotency_records row. admit takes the entity row first whenever it
-- touches it (fence raise, serial slot); finish frees the slot before it
-- touches the record; the sweeper takes records only, with SKIP LOCKED. So
-- a finish and a retry of the same request can never deadlock.
--
-- Functions carry `SET search_path FROM CURRENT`: they always work on the
-- tables of the schema they were created in, whatever the caller's path.
-- Text parameters arrive already escaped by the store (NUL cannot live in
-- PostgreSQL text; see src/store/postgres/text.ts).
--
-- The current definitions (0003, 0005, 0006 and 0009 hold earlier ones, as
-- history). Applied by the migrator when this file's sha256 changes (see
-- ./README.md).
--
-- Since 0010 a record keeps its attempt's lock end (attempt_until, with
-- every lock written) and request id (request_id, p_request_id), and an
-- outcome-unknown answer carries the interim answer an outcome_unknown
-- record keeps (status, headers, body: DESIGN §3.7) while its expires_at is
-- ahead; a takeover drops it. A record marked outcome_unknown keeps its
-- attempt_until (one written before 0010 takes its lock's). Same signature.
--
-- 0009 added p_tool, the MCP tool of a tools/call (NULL for a plain route),
-- kept in the rejection row. It has a DEFAULT, so a replica of the previous
-- release still calling with 18 arguments gets this function (tool NULL)
-- during a rolling upgrade; the 18-parameter definition is dropped, or the
-- 18-argument call would be ambiguous.
--
-- Two points that 0006 changed from the earlier definitions:
--
-- Clock. now() is the transaction's start: an admission that first waits for
-- a row lock (another admission or finish of the entity or the key holds it)
-- computed its record lock and serial slot from before the wait, so they
-- were already partly spent when it committed: after a 2 s wait for a 1.5 s
-- lock, already expired, and a second request for the entity was admitted
-- while the first was upstream (G3), a retry of the key got outcome-unknown.
-- Here v_now is clock_timestamp() read again right after each statement that
-- may wait for a row lock (the fence upsert, the entity lock, the record
-- lock), so every expiry written (locked_until, inflight_until, expires_at,
-- created_at, accepted_at) and every expiry compared (a completed record past
-- retention, a live record lock, a live slot) is measured from the moment
-- the rows are held. The one statement left that can wait after the last
-- read is the record insert of a key no one held a moment before, which waits
-- only for a concurrent insert of the same key whose transaction then rolls
-- back (a fault); that insert's values are a wait older than its commit.
-- G6 holds: it is still the database's clock.
--
-- Rejection text. p_log_entity and p_log_key are the entity and the key as
-- the rejection row keeps them (bounded by the store, like p_caller, p_method,
-- p_path, p_request_id, p_client_request_id and p_tool); the decision uses
-- the whole p_entity and p_key.
DROP FUNCTION IF EXISTS fencegate_admit(text, text, text, bigint, text, boolean, text, bigint, bigint, boolean,
  text, text, text, text, text, text, text, text);
CREATE OR REPLACE FUNCTION fencegate_admit(
  p_scope text, p_key text, p_entity text, p_fence bigint, p_fingerprint text,
  p_serial boolean, p_owner text, p_lock_ms bigint, p_retention_ms bigint, p_retry_unknown boolean,
  p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  p_client_request_id text, p_log_entity text, p_log_key text, p_tool text DEFAULT NULL,
  OUT outcome text, OUT current_fence bigint, OUT retry_after_ms bigint, OUT takeover boolean,
  OUT status integer, OUT headers jsonb, OUT body bytea
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_lock  interval := p_lock_ms * interval '1 millisecond';
  -- The moment the rows are held: re-read after every statement that may wait for a lock.
  v_now   timestamptz := clock_timestamp();
  v_until timestamptz := v_now + v_lock;
  v_rec   idempotency_records%ROWTYPE;
  v_found boolean;
  v_from  text;          -- owner token of an outcome_unknown record we take over
  v_slot  timestamptz;
  v_pass  integer := 0;
  v_created boolean := false; -- this call created the entity row (serial, no fence)
  v_equal boolean := false;   -- the fence presented is the entity's (step a wrote nothing)
BEGIN
  takeover := false;

  -- a. The fence check comes first, always: a stale fence is refused even
  --    when its key has a stored response. ON CONFLICT DO UPDATE locks the
  --    entity row even when its WHERE refuses the raise, so the current fence
  --    read below is the one that refused us. The SET is evaluated once the
  --    row is locked, so its clock_timestamp() is after any wait for it.
  --    Only a raise writes here: an equal fence is accepted again (its
  --    accepted_at moved) only when the request is forwarded, at the end;
  --    a refused one leaves accepted_at where it was (src/core/admission.ts).
  IF p_entity IS NOT NULL AND p_fence IS NOT NULL THEN
    INSERT INTO fence_entities AS e (entity, fence, accepted_at) VALUES (p_entity, p_fence, clock_timestamp())
    ON CONFLICT (entity) DO UPDATE SET fence = excluded.fence, accepted_at = clock_timestamp()
      WHERE e.fence IS NULL OR excluded.fence > e.fence;
    v_found := FOUND;
    v_now := clock_timestamp();
    IF NOT v_found THEN
      SELECT e.fence INTO current_fence FROM fence_entities e WHERE e.entity = p_entity;
      IF current_fence = p_fence THEN
        v_equal := true;
        current_fence := NULL;
      ELSE
        PERFORM fencegate_log_rejection(v_now, 'stale-fence', p_log_entity, p_fence, current_fence, p_log_key,
          p_caller, p_method, p_path, p_payload_sha256, p_request_id, p_client_request_id, p_tool);
        outcome := 'stale-fence';
        RETURN;
      END IF;
    END IF;
    -- The entity's fence history (0004): one row per accepted fence value,
    -- a no-op when it stayed equal. Same transaction as the raise.
    INSERT INTO fence_history (entity, fence, at, caller, request_id)
    VALUES (p_entity, p_fence, v_now, p_caller, p_request_id)
    ON CONFLICT (entity, fence) DO NOTHING;
  ELSIF p_entity IS NOT NULL AND p_serial THEN
    -- Serial mode without a fence still needs the entity row for its slot;
    -- lock it now to keep the entity-before-record lock order. A row created
    -- here is removed again below unless the request is forwarded or busy,
    -- so that a refusal leaves no trace (as in the SQLite store, which only
    -- creates it at step h).
    INSERT INTO fence_entities (entity, fence, accepted_at) VALUES (p_entity, NULL, clock_timestamp())
    ON CONFLICT (entity) DO NOTHING;
    v_created := FOUND;
    IF NOT v_created THEN
      PERFORM 1 FROM fence_entities e WHERE e.entity = p_entity FOR UPDATE;
    END IF;
    v_now := clock_timestamp();
  END IF;
  v_until := v_now + v_lock;

  <<decide>>
  LOOP
    v_pass := v_pass + 1;
    IF v_pass > 10 THEN
      RAISE EXCEPTION 'fencegate_admit: the record for this key kept changing under us';
    END IF;

    -- b–g. The idempotency record, locked until commit.
    v_from := NULL;
    IF p_key IS NOT NULL THEN
      SELECT * INTO v_rec FROM idempotency_records r WHERE r.scope = p_scope AND r.key = p_key FOR UPDATE;
      v_found := FOUND;
      v_now := clock_timestamp();
      v_until := v_now + v_lock;
      IF v_found AND v_rec.state = 'completed' AND v_rec.expires_at <= v_now THEN
        -- Past retention: forgotten, as if the sweeper had already run.
        DELETE FROM idempotency_records r WHERE r.scope = p_scope AND r.key = p_key;
        v_found := false;
      END IF;
      IF v_found THEN
        IF v_rec.fingerprint <> p_fingerprint THEN
          -- d.
          PERFORM fencegate_log_rejection(v_now, 'idempotency-key-reused', p_log_entity, p_fence, NULL, p_log_key,
            p_caller, p_method, p_path, p_payload_sha256, p_request_id, p_client_request_id, p_tool);
          outcome := 'idempotency-key-reused';
          EXIT decide;
        END IF;
        IF v_rec.state = 'completed' THEN
          -- c.
          outcome := 'replay';
          status := v_rec.status;
          headers := v_rec.headers;
          body := v_rec.body;
          EXIT decide;
        END IF;
        IF v_rec.state = 'in_progress' THEN
          IF v_rec.locked_until IS NOT NULL AND v_rec.locked_until > v_now THEN
            -- e.
            outcome := 'idempotency-in-progress';
            retry_after_ms := fencegate_ms_between(v_rec.locked_until, v_now);
            EXIT decide;
          END IF;
          -- f. The gateway that held the lock died mid-request: the request
          --    may have reached the upstream.
          --    Its lock end stays the attempt's (a record written before 0010: from the lock).
          UPDATE idempotency_records r SET state = 'outcome_unknown',
              attempt_until = coalesce(r.attempt_until, r.locked_until), locked_until = NULL
            WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = v_rec.owner_token AND r.state = 'in_progress';
        END IF;
        -- g. Never re-sent blindly unless the route says the upstream is idempotent.
        IF NOT p_retry_unknown THEN
          PERFORM fencegate_log_rejection(v_now, 'outcome-unknown', p_log_entity, p_fence, NULL, p_log_key,
            p_caller, p_method, p_path, p_payload_sha256, p_request_id, p_client_request_id, p_tool);
          outcome := 'outcome-unknown';
          -- The interim answer the record keeps, while its time lasts (DESIGN §3.7).
          IF v_rec.state = 'outcome_unknown' AND v_rec.status IS NOT NULL AND v_rec.expires_at > v_now THEN
            status := v_rec.status;
            headers := v_rec.headers;
            body := v_rec.body;
          END IF;
          EXIT decide;
        END IF;
        v_from := v_rec.owner_token;
      END IF;
    END IF;

    -- h. Serial mode: take the entity's one in-flight slot (or the expired
    --    slot of a dead gateway). Taken before the record is written, so a
    --    busy answer leaves no record behind. The entity row is ours since
    --    step a, so this waits for nothing and v_until is current.
    IF p_serial AND p_entity IS NOT NULL THEN
      UPDATE fence_entities e SET inflight_owner = p_owner, inflight_until = v_until
        WHERE e.entity = p_entity AND (e.inflight_owner IS NULL OR e.inflight_until <= v_now);
      IF NOT FOUND THEN
        SELECT e.inflight_until INTO v_slot FROM fence_entities e WHERE e.entity = p_entity;
        outcome := 'entity-busy';
        retry_after_ms := greatest(0, fencegate_ms_between(coalesce(v_slot, v_now), v_now));
        RETURN;
      END IF;
    END IF;

    IF p_key IS NULL THEN
      EXIT decide;
    ELSIF v_from IS NOT NULL THEN
      -- g. with onUnknown: retry. We hold the row lock, so this always matches.
      --    A new attempt: its lock end and request id; the one before's interim answer is dropped.
      UPDATE idempotency_records r SET owner_token = p_owner, state = 'in_progress', locked_until = v_until,
          attempt_until = v_until, request_id = p_request_id, status = NULL, headers = NULL, body = NULL,
          entity = p_entity, fence = p_fence
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = v_from AND r.state = 'outcome_unknown';
      takeover := true;
      EXIT decide;
    ELSE
      -- b.
      INSERT INTO idempotency_records
        (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, created_at, expires_at, attempt_until, request_id)
      VALUES (p_scope, p_key, p_fingerprint, p_entity, p_fence, 'in_progress', p_owner, v_until, v_now,
        v_now + p_retention_ms * interval '1 millisecond', v_until, p_request_id)
      ON CONFLICT (scope, key) DO NOTHING;
      EXIT decide WHEN FOUND;
      -- A concurrent admission of the same key committed first (it was not
      -- serialised with us by an entity row: concurrent mode, or another
      -- entity). Give the slot back and decide again against its record.
      IF p_serial AND p_entity IS NOT NULL THEN
        UPDATE fence_entities e SET inflight_owner = NULL, inflight_until = NULL
          WHERE e.entity = p_entity AND e.inflight_owner = p_owner;
      END IF;
    END IF;
  END LOOP;

  IF outcome IS NULL THEN
    outcome := 'forward';
    IF v_equal THEN
      UPDATE fence_entities e SET accepted_at = v_now WHERE e.entity = p_entity;
    END IF;
  ELSIF v_created THEN
    DELETE FROM fence_entities e WHERE e.entity = p_entity;
  END IF;
END;
$$;

-- The signature of 0003 and 0005, for replicas of a release before 0006 still
-- running while the first upgraded one migrates: they now call the functions
-- above (and so get the clock fix), logging their whole entity and key and no
-- client request id or tool, as they did.
CREATE OR REPLACE FUNCTION fencegate_admit(
  p_scope text, p_key text, p_entity text, p_fence bigint, p_fingerprint text,
  p_serial boolean, p_owner text, p_lock_ms bigint, p_retention_ms bigint, p_retry_unknown boolean,
  p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  OUT outcome text, OUT current_fence bigint, OUT retry_after_ms bigint, OUT takeover boolean,
  OUT status integer, OUT headers jsonb, OUT body bytea
)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
  SELECT * FROM fencegate_admit(p_scope, p_key, p_entity, p_fence, p_fingerprint, p_serial, p_owner, p_lock_ms,
    p_retention_ms, p_retry_unknown, p_caller, p_method, p_path, p_payload_sha256, p_request_id,
    NULL::text, p_entity, p_key);
$$;
