-- fencegate_finish_many: a group of finishes (DESIGN §3.7, §8) in ONE
-- statement and so one transaction and one commit: element i is
-- fencegate_finish(p_scope[i], …) exactly (finish.sql), run in a
-- subtransaction of its own (the BEGIN … EXCEPTION block), so that an
-- element that raises rolls back only its own writes and its own NOTIFYs and
-- the rest of the group still commits. One row per element, in order:
-- `recorded`, or the error's SQLSTATE and message (recorded NULL).
--
-- The channel is the store's, one for the whole group. Elements run in the
-- order given; each takes its locks in finish.sql's order (entity row, then
-- record) and keeps them until the group commits. The caller bounds the
-- group (src/store/postgres/finish-group.ts) at 64 elements: past 64
-- subtransactions with an XID a backend's subxid cache overflows and every
-- other session's snapshot checks get slower.
--
-- Applied by the migrator when this file's sha256 changes (see ./README.md).
CREATE OR REPLACE FUNCTION fencegate_finish_many(
  p_scope text[], p_key text[], p_entity text[], p_owner text[], p_outcome text[],
  p_status integer[], p_headers jsonb[], p_body bytea[], p_retention_ms bigint[],
  p_caller text[], p_method text[], p_path text[], p_payload_sha256 text[], p_request_id text[],
  p_channel text, p_entity_topic text[], p_record_topic text[],
  p_client_request_id text[], p_log_entity text[], p_log_key text[]
)
RETURNS TABLE (ord integer, recorded boolean, err_code text, err_message text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_scope, 1), 0) LOOP
    ord := i;
    err_code := NULL;
    err_message := NULL;
    BEGIN
      recorded := fencegate_finish(p_scope[i], p_key[i], p_entity[i], p_owner[i], p_outcome[i],
        p_status[i], p_headers[i], p_body[i], p_retention_ms[i],
        p_caller[i], p_method[i], p_path[i], p_payload_sha256[i], p_request_id[i],
        p_channel, p_entity_topic[i], p_record_topic[i],
        p_client_request_id[i], p_log_entity[i], p_log_key[i]);
    EXCEPTION WHEN OTHERS THEN
      recorded := NULL;
      err_code := SQLSTATE;
      err_message := SQLERRM;
    END;
    RETURN NEXT;
  END LOOP;
END;
$$;
