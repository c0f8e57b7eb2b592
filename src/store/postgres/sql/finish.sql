-- fencegate_finish: DESIGN §3.7, conditional on the owner token; the affected
-- row count is the answer. p_outcome: completed | released | unknown. Frees
-- the serial slot only if this owner holds it, then notifies p_channel (if
-- given) with the topic hashes, delivered to LISTENers of every replica at
-- commit. Lock order and search_path: see admit.sql.
--
-- The current definitions (migration 0006; 0003 holds the earlier one, as
-- history). Applied by the migrator when this file's sha256 changes (see
-- ./README.md).
--
-- The clock and the rejection text are those of fencegate_admit (admit.sql):
-- a completed record's retention runs from once its row is locked (the
-- finish may wait for an admission of a retry that holds it), and the
-- late-finish row takes the bounded text.
--
-- Since 0010, p_outcome 'unknown' keeps the interim answer it is given
-- (p_status, p_headers, p_body; all NULL: none, one kept before is dropped)
-- in the record's response columns (DESIGN §3.7), and p_retention_ms, when
-- given, sets the time it is carried (expires_at) from once the row is
-- locked. A previous release's replica passes NULLs for an unknown finish:
-- no interim, as before. The record keeps its attempt_until (one written
-- before 0010 takes its lock's). Same signature.
CREATE OR REPLACE FUNCTION fencegate_finish(
  p_scope text, p_key text, p_entity text, p_owner text, p_outcome text,
  p_status integer, p_headers jsonb, p_body bytea, p_retention_ms bigint,
  p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  p_channel text, p_entity_topic text, p_record_topic text,
  p_client_request_id text, p_log_entity text, p_log_key text,
  OUT recorded boolean
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_now timestamptz;
BEGIN
  recorded := true;
  -- Entity row first (lock order, see the top of 0003).
  IF p_entity IS NOT NULL THEN
    UPDATE fence_entities e SET inflight_owner = NULL, inflight_until = NULL
      WHERE e.entity = p_entity AND e.inflight_owner = p_owner;
  END IF;

  IF p_key IS NOT NULL THEN
    -- A record only marked outcome_unknown (nobody took it over) still
    -- belongs to its owner, whose late answer completes it.
    IF p_outcome = 'completed' THEN
      -- Lock first, then read the clock: an UPDATE that waits for a row lock
      -- may have computed its new values before the wait.
      PERFORM 1 FROM idempotency_records r WHERE r.scope = p_scope AND r.key = p_key FOR UPDATE;
      v_now := clock_timestamp();
      UPDATE idempotency_records r SET state = 'completed', status = p_status, headers = p_headers, body = p_body,
          locked_until = NULL, expires_at = v_now + p_retention_ms * interval '1 millisecond'
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    ELSIF p_outcome = 'released' THEN
      DELETE FROM idempotency_records r
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    ELSIF p_outcome = 'unknown' THEN
      IF p_retention_ms IS NOT NULL THEN
        PERFORM 1 FROM idempotency_records r WHERE r.scope = p_scope AND r.key = p_key FOR UPDATE;
        v_now := clock_timestamp();
      END IF;
      UPDATE idempotency_records r SET state = 'outcome_unknown',
          attempt_until = coalesce(r.attempt_until, r.locked_until), locked_until = NULL,
          status = p_status, headers = p_headers, body = p_body,
          expires_at = CASE WHEN p_retention_ms IS NULL THEN r.expires_at ELSE v_now + p_retention_ms * interval '1 millisecond' END
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    ELSE
      RAISE EXCEPTION 'fencegate_finish: unknown outcome %', p_outcome;
    END IF;
    recorded := FOUND;
    IF NOT recorded THEN
      -- Taken over by a newer owner (onUnknown: retry) or resolved by an
      -- operator: this owner's outcome no longer decides anything.
      PERFORM fencegate_log_rejection(coalesce(v_now, clock_timestamp()), 'late-finish', p_log_entity, NULL, NULL, p_log_key,
        p_caller, p_method, p_path, p_payload_sha256, p_request_id, p_client_request_id);
    END IF;
  END IF;

  IF p_channel IS NOT NULL THEN
    IF p_entity_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_entity_topic); END IF;
    IF p_record_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_record_topic); END IF;
  END IF;
END;
$$;

-- The 0003 signature, for replicas of the release before 0006 still running
-- while the first upgraded one migrates (see the same wrapper in admit.sql).
CREATE OR REPLACE FUNCTION fencegate_finish(
  p_scope text, p_key text, p_entity text, p_owner text, p_outcome text,
  p_status integer, p_headers jsonb, p_body bytea, p_retention_ms bigint,
  p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  p_channel text, p_entity_topic text, p_record_topic text,
  OUT recorded boolean
)
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
  SELECT fencegate_finish(p_scope, p_key, p_entity, p_owner, p_outcome, p_status, p_headers, p_body, p_retention_ms,
    p_caller, p_method, p_path, p_payload_sha256, p_request_id, p_channel, p_entity_topic, p_record_topic,
    NULL::text, p_entity, p_key);
$$;
