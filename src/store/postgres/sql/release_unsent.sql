-- fencegate_release_unsent: undoes what an admission may have committed when
-- its caller never learnt the answer (DESIGN §8.2, "An admission whose answer
-- was lost"). The gateway answered that caller 503 store-unavailable and sent
-- nothing upstream, so a record or a serial slot held under the request's
-- owner token stands for a request that was never made: the record is
-- deleted (in_progress, or outcome_unknown once its lock ran out and another
-- request marked it) and the slot freed, as a release after the upstream
-- refused the connection does. The owner token is the request's own (a fresh
-- random one per request), so nothing else can match: a record another owner
-- holds or took over, or none at all (the admission rolled back), is left as
-- it is, and nothing is logged. A record this request took over (a route with
-- onUnknown: retry) goes too: that route declared a re-send safe. A fence raise and its history row stay: a raise
-- that nothing was forwarded under is harmless, as after an entity-busy answer.
--
-- Lock order (see admit.sql): the entity row first, then the record. The
-- NOTIFYs wake other replicas' waiters on what was freed.
CREATE OR REPLACE FUNCTION fencegate_release_unsent(
  p_scope text, p_key text, p_entity text, p_owner text,
  p_channel text, p_entity_topic text, p_record_topic text,
  OUT released boolean
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_slot   boolean := false;
  v_record boolean := false;
BEGIN
  IF p_entity IS NOT NULL THEN
    UPDATE fence_entities e SET inflight_owner = NULL, inflight_until = NULL
      WHERE e.entity = p_entity AND e.inflight_owner = p_owner;
    v_slot := FOUND;
  END IF;
  IF p_key IS NOT NULL THEN
    DELETE FROM idempotency_records r
      WHERE r.scope = p_scope AND r.key = p_key AND r.owner_token = p_owner AND r.state IN ('in_progress', 'outcome_unknown');
    v_record := FOUND;
  END IF;
  IF p_channel IS NOT NULL THEN
    IF v_slot AND p_entity_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_entity_topic); END IF;
    IF v_record AND p_record_topic IS NOT NULL THEN PERFORM pg_notify(p_channel, p_record_topic); END IF;
  END IF;
  released := v_slot OR v_record;
END;
$$;
