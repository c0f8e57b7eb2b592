-- fencegate_log_rejection: one rejection row, as the store hands it over:
-- every text value already bounded by the store (src/store/bounds.ts), the
-- client's request id too (DESIGN §4). Called by fencegate_admit and
-- fencegate_finish, inside their transaction.
--
-- The current definition (migration 0006, which also dropped 0003's
-- 11-parameter signature). Applied by the migrator when its sha256 changes
-- (see ./README.md).

CREATE OR REPLACE FUNCTION fencegate_log_rejection(
  p_at timestamptz, p_reason text, p_entity text, p_presented bigint, p_current bigint,
  p_key text, p_caller text, p_method text, p_path text, p_payload_sha256 text, p_request_id text,
  p_client_request_id text
) RETURNS void
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
  INSERT INTO rejections
    (at, reason, entity, presented_fence, current_fence, idempotency_key, caller, method, path, payload_sha256, request_id,
     client_request_id)
  VALUES (p_at, p_reason, p_entity, p_presented, p_current, p_key, p_caller, p_method, p_path, p_payload_sha256, p_request_id,
     p_client_request_id);
$$;
