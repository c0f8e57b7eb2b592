/**
 * An mcp route's tools/call is decided by the same stages as a plain
 * request (src/http/pipeline/), so it is traced the same way: a
 * `fencegate.request` span with `fencegate.admit`, `fencegate.forward` and
 * `fencegate.finish` children, and the forward span's context in the
 * upstream's `traceparent`. A message that passes undecided (a `ping`) is
 * forwarded in a span too, but is never admitted nor finished.
 */
import { context, propagation, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTracing } from '../../src/observe/tracing.js';
import { fenced, mcpRoute, rawPost, startMcpGateway, type McpGateway } from '../mcp/harness.js';
import { echoTool, rawUpstream, toolCall, type RawUpstream } from '../mcp/raw-upstream.js';

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const named = (spans: ReadableSpan[], name: string) => spans.filter((s) => s.name === name);

describe('an mcp tools/call is traced as a plain request is', () => {
  let up: RawUpstream;
  let gw: McpGateway;
  const tool = echoTool();

  beforeAll(async () => {
    provider.register();
    expect(await loadTracing()).toBe(true);
    up = await rawUpstream(tool.handler);
    gw = await startMcpGateway([mcpRoute(up.url)]);
  });
  afterAll(async () => {
    await gw?.close();
    await up?.close();
    await provider.shutdown();
    trace.disable();
    propagation.disable();
    context.disable();
  });

  it("request, admit, forward and finish spans in one trace; the upstream's traceparent is the forward span", async () => {
    exporter.reset();
    const callerTrace = '0af7651916cd43dd8448eb211c80319c';
    const res = await rawPost(`${gw.url}/mcp`, toolCall(1, 'create_ticket', { title: 'a' }, fenced(3, 'ticket:1', 'k-trace')), {
      traceparent: `00-${callerTrace}-b7ad6b7169203331-01`,
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { result?: unknown }).result).toBeDefined();
    const spans = exporter.getFinishedSpans();
    const [request] = named(spans, 'fencegate.request');
    expect(request, 'fencegate.request').toBeDefined();
    expect(request!.spanContext().traceId).toBe(callerTrace);
    expect(request!.attributes).toMatchObject({
      'fencegate.route': 'tickets',
      'fencegate.tool': 'create_ticket',
      'fencegate.entity': 'ticket:1',
      'fencegate.fence': '3',
      'fencegate.idempotency_key': 'k-trace',
      'fencegate.decision': 'forwarded',
    });
    for (const name of ['fencegate.admit', 'fencegate.forward', 'fencegate.finish']) {
      const s = named(spans, name);
      expect(s, name).toHaveLength(1);
      expect(s[0]!.parentSpanContext?.spanId, name).toBe(request!.spanContext().spanId);
    }
    expect(named(spans, 'fencegate.admit')[0]!.attributes['fencegate.admission']).toBe('forward');
    expect(named(spans, 'fencegate.finish')[0]!.attributes).toMatchObject({ 'fencegate.finish': 'completed', 'fencegate.recorded': true });
    const forward = named(spans, 'fencegate.forward')[0]!;
    const seen = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(String(up.seen.at(-1)!.headers.traceparent));
    expect(seen, 'the upstream got a traceparent').not.toBeNull();
    expect(seen![1]).toBe(callerTrace);
    expect(seen![2]).toBe(forward.spanContext().spanId);
  });

  it('a message that passes undecided is forwarded in a span, never admitted nor finished', async () => {
    exporter.reset();
    const res = await rawPost(`${gw.url}/mcp`, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'ping' }));
    expect(res.status).toBe(200);
    await res.text();
    const spans = exporter.getFinishedSpans();
    expect(named(spans, 'fencegate.request')).toHaveLength(1);
    expect(named(spans, 'fencegate.request')[0]!.attributes['fencegate.decision']).toBe('passed');
    expect(named(spans, 'fencegate.forward')).toHaveLength(1);
    expect(named(spans, 'fencegate.admit')).toHaveLength(0);
    expect(named(spans, 'fencegate.finish')).toHaveLength(0);
  });
});
