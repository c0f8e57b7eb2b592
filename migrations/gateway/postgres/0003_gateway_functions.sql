-- fencegate gateway decisions as server-side functions (DESIGN §3.5, §3.7). PostgreSQL.
--
-- Each decision is ONE statement (`SELECT * FROM fencegate_admit(...)`), so it
-- is one transaction and one round trip: a gateway that dies mid-call, a
-- terminated session or a server restart leaves either all of it or none of
-- it. The semantics are those of the SQLite store (src/store/sqlite), which
-- the store conformance suite (test/store/conformance.ts) checks for both.
--
-- Clock: now() only (G6). Inside a one-statement transaction now() is the
-- statement's start; a lock wait can only make it earlier than the moment the
-- rows are read, which errs on the safe side (a lock looks alive a little
-- longer, a slot looks busy a little longer).
--
-- Lock order, everywhere: the fence_entities row first, then the
-- idempotency_records row. admit takes the entity row first whenever it
-- touches it (fence raise, serial slot); finish frees the slot before it
-- touches the record; the sweeper takes records only, with SKIP LOCKED. So
-- a finish and a retry of the same request can never deadlock.
--
-- Functions carry `SET search_path FROM CURRENT`: they always work on the
-- tables of the schema they were created in, whatever the caller's path.
--
-- Text parameters arrive already escaped by the store (NUL cannot live in
-- PostgreSQL text; see src/store/postgres/gateway-store.ts).

CREATE OR REPLACE FUNCTION fencegate_log_rejection(
  p_at timestamptz, p_reason text, p_entity text, p_presented bigint, p_current bigint,
  p_key text, p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text
) RETURNS void
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
  INSERT INTO rejections
    (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id)
  VALUES (p_at, p_reason, p_entity, p_presented, p_current, p_key, p_caller, p_method, p_path, p_payload_sha256, p_request_id);
$$;

-- Milliseconds from b to a, rounded up, so that a positive wait never reads 0.
CREATE OR REPLACE FUNCTION fencegate_ms_between(a timestamptz, b timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$ SELECT ceil(extract(epoch FROM (a - b)) * 1000)::bigint $$;

-- DESIGN §3.5 a–h. Parameters: the AdmitInput fields, audit fields flattened.
-- Returns one row: outcome, and the fields that outcome needs.
CREATE OR REPLACE FUNCTION fencegate_admit(
  p_scope text, p_key text, p_entity text, p_fence bigint, p_fingerprint text,
  p_serial boolean, p_owner text, p_lock_ms bigint, p_retention_ms bigint, p_retry_unknown boolean,
  p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  OUT outcome text, OUT current_fence bigint, OUT retry_after_ms bigint, OUT takeover boolean,
  OUT status integer, OUT headers jsonb, OUT body bytea
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_now   timestamptz := now();
  v_until timestamptz := now() + p_lock_ms * interval '1 millisecond';
  v_rec   idempotency_records%ROWTYPE;
  v_found boolean;
  v_from  text;          -- owner token of an outcome_unknown record we take over
  v_slot  timestamptz;
  v_pass  integer := 0;
  v_created boolean := false; -- this call created the entity row (serial, no fence)
BEGIN
  takeover := false;

  -- a. The fence check comes first, always: a stale fence is refused even
  --    when its key has a stored response. ON CONFLICT DO UPDATE locks the
  --    entity row even when its WHERE refuses the raise, so the current fence
  --    read below is the one that refused us.
  IF p_entity IS NOT NULL AND p_fence IS NOT NULL THEN
    INSERT INTO fence_entities AS e (entity, fence, accepted_at) VALUES (p_entity, p_fence, v_now)
    ON CONFLICT (entity) DO UPDATE SET fence = excluded.fence, accepted_at = excluded.accepted_at
      WHERE e.fence IS NULL OR excluded.fence >= e.fence;
    IF NOT FOUND THEN
      SELECT e.fence INTO current_fence FROM fence_entities e WHERE e.entity = p_entity;
      PERFORM fencegate_log_rejection(v_now, 'stale-fence', p_entity, p_fence, current_fence, p_key,
        p_caller, p_method, p_path, p_payload_sha256, p_request_id);
      outcome := 'stale-fence';
      RETURN;
    END IF;
  ELSIF p_entity IS NOT NULL AND p_serial THEN
    -- Serial mode without a fence still needs the entity row for its slot;
    -- lock it now to keep the entity-before-record lock order. A row created
    -- here is removed again below unless the request is forwarded or busy,
    -- so that a refusal leaves no trace (as in the SQLite store, which only
    -- creates it at step h).
    INSERT INTO fence_entities (entity, fence, accepted_at) VALUES (p_entity, NULL, v_now)
    ON CONFLICT (entity) DO NOTHING;
    v_created := FOUND;
    IF NOT v_created THEN
      PERFORM 1 FROM fence_entities e WHERE e.entity = p_entity FOR UPDATE;
    END IF;
  END IF;

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
      IF v_found AND v_rec.state = 'completed' AND v_rec.expires_at <= v_now THEN
        -- Past retention: forgotten, as if the sweeper had already run.
        DELETE FROM idempotency_records r WHERE r.scope = p_scope AND r.key = p_key;
        v_found := false;
      END IF;
      IF v_found THEN
        IF v_rec.fingerprint <> p_fingerprint THEN
          -- d.
          PERFORM fencegate_log_rejection(v_now, 'idempotency-key-reused', p_entity, p_fence, NULL, p_key,
            p_caller, p_method, p_path, p_payload_sha256, p_request_id);
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
          UPDATE idempotency_records r SET state = 'outcome_unknown', locked_until = NULL
            WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = v_rec.owner_token AND r.state = 'in_progress';
        END IF;
        -- g. Never re-sent blindly unless the route says the upstream is idempotent.
        IF NOT p_retry_unknown THEN
          PERFORM fencegate_log_rejection(v_now, 'outcome-unknown', p_entity, p_fence, NULL, p_key,
            p_caller, p_method, p_path, p_payload_sha256, p_request_id);
          outcome := 'outcome-unknown';
          EXIT decide;
        END IF;
        v_from := v_rec.owner_token;
      END IF;
    END IF;

    -- h. Serial mode: take the entity's one in-flight slot (or the expired
    --    slot of a dead gateway). Taken before the record is written, so a
    --    busy answer leaves no record behind.
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
      UPDATE idempotency_records r SET owner_token = p_owner, state = 'in_progress', locked_until = v_until,
          entity = p_entity, fence = p_fence
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = v_from AND r.state = 'outcome_unknown';
      takeover := true;
      EXIT decide;
    ELSE
      -- b.
      INSERT INTO idempotency_records
        (scope, key, fingerprint, entity, fence, state, owner_token, locked_until, created_at, expires_at)
      VALUES (p_scope, p_key, p_fingerprint, p_entity, p_fence, 'in_progress', p_owner, v_until, v_now,
        v_now + p_retention_ms * interval '1 millisecond')
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
  ELSIF v_created THEN
    DELETE FROM fence_entities e WHERE e.entity = p_entity;
  END IF;
END;
$$;

-- DESIGN §3.7, conditional on the owner token; the affected row count is the
-- answer. p_outcome: completed | released | unknown. Frees the serial slot
-- only if this owner holds it, then notifies p_channel (if given) with the
-- topic hashes, delivered to LISTENers of every replica at commit.
CREATE OR REPLACE FUNCTION fencegate_finish(
  p_scope text, p_key text, p_entity text, p_owner text, p_outcome text,
  p_status integer, p_headers jsonb, p_body bytea, p_retention_ms bigint,
  p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  p_channel text, p_entity_topic text, p_record_topic text,
  OUT recorded boolean
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_now timestamptz := now();
BEGIN
  recorded := true;
  -- Entity row first (lock order, see the top of this file).
  IF p_entity IS NOT NULL THEN
    UPDATE fence_entities e SET inflight_owner = NULL, inflight_until = NULL
      WHERE e.entity = p_entity AND e.inflight_owner = p_owner;
  END IF;

  IF p_key IS NOT NULL THEN
    -- A record only marked outcome_unknown (nobody took it over) still
    -- belongs to its owner, whose late answer completes it.
    IF p_outcome = 'completed' THEN
      UPDATE idempotency_records r SET state = 'completed', status = p_status, headers = p_headers, body = p_body,
          locked_until = NULL, expires_at = v_now + p_retention_ms * interval '1 millisecond'
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    ELSIF p_outcome = 'released' THEN
      DELETE FROM idempotency_records r
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    ELSIF p_outcome = 'unknown' THEN
      UPDATE idempotency_records r SET state = 'outcome_unknown', locked_until = NULL
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    ELSE
      RAISE EXCEPTION 'fencegate_finish: unknown outcome %', p_outcome;
    END IF;
    recorded := FOUND;
    IF NOT recorded THEN
      -- Taken over by a newer owner (onUnknown: retry) or resolved by an
      -- operator: this owner's outcome no longer decides anything.
      PERFORM fencegate_log_rejection(v_now, 'late-finish', p_entity, NULL, NULL, p_key,
        p_caller, p_method, p_path, p_payload_sha256, p_request_id);
    END IF;
  END IF;

  IF p_channel IS NOT NULL THEN
    IF p_entity_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_entity_topic); END IF;
    IF p_record_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_record_topic); END IF;
  END IF;
END;
$$;
