import type { RouteConfig } from '../../config/schema.js';
import type { AuditInfo } from '../../store/types.js';
import type { Inbound } from '../inbound.js';
import type { RequestSpan } from '../tracing.js';

/**
 * One proxied request on its way through the stages (./index.ts), whatever
 * its protocol. Each stage reads what the earlier ones set and adds its own
 * part. Written again later: `route`, which an mcp call replaces with the
 * route under its tool's policy, and the log line's `upstream_ms`, which a
 * streamed answer's reader sets once more at the stream's end.
 */
export interface Exchange {
  readonly req: Inbound;
  /** `performance.now()` when the request arrived. */
  readonly started: number;
  /** The gateway's own id, always fresh (../request-id.ts). */
  readonly requestId: string;
  /** The caller's `X-Request-Id`, when it sent a well-formed one. */
  readonly clientRequestId: string | null;
  /** The path in normal form (../path.ts): routed, fingerprinted and forwarded. */
  readonly pathname: string;
  /** The query as sent: forwarded and fingerprinted, never logged or stored. */
  readonly search: string;
  /** The decision log line so far (DESIGN §3.11: ids, codes, durations; no bodies). */
  readonly trace: Trace;
  readonly span: RequestSpan;
  /** Stage 1: the matched route (a tool's policy merged in once an mcp call is read), and its path parameters. */
  route: RouteConfig | null;
  params: Record<string, string>;
  /** Stage 2: the authenticated caller and the claims a route's keyScope reads; null without auth. */
  caller: string | null;
  claims: Readonly<Record<string, string>> | null;
  /** Stage 4: sha256 of the body, '' until it is read (the rejection log's payload hash). */
  payloadSha256: string;
  /** Stage 7: `performance.now()` when the upstream request was started (0 before). */
  upstreamStarted: number;
  /** Stage 7: where a decided request went and with which headers (an mcp task call's follow-up requests go the same way, ../mcp/tasks.ts). */
  sent?: { url: string; headers: Record<string, string> };
  /** An mcp call's tool: in every rejection row of the call (DESIGN §4) and, bounded, in the metrics. */
  tool: { name: string; label: string } | null;
  /** Set by the reconcile stage (./reconcile.ts) when its status query said "not found" too soon: how long, by this process's clock, until it would be trusted. */
  reconcileTrustedInMs?: number;
}

/** The per-decision log line (DESIGN §3.11). The field order is the line's. */
export interface Trace {
  request_id: string;
  /** The caller's X-Request-Id, when it sent a well-formed one. */
  client_request_id?: string;
  route: string | null;
  method: string;
  path: string;
  entity?: string | null;
  fence?: string | null;
  idempotency_key?: string | null;
  tool?: string;
  read_only?: string;
  /** A status query's result (./reconcile.ts), when one was asked. */
  reconcile?: string;
  decision?: string;
  status?: number;
  upstream_ms?: number;
  /** An mcp call whose stream the server closed before the answer: how often the gateway resumed it (../mcp/resume.ts). */
  resumes?: number;
  total_ms?: number;
}

/** What the audit trail keeps of this request (ids and hashes, never bodies). */
export function auditOf(x: Exchange): AuditInfo {
  const audit: AuditInfo = {
    requestId: x.requestId,
    clientRequestId: x.clientRequestId,
    caller: x.caller,
    method: x.req.method,
    path: x.pathname,
    payloadSha256: x.payloadSha256,
  };
  if (x.tool !== null) audit.tool = x.tool.name;
  return audit;
}

/** Milliseconds to two decimals, as the log line and the metrics carry them. */
export function roundMs(ms: number): number {
  return Math.round(ms * 100) / 100;
}
