import { z } from 'zod';
import { parseDuration } from '../core/duration.js';
import { DEFAULT_QUERY_TIMEOUT_MS } from '../store/query-timeout.js';
import { resourceMetadataPath } from '../protocol/resource-metadata.js';
import {
  credentialHeaderCollision,
  DEFAULT_MAX_KEY_LENGTH,
  echoKeyCollision,
  keyHeaderCollision,
  keyScopeCollision,
  MAX_KEY_LENGTH_LIMIT,
  OVERRIDE_FIELDS,
} from '../protocol/headers.js';

const HeaderName = z.string().regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, 'must be an HTTP header name');
/**
 * Claims that a new token or a new sign-in changes: JWT's own (RFC 7519),
 * OpenID Connect's (`auth_time`, `nonce`, `at_hash`, `c_hash`, `sid`) and
 * Microsoft Entra's per-token `uti`. None can scope keys.
 */
const PER_TOKEN_CLAIMS = ['jti', 'iat', 'exp', 'nbf', 'auth_time', 'nonce', 'at_hash', 'c_hash', 'sid', 'uti'];
/**
 * A top-level JWT claim name: no path (`a.b` is the claim named "a.b", not
 * `b` inside `a`), printable ASCII without spaces, so that it can be named
 * in a 403's detail and `WWW-Authenticate`. Namespaced claims such as
 * `https://example.com/tenant` fit.
 */
const ClaimName = z
  .string()
  .regex(/^[\x21-\x7e]{1,256}$/, 'must be a top-level claim name: 1 to 256 printable ASCII characters, no spaces')
  // A claim that every token (re)issue changes would put a retry with a refreshed token in a new key space, and it would run again.
  .refine((n) => !PER_TOKEN_CLAIMS.includes(n), {
    message: `changes with a new token or sign-in (${PER_TOKEN_CLAIMS.join(', ')}): a retry with a refreshed token would be in another key space and run upstream again; use a claim that names the tenant`,
  });

const Duration = z.union([z.string(), z.number()]).transform((v, ctx) => {
  const ms = parseDuration(v);
  if (ms === null) {
    ctx.addIssue({ code: 'custom', message: 'must be a duration such as "500ms", "30s", "15m", "24h", "7d", "1h30m", or milliseconds' });
    return z.NEVER;
  }
  return ms;
});

const ms = (max: number) => z.number().int().min(0).max(max);

export const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;

/** Headers kept with a stored response for replay (DESIGN §3.9). Never `set-cookie`. */
export const DEFAULT_REPLAY_HEADERS = [
  'content-type',
  'content-language',
  'content-encoding',
  'content-disposition',
  'location',
  'etag',
  'last-modified',
  'cache-control',
  'request-id',
  'idempotency-key',
];

/** RFC 6901, naming something below the root (`/a/b`, `~0` for `~`, `~1` for `/`). */
const JsonPointer = z.string().regex(/^(\/([^~]|~[01])*)+$/, 'must be a JSON pointer (RFC 6901) below the root, e.g. "/request_id"');

const Entity = z.union([
  z.strictObject({ header: HeaderName }),
  z.strictObject({ path: z.string().regex(/^:[A-Za-z_][A-Za-z0-9_]*$/, 'must name a path parameter, e.g. ":invoice"') }),
  z.strictObject({ json: z.string().regex(/^(\/.*)?$/, 'must be a JSON pointer (RFC 6901), e.g. "/invoice_id"') }),
]);

/**
 * Fields that also take `{ "env": "NAME", "prefix"?: … }`, resolved before
 * validation (./env-refs.ts ENV_FIELDS), so the schema itself sees only the
 * string; the JSON Schema (`fencegate config schema`, ./json-schema.ts)
 * offers both forms for them.
 */
export const ENV_CAPABLE = new WeakSet<z.ZodType>();
function envCapable<T extends z.ZodType>(schema: T): T {
  ENV_CAPABLE.add(schema);
  return schema;
}

/**
 * A PEM for upstream TLS: a file path (read once at start-up by the Node
 * entry, relative to the working directory), or the PEM itself, inline
 * (`{ "pem": … }`) or from `{ "env": … }`.
 */
const PemSource = envCapable(z.union([z.string().min(1), z.strictObject({ pem: z.string().min(1) })]));

/**
 * TLS towards a route's upstream (docs/deploy.md §5): a CA to
 * trust instead of the system's, and a client certificate for mutual TLS.
 */
export const UpstreamTlsSchema = z
  .strictObject({
    ca: PemSource.optional(),
    cert: PemSource.optional(),
    key: PemSource.optional(),
  })
  .refine((t) => (t.cert === undefined) === (t.key === undefined), 'needs both "cert" and "key" for a client certificate, or neither');
export type UpstreamTlsConfig = z.output<typeof UpstreamTlsSchema>;

/** A header sent to the upstream: a literal, or a secret read from an environment variable. */
const UpstreamHeader = z.union([
  z.string(),
  z.strictObject({ env: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name'), prefix: z.string().default('') }),
]);

/**
 * An `mcp` route's per-tool policy (docs/mcp.md): each field overrides the
 * route's. `entity.json` points into the `tools/call` params
 * (`/arguments/invoice_id`, `/_meta/...`). `readOnly: true` passes the tool
 * through undecided; it wins over the server's `readOnlyHint`.
 */
export const McpToolSchema = z.strictObject({
  fence: z.enum(['required', 'optional', 'off']).optional(),
  idempotency: z.enum(['required', 'optional', 'off']).optional(),
  entity: z
    .union([
      z.strictObject({ header: HeaderName }),
      z.strictObject({ json: z.string().regex(/^(\/.*)?$/, 'must be a JSON pointer (RFC 6901) into params, e.g. "/arguments/invoice_id"') }),
    ])
    .optional(),
  mode: z.enum(['serial', 'concurrent']).optional(),
  timeoutMs: ms(600_000).min(1).optional(),
  retention: Duration.optional(),
  onUnknown: z.enum(['reject', 'retry']).optional(),
  readOnly: z.boolean().optional(),
});

/**
 * An `mcp` route's tool access (docs/mcp.md "Allowed tools"): which tools
 * agents may call and are shown. A sibling of `tools`, not inside it: that
 * map's keys are tool names, and a tool may be called `allow`. Each entry
 * is a tool name or a simple glob (`*`: any run of characters). A tool is
 * allowed when `allow` is absent or one of its patterns matches the name as
 * written, and no `deny` pattern matches it compared without regard to
 * case, width, whitespace and invisible characters (../http/mcp/access.ts).
 */
const ToolPattern = z
  .string()
  .min(1)
  .max(256)
  .regex(/^[^\u0000-\u001f\u007f]+$/, 'must be a tool name or glob without control characters');
export const ToolAccessSchema = z
  .strictObject({ allow: z.array(ToolPattern).optional(), deny: z.array(ToolPattern).optional() })
  .refine((a) => a.allow !== undefined || a.deny !== undefined, 'needs "allow", "deny" or both');

/** An `mcp` route's methods when `match.methods` is left out: JSON-RPC POSTs, the server's event stream, the session's end. */
export const MCP_DEFAULT_METHODS = ['POST', 'GET', 'DELETE'] as const;

function mcpMethodDefaults(route: unknown): unknown {
  if (typeof route !== 'object' || route === null || (route as { protocol?: unknown }).protocol !== 'mcp') return route;
  const match = (route as { match?: unknown }).match;
  if (typeof match !== 'object' || match === null || 'methods' in match) return route;
  return { ...route, match: { ...match, methods: [...MCP_DEFAULT_METHODS] } };
}

// ── reconcile: the status query for an outcome_unknown record (DESIGN §3.12) ──

/** The variables a `reconcile.path` may name; each is percent-encoded when substituted. */
export const RECONCILE_VARIABLES = ['key', 'entity', 'fence', 'request_id'] as const;

/**
 * A route's status query: how the gateway asks the upstream whether a request
 * whose answer was lost was performed (../http/pipeline/reconcile.ts). A
 * found answer completes the record; a not-found one releases it only once
 * the attempt can no longer be in flight and `settleTime` has passed (by the
 * database clock); anything else settles nothing.
 */
export const ReconcileSchema = z
  .strictObject({
    /** A query, never a command: a method with a body would be one more side effect. */
    method: z.enum(['GET', 'HEAD'], { error: 'must be GET or HEAD: the status query must not have side effects' }).default('GET'),
    /** On the route's upstream, e.g. "/v1/charges?idempotency_key={key}". */
    path: z.string().regex(/^\/[^#\s]*$/, 'must start with "/" and contain no fragment or space'),
    headers: z.record(HeaderName, UpstreamHeader).default({}),
    /** Statuses that say the command was performed (2xx: the answer is stored as its outcome). */
    found: z.array(z.number().int().min(200).max(299)).min(1).default([200]),
    /** Statuses that say the upstream has no such command (4xx); trusted only as DESIGN §3.12 says. */
    notFound: z.array(z.number().int().min(400).max(499)).min(1).default([404]),
    /** How long after the attempt's lock ended a "not found" is still not trusted (a lagging status endpoint). */
    settleTime: Duration.prefault('30s'),
    /** The background reconciler's first back-off; doubled per attempt, up to an hour. */
    interval: Duration.prefault('10s').pipe(z.number().min(100, 'must be at least 100ms')),
    /** Past this age (since admission) the background reconciler leaves the record to an operator. */
    maxAge: Duration.prefault('24h'),
    /** Status queries the background reconciler runs at once. */
    concurrency: z.number().int().min(1).max(64).default(4),
  })
  .superRefine((r, ctx) => {
    const names = [...r.path.matchAll(/\{([^{}]*)\}/g)].map((m) => m[1]!);
    for (const name of names) {
      if (!(RECONCILE_VARIABLES as readonly string[]).includes(name))
        ctx.addIssue({ code: 'custom', path: ['path'], message: `unknown variable {${name}}: one of ${RECONCILE_VARIABLES.map((v) => `{${v}}`).join(', ')}` });
    }
    // {key} names the command; {request_id} is the gateway's request id of the attempt last sent
    // (kept with its record, sent upstream as X-Request-Id): either identifies it. A record that
    // keeps no request id (written before it was kept) is not asked about (DESIGN §3.12).
    if (!names.includes('key') && !names.includes('request_id'))
      ctx.addIssue({
        code: 'custom',
        path: ['path'],
        message:
          "names no variable that identifies the command: include {key} (the Idempotency-Key) or {request_id} (the gateway's request id of the attempt), or the upstream's answer could be about another request",
      });
  });

/** A value a marker compares with: a JSON scalar. */
const MarkerValue = z.union([z.string(), z.number(), z.boolean(), z.null()]);

/** A test on a status tool's result: the value at `pointer` (into the CallToolResult, e.g. "/structuredContent/status") equals `equals`. */
const ResultMarker = z.strictObject({ pointer: JsonPointer, equals: MarkerValue });

/** The variables an mcp `reconcile.arguments` string may name: substituted as they are (no encoding). */
export const MCP_RECONCILE_VARIABLES = ['key', 'entity', 'fence'] as const;

/**
 * An mcp route's status query (DESIGN §3.12, docs/mcp.md "Reconciling a lost
 * answer"): a `tools/call` of a status tool of the same server, whose
 * `arguments` name the command by its key. What its result means
 * (../http/mcp/reconcile.ts): `notFound` matching → not found (trusted only
 * as on plain routes); else `isError` not true, `structuredContent` an
 * object and `found` (when given) matching → found, the result stored as the
 * call's answer; anything else settles nothing.
 */
export const McpReconcileSchema = z
  .strictObject({
    /** The status tool: it must only read (it is called by the gateway, with no fence or key). */
    tool: z.string().min(1).max(256),
    /** The status tool's arguments; every string value may name {key}, {entity}, {fence}. */
    arguments: z.record(z.string(), z.unknown()).default({}),
    /** When the result says the command is unknown to the server. */
    notFound: ResultMarker,
    /** When the result says the command was performed (besides isError not true and structuredContent an object); absent: any such result. */
    found: ResultMarker.optional(),
    headers: z.record(HeaderName, UpstreamHeader).default({}),
    settleTime: Duration.prefault('30s'),
    interval: Duration.prefault('10s').pipe(z.number().min(100, 'must be at least 100ms')),
    maxAge: Duration.prefault('24h'),
    concurrency: z.number().int().min(1).max(64).default(4),
  })
  .superRefine((r, ctx) => {
    const names: string[] = [];
    const walk = (v: unknown): void => {
      if (typeof v === 'string') for (const m of v.matchAll(/\{([^{}]*)\}/g)) names.push(m[1]!);
      else if (Array.isArray(v)) v.forEach(walk);
      else if (v !== null && typeof v === 'object') Object.values(v).forEach(walk);
    };
    walk(r.arguments);
    for (const name of names)
      if (!(MCP_RECONCILE_VARIABLES as readonly string[]).includes(name))
        ctx.addIssue({
          code: 'custom',
          path: ['arguments'],
          message: `unknown variable {${name}}: one of ${MCP_RECONCILE_VARIABLES.map((v) => `{${v}}`).join(', ')}`,
        });
    if (!names.includes('key'))
      ctx.addIssue({
        code: 'custom',
        path: ['arguments'],
        message: 'names no {key}: the status tool must be asked about the command by its idempotency key, or its answer could be about another call',
      });
  });

/** What a route with `reconcile` may not be (called from ConfigSchema's checks): the field and why, or null. */
export function reconcileConflict(
  route: {
    reconcile?: unknown;
    protocol: string;
    onUnknown: string;
    idempotency: string;
    keyScope?: unknown;
    credentialBinding?: string;
    credentialHeaders?: readonly string[];
  },
  authConfigured = false,
): [field: string, message: string] | null {
  if (route.reconcile === undefined) return null;
  // The status query names the command by its key (and entity, fence) and
  // carries reconcile.headers, one account's credentials: where the key's
  // record belongs to a caller, a tenant or a credential (auth, keyScope,
  // a credential-scoped binding, credentialHeaders the upstream tells
  // accounts apart by), another's command under the same key would be
  // found for it (or not found in the wrong account), DESIGN §3.12.
  if (authConfigured || route.keyScope !== undefined || route.credentialBinding === 'scope' || (route.credentialHeaders?.length ?? 0) > 0) {
    return [
      'reconcile',
      'not available where idempotency keys are scoped by caller, tenant or credentials (auth, keyScope, credentialBinding "scope", credentialHeaders): the status query names the command by its key alone, so it could find another caller\'s command',
    ];
  }
  const form = typeof route.reconcile === 'object' && route.reconcile !== null && 'tool' in route.reconcile ? 'mcp' : 'http';
  if (route.protocol === 'mcp' && form === 'http')
    return ['reconcile', 'an mcp route asks a status tool: { "tool", "arguments" naming {key}, "notFound": { "pointer", "equals" } }, not a path'];
  if (route.protocol !== 'mcp' && form === 'mcp') return ['reconcile', 'a status tool ("tool") is for an mcp route; a plain route has a status path ("path")'];
  // An upstream that honours Idempotency-Key is its own reconciliation (the not-found rule would
  // hold: it is measured from each attempt's own lock end, a takeover's included, DESIGN §3.12).
  if (route.onUnknown === 'retry')
    return ['reconcile', 'does not go with onUnknown "retry": a retry that the upstream deduplicates by its Idempotency-Key is already the reconciliation'];
  if (route.idempotency === 'off') return ['reconcile', 'needs idempotency: without a key there is no record to reconcile'];
  return null;
}

// ── long calls and async replies (DESIGN §3.6 "Long calls", §3.12 "Async replies") ──

/** `timeoutMs` without `longCall`: the record lock is the whole call, so it stays short. */
export const PLAIN_MAX_TIMEOUT_MS = 600_000;
/** `timeoutMs` with `longCall`: a day. */
export const LONG_CALL_MAX_TIMEOUT_MS = 86_400_000;

/**
 * A route whose upstream calls last minutes to hours (../http/pipeline/lock-keeper.ts):
 * the admission locks the record for `lockWindow` only, and while the
 * request is on its way and the upstream holds the connection the gateway
 * extends the lock (store `extendLock`) every `renewEvery`, to `lockWindow`
 * past the database's now. A gateway that dies stops renewing, so its record
 * turns outcome_unknown within one window instead of after the whole timeout.
 */
export const LongCallSchema = z
  .strictObject({
    lockWindow: Duration.prefault('60s').pipe(z.number().min(100, 'must be at least 100ms').max(PLAIN_MAX_TIMEOUT_MS, 'must be at most 10m')),
    /** Default: a third of `lockWindow`. */
    renewEvery: Duration.pipe(z.number().min(50, 'must be at least 50ms')).optional(),
  })
  .transform((l) => ({ lockWindow: l.lockWindow, renewEvery: l.renewEvery ?? Math.floor(l.lockWindow / 3) }))
  .refine((l) => l.renewEvery * 2 <= l.lockWindow, {
    path: ['renewEvery'],
    message: 'must be at most half of lockWindow: one renewal may fail and the next must still land before the lock ends',
  });

/**
 * The async request-reply pattern (../http/pipeline/async-reply.ts): a `202
 * Accepted` with a `Location` on the upstream's own origin is an interim
 * answer; the record stays outcome_unknown keeping it, and the gateway
 * polls the Location until a final answer, which completes the record.
 */
export const AsyncReplySchema = z.strictObject({
  /** The background reconciler's first back-off per record, doubled after each poll that settled nothing, up to `maxInterval`. */
  interval: Duration.prefault('5s').pipe(z.number().min(100, 'must be at least 100ms')),
  maxInterval: Duration.prefault('5m').pipe(z.number().min(100, 'must be at least 100ms')),
  /** Past this age (since admission) the record is no longer polled, and its interim answer no longer replayed: the operator's. */
  maxAge: Duration.prefault('24h').pipe(z.number().min(1_000, 'must be at least 1s')),
  /** Polls the background reconciler runs at once for this route. */
  concurrency: z.number().int().min(1).max(64).default(4),
  /**
   * A status monitor that answers 200 while the job runs (`{"status": "InProgress"}`):
   * a 2xx JSON answer whose value at `pointer` equals `equals` is still pending, not the outcome.
   */
  pending: ResultMarker.optional(),
});

/** What a route with `longCall` or `asyncReply` may not be (called from ConfigSchema's checks): the field and why, or null. */
export function longCallConflict(route: {
  protocol: string;
  idempotency: string;
  timeoutMs: number;
  lockMarginMs: number;
  longCall?: { lockWindow: number } | undefined;
  asyncReply?: unknown;
  onUnknown: string;
}): [field: string, message: string] | null {
  if (route.longCall === undefined && route.timeoutMs > PLAIN_MAX_TIMEOUT_MS)
    return [
      'timeoutMs',
      `over ${PLAIN_MAX_TIMEOUT_MS} (10m) needs "longCall": a lock as long as the call would keep a dead gateway's record in progress for as long`,
    ];
  if (route.longCall !== undefined) {
    // The pause check keeps max(25, min(250, lockMarginMs / 2)) off the lock's end and wants half a window left (../http/lock-budget.ts).
    const safety = Math.max(25, Math.min(250, route.lockMarginMs / 2));
    if (route.longCall.lockWindow <= 2 * safety)
      return ['longCall', `lockWindow must be over twice the pause check's margin (${safety} ms from lockMarginMs): no request could ever be sent`];
    if (route.protocol === 'mcp') return ['longCall', 'not available on an mcp route: only plain HTTP routes renew their lock'];
    if (route.idempotency === 'off') return ['longCall', 'needs idempotency: without a key there is no record whose lock to renew'];
  }
  if (route.asyncReply !== undefined) {
    if (route.protocol === 'mcp')
      return ['asyncReply', 'not available on an mcp route: only plain HTTP routes take a 202 with a Location as an interim answer'];
    if (route.idempotency === 'off') return ['asyncReply', 'needs idempotency: without a key there is no record to keep the interim answer in'];
    if (route.onUnknown === 'retry')
      return ['asyncReply', 'does not go with onUnknown "retry": a retry would take the pending record over and send the command again'];
  }
  return null;
}

export const RouteSchema = z.strictObject({
  /** Unique; scopes idempotency keys and labels logs and metrics. */
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'must be 1-64 letters, digits, "_", "." or "-"'),
  match: z.strictObject({
    /** `/payments/*` (prefix), `/invoices/:invoice/pay` (one segment per parameter). */
    path: z
      .string()
      .regex(/^\/[^?#\s]*$/, 'must start with "/" and contain no query, fragment or space')
      .refine((p) => !p.slice(0, -1).includes('*'), 'may only end with "*"'),
    methods: z.array(z.enum(METHODS)).min(1).default(['POST', 'PUT', 'PATCH', 'DELETE']),
  }),
  /**
   * Base URL; the request's path and query are appended to it. A query or a
   * fragment here would swallow them (`http://up?x=1` + `/pay` is `/?x=1/pay`).
   */
  upstream: envCapable(
    z
      .url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' })
      .refine((u) => !/[?#]/.test(u), 'must be a base URL without a query or fragment: the request path and query are appended to it'),
  ),
  /** TLS towards an `https://` upstream: a CA, a client certificate (mTLS). Read once at start-up. */
  tls: UpstreamTlsSchema.optional(),
  entity: Entity.default({ header: 'X-Fence-Entity' }),
  fence: z.enum(['required', 'optional', 'off']).default('required'),
  fenceHeader: HeaderName.default('X-Execution-Fence'),
  idempotency: z.enum(['required', 'optional', 'off']).default('required'),
  idempotencyHeader: HeaderName.default('Idempotency-Key'),
  mode: z.enum(['serial', 'concurrent']).default('serial'),
  /** Bound on the whole upstream exchange, response body included. Over 10 minutes only with `longCall` (LONG_CALL_MAX_TIMEOUT_MS). */
  timeoutMs: ms(LONG_CALL_MAX_TIMEOUT_MS).min(1).default(10_000),
  /** The record lock is `timeoutMs + lockMarginMs`: long enough to outlive any live attempt. */
  lockMarginMs: ms(600_000).default(2_000),
  /** Serial mode: how long a request waits for the entity's in-flight request before 409 entity-busy. */
  serialWaitMs: ms(600_000).default(5_000),
  /** Cap on `Prefer: wait=N` for a key in progress. */
  maxWaitMs: ms(600_000).default(10_000),
  maxBodyBytes: z
    .number()
    .int()
    .min(0)
    .max(100 * 1024 * 1024)
    .default(1024 * 1024),
  /**
   * Most bytes of an upstream answer read and stored: every answer is held in
   * memory while it is read and kept in the store for `retention` to be
   * replayed. Past it the gateway stops reading and answers 502
   * `upstream-response-too-large` to the caller and to every retry.
   */
  maxResponseBytes: z
    .number()
    .int()
    .min(0)
    .max(100 * 1024 * 1024)
    .default(1024 * 1024),
  retention: Duration.prefault('24h'),
  onUnknown: z.enum(['reject', 'retry']).default('reject'),
  upstreamHeaders: z.record(HeaderName, UpstreamHeader).default({}),
  /** Request headers never forwarded (besides hop-by-hop ones and the gateway's own credentials). */
  stripHeaders: z.array(HeaderName).default([]),
  /**
   * Path and method overrides this route's upstream may get (by default the
   * headers are not forwarded and a `_method` query or POST body field is 400): any of
   * OVERRIDE_FIELDS, compared without regard to case (DESIGN §3.6).
   */
  allowOverrides: z
    .array(
      z.string().refine((n) => OVERRIDE_FIELDS.some((f) => f.toLowerCase() === n.toLowerCase()), { message: `must be one of ${OVERRIDE_FIELDS.join(', ')}` }),
    )
    .default([]),
  replayHeaders: z
    .array(HeaderName)
    .default(DEFAULT_REPLAY_HEADERS)
    .refine((hs) => !hs.some((h) => h.toLowerCase() === 'set-cookie'), 'may not contain set-cookie'),
  /** Upstream statuses that mean "not processed": the record is released, not stored. */
  releaseStatuses: z.array(z.number().int().min(100).max(599)).default([429, 503]),
  errors: z.enum(['problem', 'stripe']).default('problem'),
  /** `mcp`: an MCP Streamable HTTP endpoint; only `tools/call` is decided (docs/mcp.md). */
  protocol: z.enum(['http', 'mcp']).default('http'),
  /** `mcp` routes: per-tool policy by tool name, `"*"` for every tool not named. */
  tools: z.record(z.string().min(1).max(256), McpToolSchema).default({}),
  /** `mcp` routes: which tools agents may call and are shown in `tools/list` answers. */
  toolAccess: ToolAccessSchema.optional(),
  /**
   * `mcp` routes: how long the gateway follows a task a call created (MCP
   * tasks, docs/mcp.md "Tasks"), keeping its record and serial slot, and the
   * bound on a `tasks/result` that passes (it blocks until the task ends).
   */
  taskTimeoutMs: ms(86_400_000).min(1).default(3_600_000),
  /** Longest key accepted (400 invalid-idempotency-key past it). */
  maxKeyLength: z.number().int().min(1).max(MAX_KEY_LENGTH_LIMIT).default(DEFAULT_MAX_KEY_LENGTH),
  /** Where the key is read when the request has no key header: a JSON pointer into the body. */
  idempotencyKeyFrom: z.strictObject({ json: JsonPointer }).optional(),
  /** What of the body the fingerprint covers: all its bytes (`raw`), some JSON fields, or all but some. */
  fingerprint: z
    .union([z.literal('raw'), z.strictObject({ json: z.array(JsonPointer).min(1) }), z.strictObject({ ignore: z.array(JsonPointer) })])
    .default('raw'),
  /**
   * Keys are per route (and caller); this adds one more part to their scope:
   * a header's value, or a claim of the caller's verified bearer token (a
   * top-level claim name, e.g. a tenant id `tid`; needs `auth`).
   */
  keyScope: z.union([z.strictObject({ header: HeaderName }), z.strictObject({ claim: ClaimName })]).optional(),
  /** Send the key back in the key header on first and replayed answers. */
  echoKey: z.boolean().default(false),
  /**
   * Request headers that carry the caller's credentials to the upstream
   * (`x-api-key`), besides `Authorization`: a keyed hash of their values
   * binds the key's record (`credentialBinding`), so callers the upstream
   * tells apart are never handed each other's stored answer
   * (../http/key-scope.ts, DESIGN §2 G2).
   */
  credentialHeaders: z.array(HeaderName).max(16).default([]),
  /**
   * Where that hash goes. `fingerprint` (default): into the request
   * fingerprint, so a record answers only the credentials that made it and
   * a request under its key with others (a refreshed token, another
   * worker's, none) is 422, never a second execution. `scope`: into the key
   * scope, each credential set its own key space (as Stripe scopes keys per
   * API key), for credentials that never change between a command's
   * attempts: with any other, a refreshed token's retry runs again.
   */
  credentialBinding: z.enum(['fingerprint', 'scope']).default('fingerprint'),
  /** The status query for a record whose outcome is unknown (ReconcileSchema above). Absent: an operator resolves it. */
  reconcile: z.union([ReconcileSchema, McpReconcileSchema]).optional(),
  /** Calls of minutes to hours: a short record lock renewed while the upstream holds the connection (LongCallSchema above). */
  longCall: LongCallSchema.optional(),
  /** The async request-reply pattern: a 202 with a Location is an interim answer, polled until final (AsyncReplySchema above). */
  asyncReply: AsyncReplySchema.optional(),
});

const StoreSchema = z.union([
  z.strictObject({ sqlite: z.string().min(1), synchronous: z.enum(['FULL', 'NORMAL']).default('FULL') }),
  z.strictObject({
    postgres: envCapable(z.string().min(1)),
    poolSize: z.number().int().min(1).max(1000).default(10),
    /** Client-side bound of each round trip to the database (docs/deploy-postgres.md §6). */
    queryTimeout: Duration.prefault(DEFAULT_QUERY_TIMEOUT_MS).pipe(z.number().min(100, 'must be at least 100ms')),
    /** The tables' schema (created if missing); instead of `options=-c search_path=…` in the URL, which PgBouncer refuses. */
    schema: z.string().min(1).max(63).optional(),
    /** `transaction` behind a transaction-pooling PgBouncer (docs/deploy-postgres.md "Through PgBouncer"). */
    pooler: z.enum(['session', 'transaction']).optional(),
    /** A direct (or session-pooled) URL for the LISTEN connection, with `pooler: "transaction"`. */
    listenUrl: envCapable(z.string().min(1)).optional(),
  }),
  z.strictObject({ d1: z.string().min(1) }),
]);

const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be an environment variable name');

/**
 * Verification keys (auth tokens, signed fences): an HS256 secret, SPKI PEM
 * public keys (ES256, EdDSA, RS256), and/or a local JWKS. Files are read once
 * at start-up by the Node entry, relative to the working directory.
 */
const KeySetFields = {
  /** HS256 shared secret: a literal of 32+ characters, or `{ "env": "VAR" }`. */
  secret: z.union([z.string().min(32, 'must be at least 32 characters (256 bits) for HS256'), z.strictObject({ env: EnvName })]).optional(),
  publicKeys: z
    .array(
      z
        .strictObject({
          alg: z.enum(['ES256', 'EdDSA', 'RS256']),
          kid: z.string().min(1).optional(),
          pem: z.string().min(1).optional(),
          file: z.string().min(1).optional(),
        })
        .refine((k) => (k.pem === undefined) !== (k.file === undefined), 'needs exactly one of "pem" or "file"'),
    )
    .min(1)
    .optional(),
  jwks: z.object({ keys: z.array(z.record(z.string(), z.unknown())).min(1) }).optional(),
  jwksFile: z.string().min(1).optional(),
};
const hasKey = (k: { secret?: unknown; publicKeys?: unknown; jwks?: unknown; jwksFile?: unknown }) =>
  k.secret !== undefined || k.publicKeys !== undefined || k.jwks !== undefined || k.jwksFile !== undefined;
const NO_KEY = 'needs a key: "secret", "publicKeys", "jwks" or "jwksFile"';
const Audience = z.union([z.string().min(1), z.array(z.string().min(1)).min(1)]);

/**
 * OAuth protected resource metadata (RFC 9728, docs/auth-audit.md
 * "Protected resource metadata"): the gateway's resource identifier, an
 * absolute URL with no query, fragment or trailing slash (its path is
 * where the metadata is served, RFC 9728 §3.1), and the authorization
 * servers that issue its tokens.
 */
const ResourceUrl = z
  .url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' })
  .refine((u) => !/[?#]/.test(u), 'must have no query or fragment (RFC 9728 §1.2, RFC 8707 §2)')
  .refine(
    (u) => new URL(u).pathname === '/' || !new URL(u).pathname.endsWith('/'),
    'must not end with "/" (except the bare origin): the metadata path is formed from it',
  );
const ResourceFields = {
  /** The resource identifier: published as `resource`, and the `aud` tokens must carry. */
  resource: ResourceUrl.optional(),
  /** `authorization_servers` of the metadata: the issuers' identifiers. Default: the `issuer` values that are URLs. */
  authorizationServers: z
    .array(z.url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' }))
    .min(1)
    .optional(),
  /** `resource_name` of the metadata, shown to the user by clients. */
  resourceName: z.string().min(1).max(256).optional(),
};
const listOf = (v: string | string[] | undefined): string[] => (v === undefined ? [] : Array.isArray(v) ? v : [v]);
const isHttpUrl = (v: string) => /^https?:\/\/[^/]/.test(v) && URL.canParse(v);

/** Caller authentication (bearer JWTs). Absent: no auth, admin API on loopback only. */
export const AuthSchema = z
  .strictObject({
    ...KeySetFields,
    issuer: Audience,
    /** The `aud` a token must carry (one of). Default, with `resource`: the resource identifier. */
    audience: Audience.optional(),
    /** Clock skew accepted on `exp` / `nbf`. */
    clockTolerance: Duration.prefault('5s'),
    /** The claim that names the caller (rejection log, idempotency scope). */
    callerClaim: z.string().min(1).default('sub'),
    ...ResourceFields,
  })
  .refine(hasKey, NO_KEY)
  .superRefine((a, ctx) => {
    if (a.audience === undefined && a.resource === undefined)
      ctx.addIssue({ code: 'custom', path: ['audience'], message: 'is required (or "resource", whose identifier is then the audience)' });
    // MCP authorization: a token must have been issued for this resource (RFC 8707), so its identifier is an audience the gateway accepts.
    if (a.resource !== undefined && a.audience !== undefined && !listOf(a.audience).includes(a.resource)) {
      ctx.addIssue({
        code: 'custom',
        path: ['audience'],
        message: `must include the resource "${a.resource}": clients ask for tokens for it (RFC 8707) and the gateway must accept them, or leave audience out`,
      });
    }
    if (a.resource !== undefined && a.authorizationServers === undefined && !listOf(a.issuer).some(isHttpUrl)) {
      ctx.addIssue({
        code: 'custom',
        path: ['authorizationServers'],
        message: 'is required with "resource" when no issuer is an http(s) URL: the metadata must name the authorization servers (MCP authorization)',
      });
    }
  })
  .transform(({ audience, authorizationServers, ...a }) => ({
    ...a,
    audience: audience ?? a.resource!,
    ...(a.resource !== undefined
      ? { authorizationServers: authorizationServers ?? listOf(a.issuer).filter(isHttpUrl) }
      : authorizationServers !== undefined
        ? { authorizationServers }
        : {}),
  }));

/** Signed fences (DESIGN §7): the fence header must be a JWS minted with these keys. */
export const SignedFenceSchema = z
  .strictObject({
    ...KeySetFields,
    /** Required `iss` claim, if the signer sets one. */
    issuer: z.string().min(1).optional(),
    /** Clock skew accepted on `exp`; the signer's grace is the usual place for it. */
    clockTolerance: Duration.prefault('0s'),
  })
  .refine(hasKey, NO_KEY);

export const ConfigSchema = z
  .strictObject({
    /** The JSON Schema an editor checks the file against (examples/fencegate.schema.json); ignored. */
    $schema: z.string().optional(),
    listen: z.strictObject({ host: z.string().min(1).default('127.0.0.1'), port: z.number().int().min(0).max(65535).default(8080) }).prefault({}),
    store: StoreSchema.prefault({ sqlite: './fencegate.db' }),
    adminPrefix: z
      .string()
      .regex(/^(\/[A-Za-z0-9_.~-]+)+$/, 'must be a path such as "/_fencegate" (no trailing slash)')
      .default('/_fencegate'),
    /**
     * Node entry: most client connections open at once (`server.maxConnections`);
     * one more is closed at once, before a byte of it is read. Bounds sockets
     * and file descriptors (about 10 KB of memory each when idle); ignored on Workers.
     */
    maxConnections: z.number().int().min(1).max(1_000_000).default(10_000),
    /**
     * Node entry: the longest SIGTERM/SIGINT's drain may take (in-flight
     * requests, the finishes still pending, the store's close); past it what
     * was not written is logged and the process exits (docs/deploy-postgres.md §4).
     */
    drainTimeout: Duration.prefault('30s'),
    /**
     * Node entry: how long an answer may sit unsent because the client takes
     * none of it (it stopped reading, with or without a FIN) before its
     * connection is destroyed. Each answer is held in memory until written,
     * and nothing else times a connection out once its request is in, so
     * without this a client that never reads would hold a socket and its
     * answer (up to `maxResponseBytes`) for ever. At least 1s; ignored on Workers.
     */
    writeStallTimeout: Duration.prefault('30s').refine((ms) => ms >= 1000, { message: 'must be at least 1s' }),
    /** How often expired records and old rejections are swept. */
    sweepInterval: Duration.prefault('60s'),
    rejectionRetention: Duration.prefault('90d'),
    /**
     * How long an entity's fence is remembered after it was last accepted
     * (and fence history rows are kept). Forgetting a fence re-opens the
     * entity to every holder of an older token, so this must exceed the
     * longest time a stale holder can come back (docs/configuration.md,
     * "Retention and the sweeper"): long
     * by default, and never below an hour.
     */
    entityRetention: Duration.prefault('90d').pipe(z.number().min(3_600_000, 'must be at least 1h: forgetting a fence re-opens the entity to older tokens')),
    /** How long the operator-action log keeps a row: over a year, for yearly audits. */
    operatorActionRetention: Duration.prefault('400d'),
    /**
     * How long the command log (DESIGN §4.1 `commands`: one row per outcome
     * of every request the gateway decided on) keeps a row. It grows with the
     * traffic, one row a request, so shorter than the rejection log by default.
     */
    commandRetention: Duration.prefault('30d'),
    /** Base of problem `type` URIs; default `<adminPrefix>/problems/`, served by the gateway. */
    problemTypeBase: z.string().min(1).optional(),
    auth: AuthSchema.optional(),
    /**
     * The HMAC key of the credential hashes in fingerprints and key scopes (../http/key-scope.ts):
     * 32+ characters, or `{ env }`. Without it the hash is an unkeyed,
     * domain-separated SHA-256, which lets a reader of the table confirm a
     * guessed low-entropy credential.
     */
    credentialHashKey: z.union([z.string().min(32, 'must be at least 32 characters (256 bits)'), z.strictObject({ env: EnvName })]).optional(),
    fence: z
      .strictObject({
        signed: SignedFenceSchema.optional(),
        /**
         * Whose fences an entity's fence is: `global` (everyone's, DESIGN §2)
         * or `caller` (each authenticated caller has its own fence per
         * entity, so no caller's fence can lock another caller's entity;
         * callers are then not fenced against each other).
         */
        entityScope: z.enum(['global', 'caller']).default('global'),
      })
      .prefault({}),
    /** `<adminPrefix>/metrics`: Prometheus text; audit scope (or loopback without auth) unless public. */
    metrics: z.strictObject({ enabled: z.boolean().default(true), public: z.boolean().default(false) }).prefault({}),
    routes: z.array(z.preprocess(mcpMethodDefaults, RouteSchema)).min(1),
  })
  .superRefine((config, ctx) => {
    const seen = new Set<string>();
    const metadataPath = config.auth?.resource === undefined ? null : resourceMetadataPath(config.auth.resource);
    if (metadataPath !== null && (metadataPath === config.adminPrefix || metadataPath.startsWith(`${config.adminPrefix}/`))) {
      ctx.addIssue({
        code: 'custom',
        path: ['adminPrefix'],
        message: `holds the protected resource metadata path ${metadataPath} of auth.resource; choose another prefix`,
      });
    }
    config.routes.forEach((route, i) => {
      if (seen.has(route.name)) ctx.addIssue({ code: 'custom', path: ['routes', i, 'name'], message: `duplicate route name "${route.name}"` });
      seen.add(route.name);
      if ('path' in route.entity && !route.match.path.split('/').includes(route.entity.path)) {
        ctx.addIssue({
          code: 'custom',
          path: ['routes', i, 'entity', 'path'],
          message: `"${route.entity.path}" is not a parameter of match.path "${route.match.path}"`,
        });
      }
      const collision = { auth: config.auth !== undefined };
      const keyHeader = keyHeaderCollision(route, collision);
      if (keyHeader !== null) ctx.addIssue({ code: 'custom', path: ['routes', i, 'idempotencyHeader'], message: keyHeader });
      const scopeHeader = keyScopeCollision(route, collision);
      if (scopeHeader !== null) ctx.addIssue({ code: 'custom', path: ['routes', i, 'keyScope', 'header'], message: scopeHeader });
      if (route.keyScope !== undefined && 'claim' in route.keyScope && config.auth === undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['routes', i, 'keyScope', 'claim'],
          message: 'a claim scope needs "auth": without caller authentication there is no verified token to read the claim from',
        });
      }
      route.credentialHeaders.forEach((header, j) => {
        const why = credentialHeaderCollision(route, header, collision);
        if (why !== null)
          ctx.addIssue({
            code: 'custom',
            path: ['routes', i, 'credentialHeaders', j],
            message: `${why}: keys are scoped by the credentials the upstream sees`,
          });
      });
      const echoed = echoKeyCollision(route);
      if (echoed !== null) ctx.addIssue({ code: 'custom', path: ['routes', i, 'echoKey'], message: echoed });
      if (route.protocol === 'mcp') {
        // An MCP route reads its key from the JSON-RPC message and fingerprints the tool call (docs/mcp.md): these would be silently unused.
        const unused = {
          keyScope: route.keyScope !== undefined,
          fingerprint: route.fingerprint !== 'raw',
          idempotencyKeyFrom: route.idempotencyKeyFrom !== undefined,
          echoKey: route.echoKey,
        };
        for (const [field, set] of Object.entries(unused)) {
          if (set)
            ctx.addIssue({
              code: 'custom',
              path: ['routes', i, field],
              message: `does not apply to an mcp route ("protocol": "mcp"): its key comes from the header or the call's _meta and its fingerprint covers the tool name and arguments (docs/mcp.md); remove it`,
            });
        }
      }
      if (route.protocol !== 'mcp' && Object.keys(route.tools).length > 0) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'tools'], message: 'only an mcp route ("protocol": "mcp") has tools' });
      }
      if (route.protocol !== 'mcp' && route.toolAccess !== undefined) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'toolAccess'], message: 'only an mcp route ("protocol": "mcp") has tools to allow or deny' });
      }
      // Streamable HTTP has POST, GET and DELETE only; any other method would pass through undecided (docs/mcp.md).
      const foreign = route.protocol === 'mcp' ? route.match.methods.filter((m) => m !== 'POST' && m !== 'GET' && m !== 'DELETE') : [];
      if (foreign.length > 0) {
        ctx.addIssue({
          code: 'custom',
          path: ['routes', i, 'match', 'methods'],
          message: `an mcp route takes only POST, GET and DELETE (not ${foreign.join(', ')})`,
        });
      }
      if (route.tls !== undefined && !route.upstream.startsWith('https:')) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'tls'], message: 'applies only to an https:// upstream' });
      }
      const reconcile = reconcileConflict(route, config.auth !== undefined);
      if (reconcile !== null) ctx.addIssue({ code: 'custom', path: ['routes', i, reconcile[0]], message: reconcile[1] });
      const long = longCallConflict(route);
      if (long !== null) ctx.addIssue({ code: 'custom', path: ['routes', i, long[0]], message: long[1] });
      if (route.match.path.startsWith(`${config.adminPrefix}/`) || route.match.path === config.adminPrefix) {
        ctx.addIssue({ code: 'custom', path: ['routes', i, 'match', 'path'], message: `overlaps the admin prefix ${config.adminPrefix}` });
      }
      // The metadata path is the gateway's own, never proxied: a route written for it would never see a request (a `/*` route may cover it).
      if (metadataPath !== null && route.match.path === metadataPath) {
        ctx.addIssue({
          code: 'custom',
          path: ['routes', i, 'match', 'path'],
          message: `is where the gateway serves the protected resource metadata of auth.resource (RFC 9728); it is never proxied`,
        });
      }
    });
    // undici pools connections per origin, so an origin's TLS is one setting (../http/forward-undici.ts upstreamTlsOf).
    const tlsByOrigin = new Map<string, { route: number; tls: string }>();
    config.routes.forEach((route, i) => {
      if (!URL.canParse(route.upstream)) return;
      const origin = new URL(route.upstream).origin;
      const tls = JSON.stringify(route.tls ?? null);
      const seen = tlsByOrigin.get(origin);
      if (seen === undefined) tlsByOrigin.set(origin, { route: i, tls });
      else if (seen.tls !== tls)
        ctx.addIssue({
          code: 'custom',
          path: ['routes', i, 'tls'],
          message: `differs from routes[${seen.route}].tls for the same upstream origin ${origin}: connections to one origin share one TLS setting`,
        });
    });
    if (config.fence.entityScope === 'caller' && config.auth === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['fence', 'entityScope'],
        message: '"caller" needs "auth": without caller authentication there is no caller to scope by',
      });
    }
  });

export type Config = z.output<typeof ConfigSchema>;
export type ConfigInput = z.input<typeof ConfigSchema>;
export type RouteConfig = z.output<typeof RouteSchema>;
export type ReconcileConfig = z.output<typeof ReconcileSchema>;
export type LongCallConfig = z.output<typeof LongCallSchema>;
export type AsyncReplyConfig = z.output<typeof AsyncReplySchema>;
export type McpReconcileConfig = z.output<typeof McpReconcileSchema>;
export type AuthConfig = z.output<typeof AuthSchema>;
export type SignedFenceConfig = z.output<typeof SignedFenceSchema>;
