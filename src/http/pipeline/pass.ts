import type { Reply } from '../inbound.js';
import { upstreamHeaders, joinUrl, type UpstreamHeaderDeps } from '../upstream-request.js';
import type { Codec, Pass } from './codec.js';
import type { Exchange } from './exchange.js';
import type { createSender } from './forward.js';
import type { Observer } from './observe.js';

// A message that is not a command (an mcp route's messages other than a
// side-effecting tools/call, its GET event stream, its DELETE): forwarded
// as it came, both ways, with no admission and nothing stored (docs/mcp.md).

export function createPassStage(deps: UpstreamHeaderDeps & { send: ReturnType<typeof createSender>; observer: Observer }) {
  return async function pass<S>(x: Exchange, codec: Codec<S>, p: Pass, body: Uint8Array): Promise<Reply> {
    if (p.local !== undefined) return deps.observer.done(x, p.local, p.decision);
    const route = x.route!;
    const result = await deps.send(
      x,
      route,
      {
        url: joinUrl(route.upstream, x.pathname + x.search),
        method: x.req.method,
        headers: codec.upstreamHeaders(upstreamHeaders(x.req.headers, route, deps, { requestId: x.requestId, entity: null, fence: null })),
        body: body.byteLength > 0 ? body : null,
        timeoutMs: p.timeoutMs ?? route.timeoutMs,
        maxResponseBytes: route.maxResponseBytes,
        passThrough: true,
      },
      p.streamIf,
    );
    const { reply, decision } = p.answer(result);
    return deps.observer.done(x, reply, decision);
  };
}
