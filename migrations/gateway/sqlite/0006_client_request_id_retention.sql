-- fencegate gateway, SQLite and D1: the client's request id beside the
-- gateway's, and the indexes of the entity / history / operator-action sweeps.

-- The caller's X-Request-Id, kept beside the gateway's own request_id, never
-- instead of it: a caller must not choose the id its refusal is filed under.
ALTER TABLE rejections ADD COLUMN client_request_id TEXT;

-- The sweeper's scans: entities whose last accepted fence is older than
-- entityRetention, fence history and operator actions older than theirs.
-- Each batch then reads only the rows it deletes. (The fence_entities index
-- costs an index update on each accepted fence, next to the row's own.)
CREATE INDEX IF NOT EXISTS fence_entities_accepted ON fence_entities (accepted_at);
CREATE INDEX IF NOT EXISTS fence_history_at ON fence_history (at);
CREATE INDEX IF NOT EXISTS operator_actions_at ON operator_actions (at);
