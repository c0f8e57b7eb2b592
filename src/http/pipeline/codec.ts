import type { Refusal } from '../../protocol/problem.js';
import type { Command as HeaderCommand } from '../command.js';
import type { FinishInput, StoredResponse } from '../../store/types.js';
import type { StreamedAnswer, UpstreamResult } from '../forward.js';
import type { Reply } from '../inbound.js';
import type { Exchange } from './exchange.js';

/**
 * What a protocol is to the pipeline (./index.ts): how a request becomes a
 * command, what of it the fingerprint covers, how a refusal and a stored
 * answer are rendered, and what an upstream answer means for the record.
 * Plain HTTP (../plain/codec.ts) and MCP's JSON-RPC (../mcp/codec.ts) are
 * the two; the stages, the store and the observer are the same for both.
 *
 * `S` is the codec's own reading of one request (the parsed headers, the
 * JSON-RPC message), handed back to it at each later step.
 */
export interface Codec<S> {
  /** Stage 3, before the body: what the headers and path parameters say. */
  head(x: Exchange): { ok: true; state: S } | { ok: false; refusal: Refusal };
  /**
   * Stage 4, the body whole: the command to decide, a message to pass
   * undecided, or a refusal. `hash` sets `x.payloadSha256` (and returns it):
   * called once the body is a command's, whose audit rows carry it.
   */
  read(x: Exchange, state: S, body: Uint8Array, hash: () => string): Read<S>;
  /** A refusal as this protocol answers it (the request id is added here). `state` is null before stage 3 has read anything. */
  render(x: Exchange, refusal: Refusal, state: S | null): Reply;
  /** The value a refused request presented for `code`, for the rejection log (../refusal-log.ts). */
  presented(x: Exchange, code: string, state: S | null): unknown;
  /**
   * What the headers and path already said of the command, before its body
   * was read: for the command log's row of a `payload-too-large` (../command-log.ts).
   * Absent, or null: nothing is known without the body (an mcp call's `_meta`).
   */
  known?(state: S | null): { entity: string | null; fence: bigint | null; key: string | null } | null;
  /** Where the entity comes from, for the `missing-entity` refusal. */
  entitySource(x: Exchange): string;
  /** A stored answer replayed to a retry (G2). */
  replay(x: Exchange, stored: StoredResponse, state: S): Reply;
  /** The upstream request's headers, adjusted for the protocol (an mcp route reads its answers, so no content coding). */
  upstreamHeaders(headers: Record<string, string>): Record<string, string>;
  /** When the answer is handed on as it comes instead of read whole (an event stream); absent: always read whole. */
  streamIf?(status: number, headers: [string, string][]): boolean;
  /** Stage 8: what the upstream's answer means for the record and what the caller is told. */
  settle(x: Exchange, state: S, result: UpstreamResult | StreamedAnswer, base: Omit<FinishInput, 'outcome'>, timeoutMs: number): Settled | Streaming;
  /** The `admission-expired` refusal's detail: nothing was sent (DESIGN §3.6). */
  expiredDetail(lockMs: number): string;
  /** Extras of the `admission-expired` refusal besides the retry hint. */
  expiredExtras(command: Command): Record<string, unknown>;
}

/**
 * A command as the codec read it, and what the fingerprint covers of it
 * (DESIGN §3.4): the fence, key and entity (../command.ts `Command`, §3.3)
 * with the entity and key final once the body is read.
 */
export interface Command extends HeaderCommand {
  /** Appended to the key scope (an mcp call: per tool and endpoint). */
  scopeSuffix: string;
  /** The request as the fingerprint covers it, besides path, query, entity and credentials. */
  fingerprint: { method: string; contentType: string; bodyDigest: string };
}

export type Read<S> =
  | { kind: 'command'; state: S; command: Command }
  /** Forwarded undecided and never stored (an mcp route's messages other than a side-effecting tools/call). */
  | { kind: 'pass'; pass: Pass }
  | { kind: 'refused'; refusal: Refusal; state: S | null };

/** A message that passes undecided (./pass.ts): how it is forwarded and what its answers are rendered as. */
export interface Pass {
  decision: string;
  /** Answers the message without sending it (e.g. a GET event stream on a forwarder that cannot stream). */
  local?: Reply;
  /** The bound on its upstream exchange when not the route's `timeoutMs` (an mcp `tasks/result`, which blocks until its task ends). */
  timeoutMs?: number;
  streamIf(status: number, headers: [string, string][]): boolean;
  answer(result: UpstreamResult | StreamedAnswer): { reply: Reply; decision: string };
}

/** An outcome known once the answer is in: the finish to record and the caller's answer. */
export interface Settled {
  finish: FinishInput;
  reply: Reply;
  decision: string;
}

/**
 * An answer handed on as it comes: its head now, the outcome once its end
 * is read. `after` runs once the finish is recorded (the caller's last
 * event goes out only after the record is durable).
 */
export interface Streaming {
  head: Reply;
  ended: Promise<Settled & { after(): void }>;
  /** The stream failed before an outcome was read: close the caller's stream. */
  abort(): void;
}
