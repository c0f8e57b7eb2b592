import type { Refusal } from '../../protocol/problem.js';
import { requestShapeProblem } from '../request-shape.js';
import type { Codec } from './codec.js';
import type { Exchange } from './exchange.js';

// Stage 3 of the decision order (DESIGN §3.3): the headers. First what the
// HTTP parser let through but the upstream would read otherwise (framing,
// overrides: ../request-shape.ts), then what the codec reads of them. Nothing
// is stored yet, so a refusal here changes no state.

export function readHead<S>(x: Exchange, codec: Codec<S>): { ok: true; state: S } | { ok: false; refusal: Refusal; shape: boolean } {
  const shape = requestShapeProblem(x.req.headers, x.pathname, x.search, x.route!);
  if (shape !== null) return { ok: false, refusal: { code: 'invalid-request', detail: shape }, shape: true };
  const head = codec.head(x);
  return head.ok ? head : { ...head, shape: false };
}
