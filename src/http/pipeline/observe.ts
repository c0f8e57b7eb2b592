import type { Refusal } from '../../protocol/problem.js';
import type { GatewayStore } from '../../store/types.js';
import type { Reply } from '../inbound.js';
import type { Logger } from '../logger.js';
import type { RequestObservation } from '../metrics.js';
import { logRefusal } from '../refusal-log.js';
import { logCommandRefusal } from '../command-log.js';
import type { Config } from '../../config/schema.js';
import { setHeader } from './reply.js';
import { auditOf, roundMs, type Exchange } from './exchange.js';

/**
 * The one observer of a request's end (DESIGN §3.11): the `X-Request-Id`
 * answer header, the request span, the decision log line and the metrics,
 * once per request whatever stage answered it.
 */
export interface Observer {
  done(x: Exchange, reply: Reply, decision: string): Reply;
  /**
   * A refusal: written to the rejection log when its code is one the log
   * keeps (../refusal-log.ts), then answered as `render` renders it.
   */
  refuse(x: Exchange, refusal: Refusal, render: (r: Refusal) => Reply, presented: unknown): Promise<Reply>;
}

export function createObserver(deps: {
  store: GatewayStore;
  logger: Logger;
  observe?: ((o: RequestObservation) => void) | undefined;
  /** For the command log's rows of transient refusals (../command-log.ts); absent: none written. */
  config?: Pick<Config, 'fence'>;
}): Observer {
  const { logger } = deps;
  const done = (x: Exchange, reply: Reply, decision: string): Reply => {
    setHeader(reply, 'x-request-id', x.requestId);
    x.span.end(x.trace, decision, reply.status);
    const totalMs = roundMs(performance.now() - x.started);
    // The trace itself, completed: done runs once per request and nothing
    // reads the trace after it, so no copy (the same fields, in the same order).
    const line = x.trace;
    line.decision = decision;
    line.status = reply.status;
    line.total_ms = totalMs;
    logger.info('decision', line as unknown as Record<string, unknown>);
    deps.observe?.({
      route: line.route,
      decision,
      status: reply.status,
      totalMs,
      upstreamMs: line.upstream_ms,
      ...(x.tool !== null ? { tool: x.tool.label } : {}),
    });
    return reply;
  };
  return {
    done,
    async refuse(x, refusal, render, presented) {
      // A malformed or missing fence, entity or key goes to the rejection log
      // too (DESIGN §3.11). A tool call's row carries the hash of its body
      // (the call is its body); a plain request's refusals here are about its
      // form (headers, path, the entity's place), and carry none.
      if (x.route !== null) await logRefusal(deps, refusal, Object.assign(auditOf(x), { payloadSha256: x.tool !== null ? x.payloadSha256 : '' }), presented);
      const reply = render(refusal);
      // entity-busy, idempotency-in-progress, payload-too-large: the command log's own rows (DESIGN §4.1 `commands`).
      await logCommandRefusal(deps, x, refusal, reply.status);
      return done(x, reply, refusal.code);
    },
  };
}
