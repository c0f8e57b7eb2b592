#!/usr/bin/env node
// One agent worker of the MCP demo (examples/demo-mcp.mjs starts two of
// these). An ordinary fencegate/lease worker: it claims `create_ticket` jobs
// (enqueued by dispatchToolCalls from a model's plan), looks for a duplicate
// with the read-only search_tickets, then opens the ticket with ctx.mcp,
// which puts the job's fence, entity and step key in the call's _meta.
//
//   node examples/mcp/worker.mjs '{"workerId":"w1","store":{"sqlite":"jobs.db"},"mcp":"http://…/mcp","waitForGo":true}'
//
// stdout: one JSON line per lease event and per step. stdin: "go" lets a
// worker started with waitForGo open its ticket (the demo decides when).
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Agent, fetch } from 'undici';
import { openJobStore, runWorker, toolKinds } from '../../dist/lease/index.js';
import { HEARTBEAT, TOOLS } from './tools.mjs';

const { workerId, store: descriptor, mcp, waitForGo } = JSON.parse(process.argv[2]);
const say = (m) => process.stdout.write(`${JSON.stringify(m)}\n`);

let go;
const gone = new Promise((resolve) => (go = resolve));
if (!waitForGo) go();
createInterface({ input: process.stdin }).on('line', (line) => line === 'go' && go());

// One connection per request, so the demo's "network" can hold each request on its own.
const agent = new Agent({ pipelining: 0 });
const client = new Client({ name: `agent-${workerId}`, version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(mcp), { fetch: (url, init) => fetch(url, { ...init, dispatcher: agent }) }));
const store = await openJobStore(descriptor, { migrate: false });

const worker = await runWorker({
  store,
  workerId,
  ...HEARTBEAT,
  pollIntervalMs: 100,
  handlers: {
    create_ticket: async (ctx) => {
      const { title } = ctx.job.payload;
      // Read-only: the route lets it through undecided, no fence needed.
      const found = await client.callTool({ name: 'search_tickets', arguments: { q: title } });
      say({ type: 'searched', found: JSON.parse(found.content[0].text) });
      await gone;
      try {
        const res = await ctx.mcp(client).callTool({ name: 'create_ticket', arguments: { title } });
        say({ type: 'created', ticket: res.structuredContent.id });
        return { worker: workerId, ticket: res.structuredContent.id };
      } catch (err) {
        say({ type: 'call_failed', name: err.name, message: err.message, cause: err.cause?.message });
        throw err;
      }
    },
  },
  kinds: toolKinds(TOOLS),
});
worker.events.onAny((e) =>
  say({
    type: 'event',
    ev: e.type,
    job: e.jobId,
    token: e.fencingToken,
    cause: e.cause,
    reason: e.reason,
    step: e.step,
    key: e.idempotencyKey,
    previousOwner: e.previousOwnerId,
  }),
);
say({ type: 'ready' });

process.on('SIGTERM', async () => {
  await worker.stop({ release: true });
  await client.close();
  await store.close();
  await agent.close();
  process.exit(0);
});
