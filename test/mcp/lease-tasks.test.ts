import { afterEach, describe, expect, it } from 'vitest';
import { LeaseLostError } from '../../src/lease/errors.js';
import { fencedMcpTasks } from '../../src/lease/mcp-tasks.js';
import { fenceContext } from '../lease/helpers/fence-context.js';
import { connectClient, mcpRoute, startMcpGateway } from './harness.js';
import { startTaskUpstream, type TaskUpstream } from './task-upstream.js';

// fencedMcpTasks (src/lease/mcp-tasks.ts) through an mcp route to the real
// SDK server: the task is created with the step's fence, entity and key,
// polled within the lease, and its result fetched; an attempt that retries
// the step from a new session while the gateway still follows the first
// task waits and gets that task's result; a stale fence is lease loss.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(): Promise<{ up: TaskUpstream; url: string }> {
  const up = await startTaskUpstream({ json: true });
  cleanups.push(() => up.close());
  const gw = await startMcpGateway([mcpRoute(up.url, { tools: { '*': { readOnly: false } }, timeoutMs: 2_000 })]);
  cleanups.push(() => gw.close());
  return { up, url: `${gw.url}/mcp` };
}

async function client(url: string) {
  const c = await connectClient(url);
  cleanups.push(() => c.close());
  return c.client;
}

describe('fencedMcpTasks', () => {
  it('creates the task, polls it within the lease and returns its result; a later attempt of the step gets the same result', async () => {
    const { up, url } = await setup();
    const { ctx, events } = fenceContext({ jobId: 1, jobKey: 'tool-job:t:1', fenceKey: 'tool-job:t:1', fencingToken: 3 });
    const running = fencedMcpTasks(await client(url), ctx).callToolTask({ name: 'charge', arguments: { amount: 9 } }, { pollIntervalMs: 50 });
    // A second attempt of the job (a new session, the next token) retries the step while the first task runs.
    const { ctx: next } = fenceContext({ jobId: 1, jobKey: 'tool-job:t:1', fenceKey: 'tool-job:t:1', fencingToken: 4 });
    const retry = fencedMcpTasks(await client(url), next).callToolTask({ name: 'charge', arguments: { amount: 9 } });
    await new Promise((r) => setTimeout(r, 300));
    expect(up.executions).toBe(1);
    up.release();
    const [first, second] = await Promise.all([running, retry]);
    expect((first.content as { text: string }[])[0]!.text).toBe('charged 9 (#1)');
    expect((second.content as { text: string }[])[0]!.text).toBe('charged 9 (#1)');
    expect(up.executions).toBe(1);
    expect(up.methods()).toContain('tasks/get');
    expect(events).toContainEqual(expect.objectContaining({ type: 'tool_request_started', idempotencyKey: 'tool-job:t:1:mcp-task:charge' }));
  });

  it('a stale fence is lease loss, and nothing runs', async () => {
    const { up, url } = await setup();
    up.autoComplete = true;
    const { ctx } = fenceContext({ jobId: 2, jobKey: 'tool-job:t:2', fenceKey: 'tool-job:t:2', fencingToken: 5 });
    await fencedMcpTasks(await client(url), ctx).callToolTask({ name: 'charge', arguments: { amount: 1 }, step: 'a' });
    const { ctx: stale, lost } = fenceContext({ jobId: 2, jobKey: 'tool-job:t:2', fenceKey: 'tool-job:t:2', fencingToken: 4 });
    await expect(fencedMcpTasks(await client(url), stale).callToolTask({ name: 'charge', arguments: { amount: 1 }, step: 'b' })).rejects.toBeInstanceOf(
      LeaseLostError,
    );
    expect(lost).toEqual(['stale_fence']);
    expect(up.executions).toBe(1);
  });
});
