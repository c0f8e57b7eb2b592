-- fencegate_admit_many: a group of admissions (DESIGN §3.5, §8.2) in ONE
-- statement and so one transaction and one commit: element i is
-- fencegate_admit(p_scope[i], …) exactly (admit.sql), run in a subtransaction
-- of its own (the BEGIN … EXCEPTION block), so that an element that raises
-- rolls back only its own writes, its rejection row with them, and the rest
-- of the group still commits. One row per element, in order: the admission's
-- columns; or `alone` (not decided here: the store runs it again by itself,
-- through the plain fencegate_admit, after this group committed); or the
-- error's SQLSTATE and message.
--
-- Elements run in the order given, each taking its locks in admit.sql's order
-- (entity row, then record) and keeping them until the group commits, so a
-- later element of the same entity or key sees an earlier one's slot and
-- record (entity-busy, idempotency-in-progress), as two calls one after the
-- other would.
--
-- Clock. fencegate_admit measures every expiry it writes (locked_until,
-- inflight_until, …) from clock_timestamp() once its rows are held (admit.sql,
-- DESIGN §2 G3); in a group, element 1's rows commit only after the elements
-- after it ran, so its lock is already partly spent at COMMIT by however long
-- they took. Bounded here:
--   * lock_timeout is p_lock_timeout_ms (a few ms) for the group: an element
--     that would wait longer for a row lock (another replica's admission or
--     finish holds its entity or record) stops with 55P03, its subtransaction
--     rolls back, and it is returned `alone`; so is a deadlock victim (40P01;
--     with lock_timeout far below deadlock_timeout, two groups that hold each
--     other's rows give up waiting before any cycle is looked for);
--   * p_budget_ms: an element that would start after the group has run that
--     long is returned `alone` without running.
-- So an element's lock is spent at COMMIT by at most p_budget_ms plus one
-- element's run (its row waits, each under p_lock_timeout_ms) plus the
-- commit itself. Once an element of an entity or a key is `alone`, every
-- later element of the same entity or key is too, so that the store, which
-- re-runs them in order, still decides them in arrival order.
--
-- The caller bounds the group (src/store/postgres/finish-group.ts) at 64
-- elements: past 64 subtransactions with an XID a backend's subxid cache
-- overflows and every other session's snapshot checks get slower. Text
-- parameters arrive escaped by the store (src/store/postgres/text.ts).
--
-- Applied by the migrator when this file's sha256 changes (see ./README.md).
CREATE OR REPLACE FUNCTION fencegate_admit_many(
  p_scope text[], p_key text[], p_entity text[], p_fence bigint[], p_fingerprint text[],
  p_serial boolean[], p_owner text[], p_lock_ms bigint[], p_retention_ms bigint[], p_retry_unknown boolean[],
  p_caller text[], p_method text[], p_path text[], p_payload_sha256 text[], p_request_id text[],
  p_client_request_id text[], p_log_entity text[], p_log_key text[], p_tool text[],
  p_lock_timeout_ms integer, p_budget_ms integer
)
RETURNS TABLE (ord integer, outcome text, current_fence bigint, retry_after_ms bigint, takeover boolean,
  status integer, headers jsonb, body bytea, alone boolean, err_code text, err_message text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_start    timestamptz := clock_timestamp();
  v_budget   interval := p_budget_ms * interval '1 millisecond';
  v_prior    text := current_setting('lock_timeout');
  -- The entities and the keys (scope, key, as one text) of the elements left `alone` so far.
  v_entities text[] := '{}';
  v_keys     text[] := '{}';
  v_tag      text;
  v_r        record;
BEGIN
  -- Local to this transaction, and restored below: the group is the
  -- statement's whole transaction, the store's connection keeps its setting.
  PERFORM set_config('lock_timeout', coalesce(p_lock_timeout_ms, 0) || 'ms', true);
  FOR i IN 1 .. coalesce(array_length(p_scope, 1), 0) LOOP
    ord := i;
    outcome := NULL; current_fence := NULL; retry_after_ms := NULL; takeover := NULL;
    status := NULL; headers := NULL; body := NULL; alone := false; err_code := NULL; err_message := NULL;
    v_tag := CASE WHEN p_key[i] IS NULL THEN NULL ELSE length(p_scope[i]) || ':' || p_scope[i] || p_key[i] END;
    IF (v_budget IS NOT NULL AND clock_timestamp() - v_start >= v_budget)
        OR p_entity[i] = ANY (v_entities) OR v_tag = ANY (v_keys) THEN
      alone := true;
    ELSE
      BEGIN
        SELECT * INTO v_r FROM fencegate_admit(p_scope[i], p_key[i], p_entity[i], p_fence[i], p_fingerprint[i],
          p_serial[i], p_owner[i], p_lock_ms[i], p_retention_ms[i], p_retry_unknown[i],
          p_caller[i], p_method[i], p_path[i], p_payload_sha256[i], p_request_id[i],
          p_client_request_id[i], p_log_entity[i], p_log_key[i], p_tool[i]);
        outcome := v_r.outcome; current_fence := v_r.current_fence; retry_after_ms := v_r.retry_after_ms;
        takeover := v_r.takeover; status := v_r.status; headers := v_r.headers; body := v_r.body;
      EXCEPTION
        WHEN lock_not_available OR deadlock_detected THEN
          alone := true;
        WHEN OTHERS THEN
          err_code := SQLSTATE;
          err_message := SQLERRM;
      END;
    END IF;
    IF alone THEN
      IF p_entity[i] IS NOT NULL THEN v_entities := v_entities || p_entity[i]; END IF;
      IF v_tag IS NOT NULL THEN v_keys := v_keys || v_tag; END IF;
    END IF;
    RETURN NEXT;
  END LOOP;
  PERFORM set_config('lock_timeout', v_prior, true);
END;
$$;
