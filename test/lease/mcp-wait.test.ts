/**
 * fencedMcp's request timeout and its wait on reconciliation (DESIGN §6.4,
 * docs/mcp.md "Worker side"), with a structural client that records what it
 * was asked and answers as a gateway route would.
 */
import { describe, expect, test } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import { fencedMcp, MCP_RECONCILED_META, mcpReconcilingHint, McpRefusalError, ROUTE_ANSWER_MARGIN_MS, type McpClientLike } from '../../src/lease/mcp.js';
import { renderMcpRefusal } from '../../src/protocol/mcp.js';
import { fenceContext } from './helpers/fence-context.js';

/** An McpError as the SDK raises it for a JSON-RPC error answer. */
function mcpError(code: number, data: unknown): Error {
  return Object.assign(new Error(`MCP error ${code}: outcome-unknown`), { name: 'McpError', code, data });
}

/** A client that answers each call with the next of `answers` (an Error is thrown), recording params and options. */
function scripted(answers: unknown[]) {
  const calls: { params: Record<string, unknown>; options: Record<string, unknown> }[] = [];
  const client: McpClientLike = {
    async callTool(params, _schema, options) {
      calls.push({ params: structuredClone({ ...params, _meta: { ...params._meta } }), options: { ...options } });
      const next = answers.shift();
      if (next instanceof Error) throw next;
      return next;
    },
  };
  return { client, calls };
}

const hint = (retryAfter: number) => mcpError(-32005, { type: 'outcome-unknown', reconciling: true, retry_after: retryAfter });

describe('the SDK request timeout', () => {
  test('follows the route timeout plus a margin, reset by progress, within the lease; the caller may set its own', async () => {
    const { ctx } = fenceContext({ waitableMs: () => 60_000 });
    const { client, calls } = scripted([{ content: [] }, { content: [] }, { content: [] }]);
    await fencedMcp(client, ctx, { routeTimeoutMs: 5_000 }).callTool({ name: 'create_ticket', step: 'a' });
    expect(calls[0]!.options).toMatchObject({ timeout: 5_000 + ROUTE_ANSWER_MARGIN_MS, resetTimeoutOnProgress: true, maxTotalTimeout: 60_000 });
    // Without a route timeout: the lease's remaining time.
    await fencedMcp(client, ctx).callTool({ name: 'create_ticket', step: 'b' });
    expect(calls[1]!.options).toMatchObject({ timeout: 60_000, maxTotalTimeout: 60_000 });
    // The caller's own wins.
    await fencedMcp(client, ctx, { routeTimeoutMs: 5_000 }).callTool({ name: 'create_ticket', step: 'c' }, undefined, { timeout: 300 });
    expect(calls[2]!.options.timeout).toBe(300);
  });

  test('never past the lease: a route timeout longer than the lease left is cut to it', async () => {
    const { ctx } = fenceContext({ waitableMs: () => 4_000 });
    const { client, calls } = scripted([{ content: [] }]);
    await fencedMcp(client, ctx, { routeTimeoutMs: 30_000 }).callTool({ name: 'create_ticket' });
    expect(calls[0]!.options.timeout).toBe(4_000);
  });
});

describe('an outcome-unknown (-32005) with the route reconciling', () => {
  test('is waited out and the same call sent again; the answer is reported as outcome_reconciled', async () => {
    const { ctx, events } = fenceContext({ waitableMs: () => 60_000 });
    const answer = { content: [{ type: 'text', text: 'T-1' }], _meta: { [MCP_RECONCILED_META]: true } };
    const { client, calls } = scripted([hint(0), hint(0), answer]);
    const result = await fencedMcp(client, ctx).callTool({ name: 'create_ticket', arguments: { title: 'x' } });
    expect(result).toEqual(answer);
    expect(calls).toHaveLength(3);
    // The same call each time: key, fence, entity, arguments.
    expect(calls[2]!.params).toEqual(calls[0]!.params);
    const reconciled = events.filter((e) => e.type === 'outcome_reconciled');
    expect(reconciled).toHaveLength(1);
    expect(reconciled[0]).toMatchObject({ step: 'mcp:create_ticket', idempotencyKey: 'tool-job:test:1:mcp:create_ticket', waits: 2 });
  });

  test('an answer after a wait without the marker (the record was released and the call ran) is no outcome_reconciled', async () => {
    const { ctx, events } = fenceContext({ waitableMs: () => 60_000 });
    const { client, calls } = scripted([hint(0), { content: [] }]);
    await fencedMcp(client, ctx).callTool({ name: 'create_ticket' });
    expect(calls).toHaveLength(2);
    expect(events.some((e) => e.type === 'outcome_reconciled')).toBe(false);
  });

  test('negative control: without the hint (a route that does not reconcile) the handler gets the refusal at once', async () => {
    const { ctx, events } = fenceContext({ waitableMs: () => 60_000 });
    const { client, calls } = scripted([mcpError(-32005, { type: 'outcome-unknown' }), { content: [] }]);
    const err = (await fencedMcp(client, ctx)
      .callTool({ name: 'create_ticket' })
      .catch((e: unknown) => e)) as McpRefusalError;
    expect(err).toBeInstanceOf(McpRefusalError);
    expect(err.code).toBe('outcome-unknown');
    expect(calls).toHaveLength(1);
    expect(events.some((e) => e.type === 'outcome_reconciled')).toBe(false);
  });

  test('a wait the lease does not cover is not made: the refusal goes to the handler', async () => {
    const { ctx } = fenceContext({ waitableMs: () => 3_000 });
    const { client, calls } = scripted([hint(5), { content: [] }]);
    await expect(fencedMcp(client, ctx).callTool({ name: 'create_ticket' })).rejects.toBeInstanceOf(McpRefusalError);
    expect(calls).toHaveLength(1);
  });

  test('the lease ending during the wait ends it with the lease error, and nothing more is sent', async () => {
    const { ctx, controller } = fenceContext({ waitableMs: () => 60_000 });
    const { client, calls } = scripted([hint(1), { content: [] }]);
    const pending = fencedMcp(client, ctx).callTool({ name: 'create_ticket' });
    setTimeout(() => controller.abort(new LeaseLostError('lost')), 50);
    await expect(pending).rejects.toBeInstanceOf(LeaseLostError);
    expect(calls).toHaveLength(1);
  });

  test("the hint is the gateway's: an outcome-unknown refusal with the admission's reconciling extras, rendered for an mcp route", () => {
    // The extras admissionRefusal gives a route with reconcile (src/http/pipeline/admit.ts), in the MCP shape.
    const rendered = renderMcpRefusal({ code: 'outcome-unknown', detail: 'unknown', extras: { idempotency_key: 'k', reconciling: true, retry_after: 3 } }, 5);
    const { error } = JSON.parse(rendered.body) as { error: { code: number; data: unknown } };
    expect(mcpReconcilingHint(error)).toEqual({ retryAfterMs: 3000 });
    // Without the extras (a route without reconcile): no hint.
    const plain = JSON.parse(renderMcpRefusal({ code: 'outcome-unknown', detail: 'unknown', extras: { idempotency_key: 'k' } }, 5).body);
    expect(mcpReconcilingHint(plain.error)).toBeUndefined();
  });

  test('the hint is read only from a -32005 whose data says outcome-unknown, reconciling, and a whole retry_after', () => {
    expect(mcpReconcilingHint({ code: -32005, data: { type: 'outcome-unknown', reconciling: true, retry_after: 2 } })).toEqual({ retryAfterMs: 2000 });
    expect(mcpReconcilingHint({ code: -32009, data: { type: 'outcome-unknown', reconciling: true, retry_after: 2 } })).toBeUndefined();
    expect(mcpReconcilingHint({ code: -32005, data: { type: 'outcome-unknown', reconciling: 'yes', retry_after: 2 } })).toBeUndefined();
    expect(mcpReconcilingHint({ code: -32005, data: { type: 'outcome-unknown', reconciling: true, retry_after: 1.5 } })).toBeUndefined();
    expect(mcpReconcilingHint({ code: -32005, data: { type: 'outcome-unknown', reconciling: true } })).toBeUndefined();
    expect(mcpReconcilingHint({ code: -32005, data: null })).toBeUndefined();
  });
});
