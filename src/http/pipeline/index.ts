import type { Config } from '../../config/schema.js';
import type { Refusal } from '../../protocol/problem.js';
import type { GatewayStore } from '../../store/types.js';
import { cutText, REJECTION_TEXT_LIMITS } from '../../store/bounds.js';
import { httpRefusal } from '../errors.js';
import type { Forwarder } from '../forward.js';
import type { Inbound, Reply } from '../inbound.js';
import { warnGlobalKeys, type CredentialHashing } from '../key-scope.js';
import type { Logger } from '../logger.js';
import { createMcpCodec } from '../mcp/codec.js';
import { createUpstreamResume } from '../mcp/resume.js';
import type { RequestObservation } from '../metrics.js';
import type { TokenVerifier } from '../middleware/auth/index.js';
import { normalizePath } from '../path.js';
import { createHttpCodec } from '../plain/codec.js';
import { requestIds } from '../request-id.js';
import type { SignedFenceCheck } from '../signed-fence.js';
import { startRequestSpan } from '../tracing.js';
import { admissionRefusal, createAdmitStage, forwards, type RefusedAdmission } from './admit.js';
import { createAsyncReplyStage, interimOfAdmission, type AsyncPoll } from './async-reply.js';
import { createAuthStage } from './auth.js';
import { missingEntity, readCommand } from './body.js';
import type { Codec } from './codec.js';
import { readHead } from './command.js';
import type { Exchange } from './exchange.js';
import { createForwardStage, createSender } from './forward.js';
import { createObserver } from './observe.js';
import { createPassStage } from './pass.js';
import { createReconcileStage, reconcileHint, type ReconcileQuery } from './reconcile.js';
import { setHeader } from './reply.js';
import { createRouteStage, metadataPathOf } from './route.js';
import { createSettleStage } from './settle.js';
import { verifyFence } from './verify.js';

export interface PipelineDeps {
  config: Config;
  store: GatewayStore;
  forwarder: Forwarder;
  logger: Logger;
  problemBase: string;
  /** Resolved `upstreamHeaders` per route name (secrets read from the environment at start-up). */
  upstreamHeaders: Map<string, Record<string, string>>;
  /** With caller auth: the bearer-token verifier (stage 2); the caller's Authorization is then the gateway's and never forwarded. */
  verify: TokenVerifier | null;
  /** How the credentials the upstream sees enter key scopes (../key-scope.ts credentialScopeOf). */
  credentialHashing: CredentialHashing;
  /** With `fence.signed`: verifies the fence JWS (and logs its refusal); the header is then never read as an integer. */
  checkSignedFence?: SignedFenceCheck;
  /** Called once per answered request (metrics). */
  observe?: (o: RequestObservation) => void;
  /** The status query of routes with `reconcile` (./reconcile.ts); absent: none has one. */
  reconcileQuery?: ReconcileQuery;
  /** The Location poll of routes with `asyncReply` (./async-reply.ts); absent: none has one. */
  asyncPoll?: AsyncPoll;
  /** Aborted when the gateway closes: work that outlives an answer (an MCP task followed, ../mcp/tasks.ts) ends and is recorded. */
  closing?: AbortSignal;
}

/**
 * The proxied request, whatever its protocol, in the decision order of
 * DESIGN §3, one stage a file:
 *
 *   1 route   ./route.ts    the route, one route decision per path
 *   2 auth    ./auth.ts     the caller, when `auth` is configured
 *   3 command ./command.ts  the request's shape, then the codec reads the headers
 *   4 body    ./body.ts     the body, and the codec's command (or a message to pass undecided: ./pass.ts)
 *   5 verify  ./verify.ts   a signed fence, once the entity is known
 *   6 admit   ./admit.ts    the store's one-transaction admission, with its bounded waits
 *     reconcile ./reconcile.ts  routes with `reconcile`: an outcome-unknown admission asks the upstream, then is decided again
 *   7 forward ./forward.ts  the upstream request, only while the admission's lock lives
 *   8 settle  ./settle.ts   the outcome, recorded by the owner-token finish
 *
 * A protocol is a codec (./codec.ts: ../plain/codec.ts, ../mcp/codec.ts);
 * every answer goes through the one observer (./observe.ts). Refusals never
 * reach the upstream and, before the admission, change no state.
 */
export function createPipeline(deps: PipelineDeps): (req: Inbound) => Promise<Reply> {
  const { config, store, logger, problemBase } = deps;
  warnGlobalKeys(config, logger);
  const observer = createObserver(deps);
  const route = createRouteStage(config.routes, config.adminPrefix, metadataPathOf(config));
  const authenticate = deps.verify === null ? null : createAuthStage({ verify: deps.verify, store, logger, resource: config.auth?.resource ?? null });
  const headerDeps = { upstreamHeaders: deps.upstreamHeaders, stripAuthorization: deps.verify !== null };
  const send = createSender(deps);
  const admit = createAdmitStage({ config, store, logger, credentialHashing: deps.credentialHashing });
  const reconcile = deps.reconcileQuery === undefined ? null : createReconcileStage({ store, query: deps.reconcileQuery, admit });
  const asyncReply = deps.asyncPoll === undefined ? null : createAsyncReplyStage({ store, poll: deps.asyncPoll, admit });
  const forward = createForwardStage({ ...headerDeps, forwarder: deps.forwarder, logger, store });
  const pass = createPassStage({ ...headerDeps, send, observer });
  const settle = createSettleStage({ store, logger, observer, config });
  const signedFences = deps.checkSignedFence !== undefined;
  const codecs = {
    http: createHttpCodec({ problemBase, signedFences }),
    mcp: createMcpCodec({
      signedFences,
      canStream: deps.forwarder.forwardStreaming !== undefined,
      forwarder: deps.forwarder,
      // A followed MCP task keeps its record and serial slot alive (../mcp/tasks.ts, DESIGN §3.6).
      extendLock: (input) => store.extendLock(input),
      ...(deps.closing !== undefined ? { closing: deps.closing } : {}),
      resume: createUpstreamResume({ ...headerDeps, forwarder: deps.forwarder }),
    }),
  };
  /** A refusal before any codec has read the request: in the route's HTTP error shape. */
  const httpRender = (x: Exchange) => (r: Refusal) => httpRefusal(r, x.route?.errors ?? null, problemBase, x.requestId);

  return async function pipeline(req: Inbound): Promise<Reply> {
    const started = performance.now();
    const pathname = normalizePath(req.pathname);
    const { requestId, clientRequestId } = requestIds(req);
    // The path is cut for the log as for the rejection log: any caller can send a 16 KB one.
    const shownPath = cutText(pathname, REJECTION_TEXT_LIMITS.path);
    const x: Exchange = {
      req,
      started,
      requestId,
      clientRequestId,
      pathname,
      search: req.search,
      trace: {
        request_id: requestId,
        ...(clientRequestId !== null ? { client_request_id: clientRequestId } : {}),
        route: null,
        method: req.method,
        path: shownPath,
      },
      span: startRequestSpan(req.headers, req.method, shownPath, requestId),
      route: null,
      params: {},
      caller: null,
      claims: null,
      payloadSha256: '',
      upstreamStarted: 0,
      tool: null,
    };

    // 1. Route.
    const routed = route(req.method, req.pathname, pathname, shownPath);
    x.route = routed.route;
    x.trace.route = routed.route?.name ?? null;
    if (!routed.ok) return observer.refuse(x, routed.refusal, httpRender(x), null);
    x.params = routed.params;
    return x.route!.protocol === 'mcp' ? decide(x, codecs.mcp) : decide(x, codecs.http);
  };

  async function decide<S>(x: Exchange, codec: Codec<S>): Promise<Reply> {
    // 2. Caller auth.
    if (authenticate !== null) {
      const auth = await authenticate(x, x.route!);
      if (!auth.ok) {
        const reply = await observer.refuse(x, auth.refusal, httpRender(x), null);
        setHeader(reply, 'www-authenticate', auth.challenge);
        return reply;
      }
      x.caller = auth.caller;
      x.claims = auth.claims;
    }

    // 3. Headers.
    const head = readHead(x, codec);
    if (!head.ok)
      return observer.refuse(x, head.refusal, head.shape ? httpRender(x) : (r) => codec.render(x, r, null), codec.presented(x, head.refusal.code, null));

    // 4. Body, and the command.
    const { body, read } = await readCommand(x, codec, head.state);
    if (read.kind === 'pass') return pass(x, codec, read.pass, body);
    if (read.kind === 'refused') {
      // A body over the limit: what the headers said of the command, for its command-log row and log line.
      const known = read.refusal.code === 'payload-too-large' ? (codec.known?.(read.state) ?? null) : null;
      if (known !== null) Object.assign(x.trace, { entity: known.entity, fence: known.fence?.toString() ?? null, idempotency_key: known.key });
      return observer.refuse(x, read.refusal, (r) => codec.render(x, r, read.state), codec.presented(x, read.refusal.code, read.state));
    }
    const { state, command } = read;
    const refuse = (r: Refusal) => observer.refuse(x, r, (shown) => codec.render(x, shown, state), codec.presented(x, r.code, state));
    const noEntity = missingEntity(x, codec, command);
    if (noEntity !== null) return refuse(noEntity);
    Object.assign(x.trace, { entity: command.entity, fence: command.fence?.toString() ?? null, idempotency_key: command.key });

    // 5. A signed fence.
    const unverified = await verifyFence(x, command, deps.checkSignedFence);
    if (unverified !== null) return refuse(unverified);

    // 6. Admission, re-run after bounded waits (serial slot; Prefer: wait).
    let admitted = await admit(x, command);
    // 6a. A command still pending upstream on a route with `asyncReply`: its Location polled once (DESIGN §3.12 "Async replies").
    if (asyncReply !== null && admitted !== null && interimOfAdmission(admitted) !== null && x.route!.protocol === 'http')
      admitted = await asyncReply(x, command, admitted);
    const interim = x.route!.asyncReply !== undefined ? interimOfAdmission(admitted) : null;
    if (interim !== null) return observer.done(x, codec.replay(x, interim, state), 'interim-replayed');
    // 6b. A lost answer, on a route with a status query (DESIGN §3.12): a status path, or an mcp route's status tool.
    if (reconcile !== null && admitted?.admission.outcome === 'outcome-unknown') admitted = await reconcile(x, command, admitted);
    if (admitted === null) return refuse({ code: 'store-unavailable', detail: 'the gateway could not reach its store; nothing was sent upstream' });
    const { admission } = admitted;
    if (admission.outcome === 'replay') return observer.done(x, codec.replay(x, admission.response, state), 'replayed');
    // An outcome-unknown on a route with `reconcile` says when to ask again (DESIGN §3.12).
    if (!forwards(admitted)) return refuse(admissionRefusal(admission as RefusedAdmission, command, reconcileHint(x, reconcile !== null)));

    // 7. Forward, and 8. settle.
    return settle(x, codec, state, command, admitted, await forward(x, codec, command, admitted, body));
  }
}
