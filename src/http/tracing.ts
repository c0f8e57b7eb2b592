/**
 * OpenTelemetry spans for the gateway: a server span per proxied request
 * with children for admission, forward and finish, and the forward's context
 * in the upstream's `traceparent`. The API is loaded by src/observe/tracing.ts;
 * before it is (or without `@opentelemetry/api`) every span is a shared no-op
 * object, and with the API but without an SDK the caller's
 * `traceparent`/`tracestate` reach the upstream unchanged (as any other
 * end-to-end header).
 *
 * Attributes carry ids and decisions (route, entity, fence, idempotency
 * key, request id, decision, status, the path), never bodies and never the
 * query string (tokens travel there).
 */
import type * as Otel from '@opentelemetry/api';
import { clean, otel, type Attributes } from '../observe/tracing.js';
import type { StreamedAnswer, UpstreamResult } from './forward.js';
import type { HeaderReader } from './inbound.js';

export interface PhaseSpan {
  /** Writes this span's context into `headers` (`traceparent`, `tracestate`) and returns them. */
  inject<H extends Record<string, string>>(headers: H): H;
  end(attrs?: Attributes, error?: unknown): void;
}

/** The proxy's log fields a span carries. */
export interface LogFields {
  route?: unknown;
  entity?: unknown;
  fence?: unknown;
  idempotency_key?: unknown;
  tool?: unknown;
}

export interface RequestSpan {
  phase(name: 'fencegate.admit' | 'fencegate.forward' | 'fencegate.finish', attrs?: Attributes): PhaseSpan;
  /** Ends the request span with the proxy's log fields (route, entity, fence, key) and the answer. */
  end(log: LogFields, decision: string, status: number): void;
}

const NOOP_PHASE: PhaseSpan = { inject: (h) => h, end() {} };
const NOOP_REQUEST: RequestSpan = { phase: () => NOOP_PHASE, end() {} };

const getter: Otel.TextMapGetter<HeaderReader> = {
  get: (h, k) => h.get(k) ?? undefined,
  keys(h) {
    const out: string[] = [];
    h.forEach((_v, k) => out.push(k));
    return out;
  },
};

/**
 * The span of one proxied request, a child of the caller's `traceparent`
 * when a propagator is registered.
 *
 * @example
 * const span = startRequestSpan(req.headers, 'POST', '/payments/charges');
 * const admit = span.phase('fencegate.admit'); …; admit.end({ 'fencegate.admission': 'forward' });
 * span.end({ route: 'payments' }, 'forwarded', 201);
 */
export function startRequestSpan(headers: HeaderReader, method: string, path: string, requestId: string): RequestSpan {
  const o = otel();
  if (o === null) return NOOP_REQUEST;
  const parent = o.propagation.extract(o.ROOT_CONTEXT, headers, getter);
  const tracer = o.trace.getTracer('fencegate');
  const span = tracer.startSpan(
    'fencegate.request',
    { kind: o.SpanKind.SERVER, attributes: { 'http.request.method': method, 'url.path': path, 'fencegate.request_id': requestId } },
    parent,
  );
  if (!span.isRecording()) {
    // No SDK: nothing is recorded, and the caller's trace headers pass through as they came.
    span.end();
    return NOOP_REQUEST;
  }
  const ctx = o.trace.setSpan(parent, span);
  return {
    phase(name, attrs) {
      const child = tracer.startSpan(name, { kind: name === 'fencegate.forward' ? o.SpanKind.CLIENT : o.SpanKind.INTERNAL, attributes: clean(attrs) }, ctx);
      return {
        inject(h) {
          o.propagation.inject(o.trace.setSpan(ctx, child), h);
          return h;
        },
        end(a, error) {
          finishSpan(o, child, a, error);
        },
      };
    },
    end(log, decision, status) {
      span.setAttributes(
        clean({
          'fencegate.route': str(log.route),
          'fencegate.entity': str(log.entity),
          'fencegate.fence': str(log.fence),
          'fencegate.idempotency_key': str(log.idempotency_key),
          'fencegate.tool': str(log.tool),
          'fencegate.decision': decision,
          'http.response.status_code': status,
        }),
      );
      if (status >= 500) span.setStatus({ code: o.SpanStatusCode.ERROR, message: decision });
      span.end();
    },
  };
}

/** The forward span's attributes for what the upstream did. */
export function upstreamAttributes(result: UpstreamResult | StreamedAnswer): Attributes {
  return { 'fencegate.upstream': result.kind, ...('status' in result ? { 'http.response.status_code': result.status } : {}) };
}

function finishSpan(o: typeof Otel, span: Otel.Span, attrs: Attributes | undefined, error: unknown): void {
  if (attrs) span.setAttributes(clean(attrs));
  if (error !== undefined) {
    // The error's class and message: never a body (store and transport errors do not carry one).
    span.setStatus({ code: o.SpanStatusCode.ERROR, message: error instanceof Error ? `${error.name}: ${error.message}`.slice(0, 256) : 'error' });
  }
  span.end();
}

function str(v: unknown): string | undefined {
  return v === null || v === undefined ? undefined : String(v);
}
