-- fencegate_release_unsent: undoes what an admission may have committed when
-- its caller never learnt the answer (DESIGN §8.2, "An admission whose answer
-- was lost"). The gateway answered that caller 503 store-unavailable and sent
-- nothing upstream, so a record or a serial slot held under the request's
-- owner token stands for a request that was never made. The owner token is
-- the request's own (a fresh random one per request), so nothing else can
-- match: a record another owner holds or took over, or none at all (the
-- admission rolled back), is left as it is, and nothing is logged.
--
-- The rule is `releaseUnsent` of src/core/admission.ts, written once there;
-- the admission conformance property (test/store/admission-conformance.ts)
-- compares this function with it, and with the SQLite store, on random
-- sequences of admissions, finishes and releases.
--
-- The slot is freed. The record is deleted (in_progress, or outcome_unknown
-- once its lock ran out and another request marked it), as a release after
-- the upstream refused the connection does; except on a route that re-sends
-- outcome_unknown records (p_retry_unknown, onUnknown: retry), where the
-- admission may have been a takeover of an earlier attempt whose outcome is
-- unknown. A record this admission created has its lock end exactly
-- p_lock_ms after its creation (admit.sql writes both from one clock
-- reading); a takeover keeps the earlier attempt's created_at, older than its
-- expired lock. So there a fresh in_progress record is deleted, a taken-over
-- one goes back to outcome_unknown (its fingerprint keeps refusing another
-- payload under the key, a retry of the same payload takes it over again, as
-- after an admission-expired answer), and an outcome_unknown one, which could
-- be either, stays. A fence raise and its history row stay: a raise that
-- nothing was forwarded under is harmless, as after an entity-busy answer.
--
-- Lock order (see admit.sql): the entity row first, then the record. An
-- admission that commits between the two statements leaves its slot taken
-- (`record` true, `slot` false): the store calls this again, which frees it.
-- The NOTIFYs wake other replicas' waiters on what was freed.
CREATE OR REPLACE FUNCTION fencegate_release_unsent(
  p_scope text, p_key text, p_entity text, p_owner text, p_retry_unknown boolean, p_lock_ms bigint,
  p_channel text, p_entity_topic text, p_record_topic text,
  OUT slot boolean, OUT record boolean
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  slot := false;
  record := false;
  IF p_entity IS NOT NULL THEN
    UPDATE fence_entities e SET inflight_owner = NULL, inflight_until = NULL
      WHERE e.entity = p_entity AND e.inflight_owner = p_owner;
    slot := FOUND;
  END IF;
  IF p_key IS NOT NULL THEN
    IF p_retry_unknown THEN
      DELETE FROM idempotency_records r
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state = 'in_progress'
          AND r.locked_until = r.created_at + p_lock_ms * interval '1 millisecond';
      IF NOT FOUND THEN
        UPDATE idempotency_records r SET state = 'outcome_unknown',
            attempt_until = coalesce(r.attempt_until, r.locked_until), locked_until = NULL
          WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state = 'in_progress';
      END IF;
    ELSE
      DELETE FROM idempotency_records r
        WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    END IF;
    record := FOUND;
  END IF;
  IF p_channel IS NOT NULL THEN
    IF slot AND p_entity_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_entity_topic); END IF;
    IF record AND p_record_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_record_topic); END IF;
  END IF;
END;
$$;
