-- fencegate gateway, SQLite and D1: the MCP tool of a refused tools/call in
-- the rejection log (DESIGN §4), and its filter's index.

-- NULL for a plain route and for every row written before this migration.
ALTER TABLE rejections ADD COLUMN tool TEXT;
-- GET <adminPrefix>/v1/rejections?tool=…, newest first, like the other filters.
CREATE INDEX IF NOT EXISTS rejections_tool ON rejections (tool, id);
