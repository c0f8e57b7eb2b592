-- fencegate_extend_lock: keeps a live attempt's lock alive (DESIGN §3.6):
-- while a long upstream call still holds the connection, or an MCP task
-- runs. The rule is `extendLock` of src/core/admission.ts; the store
-- conformance suite holds this function to the SQLite store's answers.
--
-- The record, when it is p_owner's in_progress record with a live lock, gets
-- locked_until = greatest(locked_until, now + p_ms), and attempt_until (the
-- attempt's own lock end, DESIGN §3.12) the same; the entity's serial slot,
-- when p_owner holds it live, too, but only with the record (a keyless
-- request: the slot alone). An expired lock is never revived. `extended`
-- answers for the record (for the slot on a keyless request).
--
-- Lock order (admit.sql): the fence_entities row first, then the record. The
-- clock is read once both are held (G6). Applied by the migrator when this
-- file's sha256 changes (see ./README.md).
CREATE OR REPLACE FUNCTION fencegate_extend_lock(
  p_scope text, p_key text, p_entity text, p_owner text, p_ms bigint,
  OUT extended boolean
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_now  timestamptz;
  v_slot boolean := false;
BEGIN
  extended := false;
  IF p_entity IS NOT NULL THEN
    PERFORM 1 FROM fence_entities e WHERE e.entity = p_entity AND e.inflight_owner = p_owner FOR UPDATE;
    v_slot := FOUND;
  END IF;
  IF p_key IS NOT NULL THEN
    PERFORM 1 FROM idempotency_records r WHERE r.scope = p_scope AND r.key = p_key FOR UPDATE;
    v_now := clock_timestamp();
    UPDATE idempotency_records r
      SET locked_until = greatest(r.locked_until, v_now + p_ms * interval '1 millisecond'),
          attempt_until = greatest(r.locked_until, v_now + p_ms * interval '1 millisecond')
      WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state = 'in_progress'
        AND r.locked_until > v_now;
    extended := FOUND;
  ELSE
    v_now := clock_timestamp();
  END IF;
  IF v_slot AND (p_key IS NULL OR extended) THEN
    UPDATE fence_entities e SET inflight_until = greatest(e.inflight_until, v_now + p_ms * interval '1 millisecond')
      WHERE e.entity = p_entity AND e.inflight_owner = p_owner AND e.inflight_until > v_now;
    IF p_key IS NULL THEN
      extended := FOUND;
    END IF;
  END IF;
END;
$$;
