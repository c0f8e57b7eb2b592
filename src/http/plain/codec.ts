import type { RouteConfig } from '../../config/schema.js';
import type { Refusal } from '../../protocol/problem.js';
import { bodyDigest } from '../../core/fingerprint.js';
import { entityFromJson, keyFromJson, parseCommand, type Command as HeaderCommand } from '../command.js';
import { httpRefusal } from '../errors.js';
import { echoKey } from '../key-scope.js';
import type { Codec, Command } from '../pipeline/codec.js';
import { responseFrom, setHeader } from '../pipeline/reply.js';
import { presentedHeader } from '../refusal-log.js';
import { bodyMethodProblem } from '../request-shape.js';
import { settleHttp } from './outcome.js';

/** What the plain codec keeps of one request: the command its headers gave, completed by the body. */
interface HttpState {
  head: HeaderCommand;
  /** The key once the body is read (a route may take it from the body: `idempotencyKeyFrom`). */
  key: string | null;
}

/**
 * Plain HTTP (DESIGN §3): the fence, key and entity from the route's
 * headers, path parameters or JSON body; the fingerprint over method,
 * content type and body (§3.4); refusals in the route's error shape
 * (problem+json or Stripe's); the upstream's answer stored as it came.
 */
export function createHttpCodec(deps: { problemBase: string; signedFences: boolean }): Codec<HttpState> {
  const { problemBase } = deps;
  return {
    head(x) {
      const parsed = parseCommand(x.route!, x.req.headers, x.params, { signedFences: deps.signedFences, claims: x.claims });
      return parsed.ok ? { ok: true, state: { head: parsed.command, key: parsed.command.key } } : parsed;
    },

    known(state) {
      return state === null ? null : { entity: state.head.entity, fence: state.head.fence, key: state.key };
    },

    read(x, state, body, hash) {
      // Every plain request is a command: its rows, and its fingerprint, carry the body's hash.
      const payloadSha256 = hash();
      const route = x.route!;
      const { headers } = x.req;
      const refused = (refusal: Refusal) => ({ kind: 'refused' as const, refusal, state });
      // A method override in the body (Rails, Symfony and Laravel read one), as in the query (stage 3).
      const bodyMethod = bodyMethodProblem(x.req.method, headers.get('content-type'), body, route, headers.get('content-encoding'));
      if (bodyMethod !== null) return refused({ code: 'invalid-request', detail: bodyMethod });
      let { entity } = state.head;
      if ('json' in route.entity) {
        const fromBody = entityFromJson(route.entity.json, body);
        if (!fromBody.ok) return refused(fromBody.refusal);
        entity = fromBody.entity;
      }
      const bodyKey = keyFromJson(route, state.head.key, body);
      if (!bodyKey.ok) return refused(bodyKey.refusal);
      state.key = bodyKey.key;
      const contentType = headers.get('content-type') ?? '';
      const command: Command = {
        fence: state.head.fence,
        signedFence: state.head.signedFence,
        key: bodyKey.key,
        entity,
        keyScope: state.head.keyScope,
        scopeSuffix: '',
        fingerprint: { method: x.req.method, contentType, bodyDigest: bodyDigest(route.fingerprint, body, payloadSha256, contentType) },
      };
      return { kind: 'command', state, command };
    },

    render: (x, refusal) => httpRefusal(refusal, x.route?.errors ?? null, problemBase, x.requestId),
    presented: (x, code) => (x.route === null ? null : presentedHeader(x.route, code, x.req.headers)),
    entitySource: (x) => describeEntity(x.route!),

    replay(x, stored, state) {
      const res = responseFrom(stored, null);
      setHeader(res, 'idempotent-replayed', 'true');
      echoKey(res, x.route!, state.key);
      return res;
    },

    upstreamHeaders: (headers) => headers,

    settle(x, state, result, base, timeoutMs) {
      // A plain route never asks for a stream (no streamIf), so the forwarder answered whole.
      const settled = settleHttp(result as Exclude<typeof result, { kind: 'stream' }>, x.route!, base, problemBase, x.requestId, timeoutMs);
      echoKey(settled.reply, x.route!, state.key);
      return settled;
    },

    expiredDetail: (lockMs) =>
      `the gateway was delayed for longer than this request's ${lockMs} ms lock between its admission and the upstream; nothing was sent, retry with the same key is safe`,
    expiredExtras: (command) => ({ entity: command.entity, presented_fence: command.fence?.toString() ?? null, idempotency_key: command.key }),
  };
}

function describeEntity(route: RouteConfig): string {
  if ('header' in route.entity) return `header ${route.entity.header}`;
  if ('path' in route.entity) return `path parameter ${route.entity.path}`;
  return `body field ${route.entity.json}`;
}
