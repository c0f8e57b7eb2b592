-- fencegate_ms_between: milliseconds from b to a, rounded up, so that a
-- positive wait never reads 0 (the Retry-After of a busy answer, DESIGN §3.5).
--
-- The current definition (first created by migration 0003, unchanged since).
-- The migrator applies this file after the migrations whenever its sha256
-- differs from the one recorded in fencegate_functions (see ./README.md).

CREATE OR REPLACE FUNCTION fencegate_ms_between(a timestamptz, b timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE
AS $$ SELECT ceil(extract(epoch FROM (a - b)) * 1000)::bigint $$;
