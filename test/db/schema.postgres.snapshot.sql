-- fencegate: the whole current PostgreSQL schema of a freshly migrated database.
-- Generated from migrations/gateway/postgres, src/store/postgres/sql and migrations/lease/postgres; do not edit.
-- Compared by test/db/schema-snapshot.test.ts; after a deliberate change: UPDATE_SNAPSHOTS=1 npx vitest run test/db/schema-snapshot.test.ts

-- ===== gateway schema (migrations/gateway/postgres, then src/store/postgres/sql) =====

CREATE TABLE commands (
  id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
  at timestamp with time zone NOT NULL,
  route text,
  method text,
  path text,
  entity text,
  fence bigint,
  idempotency_key text,
  scope text,
  caller text,
  tool text,
  outcome text NOT NULL,
  decision text,
  status integer,
  upstream_ms double precision,
  request_id text,
  client_request_id text,
  payload_sha256 text,
  CONSTRAINT commands_pkey PRIMARY KEY (id)
);
CREATE INDEX commands_at ON commands USING btree (at);
CREATE INDEX commands_entity ON commands USING btree (entity, id);
CREATE INDEX commands_key ON commands USING btree (idempotency_key, id);
CREATE UNIQUE INDEX commands_pkey ON commands USING btree (id);

CREATE TABLE fence_entities (
  entity text NOT NULL,
  fence bigint,
  accepted_at timestamp with time zone NOT NULL,
  inflight_owner text,
  inflight_until timestamp with time zone,
  CONSTRAINT fence_entities_pkey PRIMARY KEY (entity)
);
CREATE INDEX fence_entities_accepted ON fence_entities USING btree (accepted_at);
CREATE UNIQUE INDEX fence_entities_pkey ON fence_entities USING btree (entity);

CREATE TABLE fence_history (
  id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
  entity text NOT NULL,
  fence bigint NOT NULL,
  at timestamp with time zone NOT NULL,
  caller text,
  request_id text,
  CONSTRAINT fence_history_entity_fence_key UNIQUE (entity, fence),
  CONSTRAINT fence_history_pkey PRIMARY KEY (id)
);
CREATE INDEX fence_history_at ON fence_history USING btree (at);
CREATE UNIQUE INDEX fence_history_entity_fence_key ON fence_history USING btree (entity, fence);
CREATE UNIQUE INDEX fence_history_pkey ON fence_history USING btree (id);

CREATE TABLE fencegate_functions (
  name text NOT NULL,
  sha256 text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT fencegate_functions_pkey PRIMARY KEY (name)
);
CREATE UNIQUE INDEX fencegate_functions_pkey ON fencegate_functions USING btree (name);

CREATE TABLE fencegate_migrations (
  name text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT fencegate_migrations_pkey PRIMARY KEY (name)
);
CREATE UNIQUE INDEX fencegate_migrations_pkey ON fencegate_migrations USING btree (name);

CREATE TABLE idempotency_records (
  scope text NOT NULL,
  key text NOT NULL,
  fingerprint text NOT NULL,
  entity text,
  fence bigint,
  state text NOT NULL,
  owner_token text NOT NULL,
  locked_until timestamp with time zone,
  status integer,
  headers jsonb,
  body bytea,
  created_at timestamp with time zone NOT NULL,
  expires_at timestamp with time zone NOT NULL,
  attempt_until timestamp with time zone,
  request_id text,
  reconcile_result text,
  reconciled_at timestamp with time zone,
  CONSTRAINT idempotency_records_pkey PRIMARY KEY (scope, key),
  CONSTRAINT idempotency_records_state_check CHECK ((state = ANY (ARRAY['in_progress'::text, 'completed'::text, 'outcome_unknown'::text])))
);
CREATE INDEX idempotency_records_by_key ON idempotency_records USING btree (key);
CREATE INDEX idempotency_records_expiry ON idempotency_records USING btree (expires_at) WHERE (state = 'completed'::text);
CREATE INDEX idempotency_records_locked ON idempotency_records USING btree (locked_until) WHERE (state = 'in_progress'::text);
CREATE UNIQUE INDEX idempotency_records_pkey ON idempotency_records USING btree (scope, key);
CREATE INDEX idempotency_records_unknown ON idempotency_records USING btree (created_at) WHERE (state = 'outcome_unknown'::text);

CREATE TABLE operator_actions (
  id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
  at timestamp with time zone NOT NULL,
  action text NOT NULL,
  scope text NOT NULL,
  key text NOT NULL,
  entity text,
  fence bigint,
  fingerprint text,
  status integer,
  operator text,
  note text,
  request_id text,
  CONSTRAINT operator_actions_action_check CHECK ((action = ANY (ARRAY['resolve-completed'::text, 'resolve-released'::text]))),
  CONSTRAINT operator_actions_pkey PRIMARY KEY (id)
);
CREATE INDEX operator_actions_at ON operator_actions USING btree (at);
CREATE UNIQUE INDEX operator_actions_pkey ON operator_actions USING btree (id);

CREATE TABLE rejections (
  id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
  at timestamp with time zone NOT NULL,
  reason text NOT NULL,
  entity text,
  presented_fence bigint,
  current_fence bigint,
  idempotency_key text,
  caller text,
  method text,
  path text,
  payload_sha256 text,
  request_id text,
  detail text,
  client_request_id text,
  tool text,
  CONSTRAINT rejections_pkey PRIMARY KEY (id)
);
CREATE INDEX rejections_at ON rejections USING btree (at);
CREATE INDEX rejections_caller ON rejections USING btree (caller, id);
CREATE INDEX rejections_entity ON rejections USING btree (entity, id);
CREATE UNIQUE INDEX rejections_pkey ON rejections USING btree (id);
CREATE INDEX rejections_reason ON rejections USING btree (reason, id);
CREATE INDEX rejections_tool ON rejections USING btree (tool, id);

FUNCTION fencegate_admit(
  p_scope text,
  p_key text,
  p_entity text,
  p_fence bigint,
  p_fingerprint text,
  p_serial boolean,
  p_owner text,
  p_lock_ms bigint,
  p_retention_ms bigint,
  p_retry_unknown boolean,
  p_caller text,
  p_method text,
  p_path text,
  p_payload_sha256 text,
  p_request_id text,
  OUT outcome text,
  OUT current_fence bigint,
  OUT retry_after_ms bigint,
  OUT takeover boolean,
  OUT status integer,
  OUT headers jsonb,
  OUT body bytea
) RETURNS record LANGUAGE sql VOLATILE SET search_path=<schema>;
  -- body sha256 60e52426457f2e61

FUNCTION fencegate_admit(
  p_scope text,
  p_key text,
  p_entity text,
  p_fence bigint,
  p_fingerprint text,
  p_serial boolean,
  p_owner text,
  p_lock_ms bigint,
  p_retention_ms bigint,
  p_retry_unknown boolean,
  p_caller text,
  p_method text,
  p_path text,
  p_payload_sha256 text,
  p_request_id text,
  p_client_request_id text,
  p_log_entity text,
  p_log_key text,
  p_tool text DEFAULT NULL::text,
  OUT outcome text,
  OUT current_fence bigint,
  OUT retry_after_ms bigint,
  OUT takeover boolean,
  OUT status integer,
  OUT headers jsonb,
  OUT body bytea
) RETURNS record LANGUAGE plpgsql VOLATILE SET search_path=<schema>;
  -- body sha256 c3254e9b43c3d858

FUNCTION fencegate_admit_many(
  p_scope text[],
  p_key text[],
  p_entity text[],
  p_fence bigint[],
  p_fingerprint text[],
  p_serial boolean[],
  p_owner text[],
  p_lock_ms bigint[],
  p_retention_ms bigint[],
  p_retry_unknown boolean[],
  p_caller text[],
  p_method text[],
  p_path text[],
  p_payload_sha256 text[],
  p_request_id text[],
  p_client_request_id text[],
  p_log_entity text[],
  p_log_key text[],
  p_tool text[],
  p_lock_timeout_ms integer,
  p_budget_ms integer
) RETURNS TABLE(ord integer, outcome text, current_fence bigint, retry_after_ms bigint, takeover boolean, status integer, headers jsonb, body bytea, alone boolean, err_code text, err_message text) LANGUAGE plpgsql VOLATILE SET search_path=<schema>;
  -- body sha256 98023adc55a4bd9f

FUNCTION fencegate_extend_lock(
  p_scope text,
  p_key text,
  p_entity text,
  p_owner text,
  p_ms bigint,
  OUT extended boolean
) RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path=<schema>;
  -- body sha256 d7b5d23484f9ee43

FUNCTION fencegate_finish(
  p_scope text,
  p_key text,
  p_entity text,
  p_owner text,
  p_outcome text,
  p_status integer,
  p_headers jsonb,
  p_body bytea,
  p_retention_ms bigint,
  p_caller text,
  p_method text,
  p_path text,
  p_payload_sha256 text,
  p_request_id text,
  p_channel text,
  p_entity_topic text,
  p_record_topic text,
  OUT recorded boolean
) RETURNS boolean LANGUAGE sql VOLATILE SET search_path=<schema>;
  -- body sha256 48b1ce04b240ff57

FUNCTION fencegate_finish(
  p_scope text,
  p_key text,
  p_entity text,
  p_owner text,
  p_outcome text,
  p_status integer,
  p_headers jsonb,
  p_body bytea,
  p_retention_ms bigint,
  p_caller text,
  p_method text,
  p_path text,
  p_payload_sha256 text,
  p_request_id text,
  p_channel text,
  p_entity_topic text,
  p_record_topic text,
  p_client_request_id text,
  p_log_entity text,
  p_log_key text,
  OUT recorded boolean
) RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path=<schema>;
  -- body sha256 e24e4109f9248bcf

FUNCTION fencegate_finish_many(
  p_scope text[],
  p_key text[],
  p_entity text[],
  p_owner text[],
  p_outcome text[],
  p_status integer[],
  p_headers jsonb[],
  p_body bytea[],
  p_retention_ms bigint[],
  p_caller text[],
  p_method text[],
  p_path text[],
  p_payload_sha256 text[],
  p_request_id text[],
  p_channel text,
  p_entity_topic text[],
  p_record_topic text[],
  p_client_request_id text[],
  p_log_entity text[],
  p_log_key text[]
) RETURNS TABLE(ord integer, recorded boolean, err_code text, err_message text) LANGUAGE plpgsql VOLATILE SET search_path=<schema>;
  -- body sha256 0c9fb1ac4f2a0c95

FUNCTION fencegate_log_rejection(
  p_at timestamp with time zone,
  p_reason text,
  p_entity text,
  p_presented bigint,
  p_current bigint,
  p_key text,
  p_caller text,
  p_method text,
  p_path text,
  p_payload_sha256 text,
  p_request_id text,
  p_client_request_id text,
  p_tool text DEFAULT NULL::text
) RETURNS void LANGUAGE sql VOLATILE SET search_path=<schema>;
  -- body sha256 03d174452efda6fa

FUNCTION fencegate_ms_between(
  a timestamp with time zone,
  b timestamp with time zone
) RETURNS bigint LANGUAGE sql IMMUTABLE;
  -- body sha256 5c9586dbea8e9df7

FUNCTION fencegate_release_unsent(
  p_scope text,
  p_key text,
  p_entity text,
  p_owner text,
  p_retry_unknown boolean,
  p_lock_ms bigint,
  p_channel text,
  p_entity_topic text,
  p_record_topic text,
  OUT slot boolean,
  OUT record boolean
) RETURNS record LANGUAGE plpgsql VOLATILE SET search_path=<schema>;
  -- body sha256 28e4c08526c64880

-- ===== lease schema (migrations/lease/postgres) =====

CREATE TABLE fencegate_lease_migrations (
  name text NOT NULL,
  applied_at timestamp with time zone NOT NULL DEFAULT now(),
  CONSTRAINT fencegate_lease_migrations_pkey PRIMARY KEY (name)
);
CREATE UNIQUE INDEX fencegate_lease_migrations_pkey ON fencegate_lease_migrations USING btree (name);

CREATE TABLE tool_job_store (
  singleton boolean NOT NULL DEFAULT true,
  store_id text NOT NULL,
  CONSTRAINT tool_job_store_pkey PRIMARY KEY (singleton),
  CONSTRAINT tool_job_store_singleton_check CHECK (singleton),
  CONSTRAINT tool_job_store_store_id_check CHECK ((store_id ~ '^[0-9a-f]{32}$'::text))
);
CREATE UNIQUE INDEX tool_job_store_pkey ON tool_job_store USING btree (singleton);

CREATE TABLE tool_jobs (
  id bigint NOT NULL GENERATED ALWAYS AS IDENTITY,
  kind text NOT NULL,
  state text NOT NULL DEFAULT 'queued'::text,
  owner_id text,
  lease_until timestamp with time zone,
  fencing_token bigint NOT NULL DEFAULT 0,
  heartbeat_at timestamp with time zone,
  attempt integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL,
  idempotency_key text NOT NULL,
  fence_key text,
  payload jsonb NOT NULL,
  payload_sha256 text NOT NULL,
  result jsonb,
  error jsonb,
  reason text,
  previous_owner_id text,
  created_at timestamp with time zone NOT NULL DEFAULT now(),
  first_claimed_at timestamp with time zone,
  deadline_at timestamp with time zone,
  run_after timestamp with time zone NOT NULL DEFAULT now(),
  finished_at timestamp with time zone,
  store_id text,
  CONSTRAINT tool_jobs_idempotency_key_key UNIQUE (idempotency_key),
  CONSTRAINT tool_jobs_max_attempts_check CHECK ((max_attempts >= 1)),
  CONSTRAINT tool_jobs_pkey PRIMARY KEY (id),
  CONSTRAINT tool_jobs_state_check CHECK ((state = ANY (ARRAY['queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text])))
);
CREATE INDEX tool_jobs_fence_key ON tool_jobs USING btree (fence_key, fencing_token) WHERE (fence_key IS NOT NULL);
CREATE UNIQUE INDEX tool_jobs_idempotency_key_key ON tool_jobs USING btree (idempotency_key);
CREATE UNIQUE INDEX tool_jobs_pkey ON tool_jobs USING btree (id);
CREATE INDEX tool_jobs_queued ON tool_jobs USING btree (run_after, id) WHERE (state = 'queued'::text);
CREATE INDEX tool_jobs_running ON tool_jobs USING btree (lease_until) WHERE (state = 'running'::text);
