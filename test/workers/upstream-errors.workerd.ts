/**
 * The probe: what workerd's own `fetch` reports for each way an upstream can
 * fail, recorded verbatim (printed with `PROBE` in front) and pinned down
 * with assertions, because src/http/forward-fetch.ts classifies from exactly
 * these shapes (DESIGN §3.7: released vs outcome_unknown). A workerd upgrade
 * that changes one fails here first.
 */
import { describe, expect, inject, it } from 'vitest';
import { createFetchForwarder } from '../../src/http/forward-fetch.js';
import type { UpstreamRequest } from '../../src/http/forward.js';

const refusedUrl = inject('refusedUrl');
const faults = inject('faultUrls');

interface Shape {
  outcome: 'response' | 'threw' | 'body-threw';
  status?: number;
  ctor?: string;
  name?: string;
  message?: string;
  /** Own properties besides message and stack (workerd adds `retryable`), with their values. */
  props?: Record<string, unknown>;
  cause?: unknown;
  /** Chunks of the streamed request body workerd read before the error (null: a fixed body). */
  bodyPulls: number | null;
  /** Whole requests the upstream counted for this probe id (null: not counted there). */
  arrived: number | null;
  ms: number;
}

function describeCause(c: unknown): unknown {
  if (c === undefined) return undefined;
  if (c instanceof Error) return { ctor: c.constructor.name, name: c.name, message: c.message, code: (c as { code?: unknown }).code };
  return c;
}

let n = 0;
/**
 * `streamed`: the body as a workerd-native stream (IdentityTransformStream)
 * written in two chunks; a write resolves only once workerd has read that
 * chunk, so `bodyPulls` counts workerd's own reads. Not a JS-backed
 * `new ReadableStream(...)`: with one, a refused connect makes workerd print
 * "uncaught exception; source = Uncaught (in promise)" for its internal pump
 * of that stream, which no Worker code can catch (the caller's `fetch`
 * rejects and is handled; `unhandledrejection` does not fire). The gateway
 * never sends one (its body is a buffered Uint8Array), so the probe does not
 * either, and a green run prints no "uncaught exception" (workerd-output.test.ts).
 */
async function probe(url: string, opts: { streamed?: boolean; timeoutMs?: number } = {}): Promise<Shape> {
  const id = `probe-${Date.now().toString(36)}-${++n}`;
  let pulls = 0;
  const payload = new TextEncoder().encode('{"amount":1}');
  let body: Uint8Array | ReadableStream<Uint8Array> = payload;
  if (opts.streamed) {
    const pipe = new (globalThis as unknown as { IdentityTransformStream: new () => TransformStream<Uint8Array, Uint8Array> }).IdentityTransformStream();
    const writer = pipe.writable.getWriter();
    body = pipe.readable;
    // Not awaited here: it runs while fetch reads. A write rejects when the
    // connection is gone; that is the end of the count, and fetch's own
    // rejection (or answer) is what the probe records.
    void (async () => {
      for (const chunk of [payload.subarray(0, 5), payload.subarray(5)]) {
        await writer.write(chunk);
        pulls++;
      }
      await writer.close();
    })().catch(() => {});
  }
  const init: RequestInit & { duplex?: string } = {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-probe-id': id },
    body,
    redirect: 'manual',
  };
  if (opts.timeoutMs !== undefined) init.signal = AbortSignal.timeout(opts.timeoutMs);
  const started = performance.now();
  const shape = (s: Omit<Shape, 'bodyPulls' | 'arrived' | 'ms'>): Shape => ({
    ...s,
    bodyPulls: opts.streamed ? pulls : null,
    arrived: null,
    ms: Math.round(performance.now() - started),
  });
  const fromError = (outcome: 'threw' | 'body-threw', err: unknown, status?: number): Shape => {
    const e = err as Error;
    return shape({
      outcome,
      status,
      ctor: e?.constructor?.name,
      name: e?.name,
      message: e?.message,
      props: Object.fromEntries(
        Object.getOwnPropertyNames(e ?? {})
          .filter((k) => k !== 'stack' && k !== 'message')
          .map((k) => [k, (e as unknown as Record<string, unknown>)[k]]),
      ),
      cause: describeCause((e as { cause?: unknown })?.cause),
    });
  };
  let result: Shape;
  try {
    const res = await fetch(url, init);
    try {
      await res.arrayBuffer();
      result = shape({ outcome: 'response', status: res.status });
    } catch (err) {
      result = fromError('body-threw', err, res.status);
    }
  } catch (err) {
    result = fromError('threw', err);
  }
  if (url.startsWith(faults.http)) {
    const counted = (await (await fetch(`${faults.http}/__arrived?id=${id}`)).json()) as { count: number };
    result.arrived = counted.count;
  }
  console.log(`PROBE ${url.replace(/127\.0\.0\.1:\d+/, 'upstream')} ${opts.streamed ? 'streamed' : 'fixed'} ${JSON.stringify(result)}`);
  return result;
}

/** The part of a shape that code could classify from: what was thrown, not when or what the upstream saw. */
const visible = (s: Shape) => ({
  outcome: s.outcome,
  status: s.status,
  ctor: s.ctor,
  name: s.name,
  message: s.message?.replace(/reference = \w+/, 'reference = <id>'),
  props: s.props,
  cause: s.cause,
});

const LOST = { outcome: 'threw', ctor: 'Error', name: 'Error', message: 'Network connection lost.', props: { retryable: true }, cause: undefined };
const INTERNAL = { outcome: 'threw', ctor: 'Error', name: 'Error', message: 'internal error; reference = <id>', props: {}, cause: undefined };

describe("workerd fetch: the error of each upstream failure (the forwarder's classification rests on these)", () => {
  it('connection refused: "Network connection lost." (retryable), and the body is read all the same', async () => {
    for (const streamed of [false, true]) {
      const s = await probe(`${refusedUrl}/x`, { streamed });
      expect(visible(s)).toEqual(LOST);
      if (streamed) expect(s.bodyPulls).toBeGreaterThanOrEqual(1);
    }
  });

  it('a reset on accept, before a byte was read: the same', async () => {
    for (const streamed of [false, true]) expect(visible(await probe(`${faults.rstOnAccept}/x`, { streamed }))).toEqual(LOST);
  });

  it('RST or FIN after the whole request arrived (the upstream has it): exactly what a refused connect throws', async () => {
    const refused = visible(await probe(`${refusedUrl}/x`, { streamed: true }));
    for (const path of ['/rst-after', '/fin-after']) {
      for (const streamed of [false, true]) {
        const s = await probe(`${faults.http}${path}`, { streamed });
        expect(s.arrived, path).toBe(1);
        expect(visible(s), path).toEqual(refused);
        if (streamed) expect(s.bodyPulls).toBe(2);
      }
    }
  });

  it('a reset in the middle of the answer body: the status came, then reading the body throws "Network connection lost."', async () => {
    const s = await probe(`${faults.http}/rst-partial`);
    expect(visible(s)).toEqual({ ...LOST, outcome: 'body-threw', status: 200 });
  });

  it('a timeout (our AbortSignal): DOMException TimeoutError, the only error the forwarder can name as a timeout', async () => {
    for (const streamed of [false, true]) {
      const s = await probe(`${faults.http}/hang`, { streamed, timeoutMs: 300 });
      expect(visible(s)).toEqual({
        outcome: 'threw',
        ctor: 'DOMException',
        name: 'TimeoutError',
        message: 'The operation was aborted due to timeout',
        props: { code: 23, name: 'TimeoutError', retryable: true },
        cause: undefined,
      });
    }
  });

  it('an untrusted TLS certificate: "internal error; reference = …", the same as an answer that is not HTTP (the upstream had the request)', async (ctx) => {
    const garbage = await probe(`${faults.http}/garbage`);
    expect(garbage.arrived).toBe(1);
    expect(visible(garbage)).toEqual(INTERNAL);
    if (faults.tls === null) return ctx.skip();
    for (const streamed of [false, true]) expect(visible(await probe(`${faults.tls}/ok`, { streamed }))).toEqual(INTERNAL);
  });

  it('a plain answer, for comparison', async () => {
    for (const streamed of [false, true])
      expect(await probe(`${faults.http}/ok`, { streamed })).toMatchObject({ outcome: 'response', status: 200, arrived: 1 });
  });
});

describe('the fetch forwarder under workerd: every thrown error is "unknown" (DESIGN §3.7)', () => {
  const forwarder = createFetchForwarder();
  const req = (url: string, timeoutMs = 1_500): UpstreamRequest => ({
    url,
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: new TextEncoder().encode('{}'),
    timeoutMs,
    maxResponseBytes: 1024,
  });

  it('refused, reset before or after sending, a reset mid-body, TLS, not HTTP: unknown, never refused', async () => {
    const urls = [
      `${refusedUrl}/x`,
      `${faults.rstOnAccept}/x`,
      `${faults.http}/rst-after`,
      `${faults.http}/fin-after`,
      `${faults.http}/rst-partial`,
      `${faults.http}/garbage`,
    ];
    if (faults.tls !== null) urls.push(`${faults.tls}/ok`);
    for (const url of urls) {
      const r = await forwarder.forward(req(url));
      expect(r, url).toMatchObject({ kind: 'unknown', timedOut: false });
    }
  });

  it('a timeout is unknown with timedOut; a plain answer is a response', async () => {
    expect(await forwarder.forward(req(`${faults.http}/hang`, 300))).toEqual({ kind: 'unknown', error: 'timeout', timedOut: true });
    expect(await forwarder.forward(req(`${faults.http}/ok`))).toMatchObject({ kind: 'response', status: 200 });
  });
});
