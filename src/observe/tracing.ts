/**
 * The OpenTelemetry API, loaded when `@opentelemetry/api` is installed (an
 * optional peer dependency), and the attribute helpers both the gateway's
 * spans (src/http/tracing.ts) and fencegate/lease's (src/lease/tracing.ts)
 * use. It sits below both, so that the lease module, which runs inside
 * workers, loads no gateway code to trace. Without the
 * package every span is a shared no-op object; with it but without an SDK,
 * the API itself is a no-op.
 *
 * Attributes carry ids and decisions, never bodies and never the query
 * string (tokens travel there).
 */
import type * as Otel from '@opentelemetry/api';

let api: typeof Otel | null = null;
let loading: Promise<boolean> | null = null;

/**
 * Loads `@opentelemetry/api` once; resolves true when it is there. The name
 * is not a literal, so a bundler (wrangler) does not require the package:
 * on a runtime without it the import fails and tracing stays off.
 */
export function loadTracing(): Promise<boolean> {
  return (loading ??= (async () => {
    const name = '@opentelemetry/api';
    try {
      api = (await import(/* @vite-ignore */ name)) as typeof Otel;
    } catch {
      api = null;
    }
    return api !== null;
  })());
}

/** The loaded API, or null (not installed, or not loaded yet). */
export function otel(): typeof Otel | null {
  return api;
}

export type Attributes = Record<string, string | number | boolean | undefined | null>;

/** The attributes OpenTelemetry accepts: those without a value dropped. */
export function clean(attrs: Attributes | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const [k, v] of Object.entries(attrs ?? {})) if (v !== undefined && v !== null) out[k] = v;
  return out;
}
