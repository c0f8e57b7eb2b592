/**
 * The caller's W3C trace headers without an OpenTelemetry SDK: they reach
 * the upstream unchanged, whether `@opentelemetry/api` is installed (a
 * no-op without an SDK) or not installed at all (a child process whose
 * module resolution refuses every `@opentelemetry/*` package). With an SDK
 * the forward span's context replaces the parent id: the control that shows
 * the check can tell the two apart.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { context, propagation, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { loadTracing } from '../../src/observe/tracing.js';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { TS_EXEC_ARGV } from '../lease/helpers/node.js';

const CALLER = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const helper = (name: string) => fileURLToPath(new URL(`./helpers/${name}`, import.meta.url));

describe('traceparent / tracestate without an SDK', () => {
  let upstream: FakeUpstream;
  let gateway: TestGateway;
  beforeAll(async () => {
    // Whatever another file registered in this worker: no SDK here.
    trace.disable();
    propagation.disable();
    context.disable();
    expect(await loadTracing()).toBe(true);
    upstream = await startUpstream();
    gateway = await startTestGateway({ routes: [paymentsRoute(upstream.url)] });
  });
  afterAll(async () => {
    await gateway?.close();
    await upstream?.close();
    trace.disable();
    propagation.disable();
    context.disable();
  });

  const send = (key: string) =>
    command(gateway.url, '/payments/x', { fence: 1, entity: 'e', key, headers: { traceparent: CALLER, tracestate: 'vendor=1,other=2' } });

  test('@opentelemetry/api without an SDK: both reach the upstream as they came', async () => {
    expect((await send('a')).status).toBe(201);
    const call = upstream.calls.at(-1)!;
    expect(call.headers.traceparent).toBe(CALLER);
    expect(call.headers.tracestate).toBe('vendor=1,other=2');
  });

  test("control: with an SDK the upstream gets the forward span as parent, in the caller's trace", async () => {
    const exporter = new InMemorySpanExporter();
    const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
    provider.register();
    try {
      expect((await send('b')).status).toBe(201);
      const seen = String(upstream.calls.at(-1)!.headers.traceparent);
      expect(seen).not.toBe(CALLER); // the assertion of the test above would fail here
      const forward = exporter.getFinishedSpans().find((s) => s.name === 'fencegate.forward')!;
      expect(seen).toBe(`00-4bf92f3577b34da6a3ce929d0e0e4736-${forward.spanContext().spanId}-01`);
      expect(upstream.calls.at(-1)!.headers.tracestate).toBe('vendor=1,other=2');
    } finally {
      await provider.shutdown();
      trace.disable();
      propagation.disable();
      context.disable();
    }
  });
});

describe('no @opentelemetry package at all', () => {
  const run = async (block: boolean) => {
    const args = [...TS_EXEC_ARGV, ...(block ? ['--import', helper('block-otel.mjs')] : []), helper('no-otel-child.ts'), CALLER];
    const { stdout } = await promisify(execFile)(process.execPath, args, { timeout: 30_000 });
    return JSON.parse(stdout.trim().split('\n').at(-1)!);
  };

  test("the Node gateway runs, serves prom-client metrics, and passes the caller's trace headers on", async () => {
    const out = await run(true);
    expect(out).toEqual({ loaded: false, status: 201, traceparent: CALLER, tracestate: 'vendor=1', buildInfo: true, processMetrics: true });
  });

  test('control: the same child without the block loads the API (so the block is what made it absent)', async () => {
    expect((await run(false)).loaded).toBe(true);
  });
});
