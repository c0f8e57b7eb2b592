-- fencegate_log_rejection: one rejection row, as the store hands it over:
-- every text value already bounded by the store (src/store/bounds.ts), the
-- client's request id too (DESIGN §4). Called by fencegate_admit and
-- fencegate_finish, inside their transaction.
--
-- The current definition (migration 0009, which added p_tool; 0006 dropped
-- 0003's 11-parameter signature). p_tool has a DEFAULT, so the callers that
-- pass 12 arguments (fencegate_finish, ./finish.sql, whose late-finish rows
-- carry no tool) get this function; the 12-parameter definition is dropped,
-- or their call would be ambiguous. Applied by the migrator when its sha256
-- changes (see ./README.md).

DROP FUNCTION IF EXISTS fencegate_log_rejection(timestamptz, text, text, bigint, bigint, text, text, text, text, text, text, text);
CREATE OR REPLACE FUNCTION fencegate_log_rejection(
  p_at timestamptz, p_reason text, p_entity text, p_presented bigint, p_current bigint,
  p_key text, p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  p_client_request_id text, p_tool text DEFAULT NULL
) RETURNS void
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
  INSERT INTO rejections
    (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id,
     client_request_id, tool)
  VALUES (p_at, p_reason, p_entity, p_presented, p_current, p_key, p_caller, p_method, p_path, p_payload_sha256, p_request_id,
     p_client_request_id, p_tool);
$$;
