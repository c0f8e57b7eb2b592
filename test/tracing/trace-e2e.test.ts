/**
 * One trace from a worker's attempt through the gateway to the upstream:
 * the OpenTelemetry Node SDK (AsyncLocalStorage context manager, W3C
 * propagator) with an in-memory exporter, a real SQLite job store, the
 * gateway as `fencegate serve` starts it (SQLite store, undici forwarder,
 * loopback) and a loopback upstream that records the `traceparent` it got.
 */
import { context, propagation, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { loadTracing } from '../../src/observe/tracing.js';
import { runWorker } from '../../src/lease/runner/run-worker.js';
import type { JobStore } from '../../src/lease/types.js';
import { paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { TS_EXEC_ARGV } from '../lease/helpers/node.js';
import { sqliteDatabase, type TestDatabase } from '../lease/helpers/stores.js';

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });

/** traceparent `00-<trace id>-<parent span id>-<flags>`. */
function parseTraceparent(v: unknown): { traceId: string; parentId: string } {
  const m = /^00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]$/.exec(String(v));
  if (!m) throw new Error(`not a traceparent: ${String(v)}`);
  return { traceId: m[1]!, parentId: m[2]! };
}

const byName = (spans: ReadableSpan[], name: string) => {
  const s = spans.filter((x) => x.name === name);
  expect(s, name).toHaveLength(1);
  return s[0]!;
};
const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId;

describe('one trace: worker attempt → gateway → upstream', () => {
  let db: TestDatabase;
  let store: JobStore;
  let upstream: FakeUpstream;
  let gateway: TestGateway;

  beforeAll(async () => {
    provider.register();
    expect(await loadTracing()).toBe(true);
    db = await sqliteDatabase();
    store = await db.open();
    upstream = await startUpstream();
    gateway = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
  });
  afterAll(async () => {
    await gateway?.close();
    await upstream?.close();
    await db?.dispose();
    await provider.shutdown();
    trace.disable();
    propagation.disable();
    context.disable();
  });

  /** Runs one job whose handler charges through the gateway; `strip` drops the worker's traceparent on the way (the negative control). */
  async function runOne(idempotencyKey: string, strip: boolean) {
    exporter.reset();
    const { job } = await store.enqueue({ kind: 'pay', idempotencyKey, payload: { amount: 1200, card: 'SECRET-PAYLOAD' } });
    const before = upstream.calls.length;
    const worker = await runWorker({
      store,
      workerId: `w-${idempotencyKey}`,
      leaseMs: 2_000,
      heartbeatMs: 200,
      maxMissedHeartbeats: 3,
      jitterMs: 50,
      pollIntervalMs: 25,
      threadExecArgv: TS_EXEC_ARGV,
      kinds: { pay: { maxRunMs: 10_000 } },
      ...(strip
        ? {
            fetch: (input: string | URL | Request, init?: RequestInit) => {
              const headers = new Headers(init?.headers);
              headers.delete('traceparent');
              return fetch(input, { ...init, headers });
            },
          }
        : {}),
      handlers: {
        pay: async ({ fencedFetch }) => {
          const res = await fencedFetch(`${gateway.url}/payments/charges?token=SECRET-QUERY`, {
            step: 'charge',
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ amount: 1200, card: 'SECRET-BODY' }),
          });
          return { status: res.status };
        },
      },
    });
    try {
      await worker.events.waitFor('result_committed', (e) => e.jobId === job.id);
    } finally {
      await worker.stop();
    }
    expect(upstream.calls.length).toBe(before + 1);
    return { job, call: upstream.calls.at(-1)!, spans: exporter.getFinishedSpans() };
  }

  test("the upstream sees a traceparent whose trace id is the attempt's; every span is in that trace, nested as it happened", async () => {
    const { job, call, spans } = await runOne('trace-1', false);
    const attempt = byName(spans, 'fencegate.lease.attempt');
    const claim = byName(spans, 'fencegate.lease.claim');
    const tool = byName(spans, 'fencegate.lease.tool_request');
    const request = byName(spans, 'fencegate.request');
    const admit = byName(spans, 'fencegate.admit');
    const forward = byName(spans, 'fencegate.forward');
    const finish = byName(spans, 'fencegate.finish');
    const traceId = attempt.spanContext().traceId;

    const seen = parseTraceparent(call.headers.traceparent);
    expect(seen.traceId).toBe(traceId);
    // The upstream's parent is the gateway's forward span, not the worker's request.
    expect(seen.parentId).toBe(forward.spanContext().spanId);
    for (const s of [claim, tool, request, admit, forward, finish]) expect(s.spanContext().traceId, s.name).toBe(traceId);
    expect(parentOf(claim)).toBe(attempt.spanContext().spanId);
    expect(parentOf(tool)).toBe(attempt.spanContext().spanId);
    expect(parentOf(request)).toBe(tool.spanContext().spanId);
    for (const s of [admit, forward, finish]) expect(parentOf(s), s.name).toBe(request.spanContext().spanId);

    // The claim's token: the fence the worker sent and the gateway checked.
    const fence = String(attempt.attributes['fencegate.fence']);
    expect(Number(fence)).toBeGreaterThan(0);
    expect(tool.attributes['fencegate.fence']).toBe(Number(fence));
    expect(attempt.attributes).toMatchObject({ 'fencegate.job_id': job.id, 'fencegate.job_kind': 'pay', 'fencegate.decision': 'committed' });
    expect(tool.attributes).toMatchObject({
      'fencegate.job_id': job.id,
      'fencegate.step': 'charge',
      'fencegate.idempotency_key': `${job.jobKey}:charge`,
      'fencegate.entity': job.fenceKey,
      'http.request.method': 'POST',
      'url.path': '/payments/charges',
      'http.response.status_code': 201,
    });
    expect(request.attributes).toMatchObject({
      'fencegate.route': 'payments',
      'fencegate.decision': 'forwarded',
      'fencegate.entity': job.fenceKey,
      'fencegate.fence': fence,
      'fencegate.idempotency_key': `${job.jobKey}:charge`,
      'http.response.status_code': 201,
      'url.path': '/payments/charges',
    });
    expect(admit.attributes['fencegate.admission']).toBe('forward');
    expect(forward.attributes).toMatchObject({ 'fencegate.upstream': 'response', 'http.response.status_code': 201 });
    expect(finish.attributes).toMatchObject({ 'fencegate.finish': 'completed', 'fencegate.recorded': true });
    // Never a body, a payload or a query string.
    const everything = JSON.stringify(spans.map((s) => ({ name: s.name, attributes: s.attributes, status: s.status, events: s.events })));
    expect(everything).not.toMatch(/SECRET|token=/);
  });

  test("negative control: without the worker's traceparent the gateway starts another trace, and the check above fails", async () => {
    const { call, spans } = await runOne('trace-2', true);
    const attempt = byName(spans, 'fencegate.lease.attempt');
    const seen = parseTraceparent(call.headers.traceparent);
    // The gateway's own root: the same assertion as above would fail.
    expect(seen.traceId).not.toBe(attempt.spanContext().traceId);
    expect(parentOf(byName(spans, 'fencegate.request'))).toBeUndefined();
  });
});
