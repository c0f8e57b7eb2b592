#!/usr/bin/env node
// An agent's tool call, fenced end to end, narrated step by step with real
// processes and the real MCP SDK:
//
//   a model proposes tool calls; dispatchToolCalls enqueues the allow-listed
//   one as a leased job (and refuses the rest); agent worker W1 claims it and
//   sends create_ticket through the gateway's MCP route; the request gets
//   stuck in the network and W1 freezes (SIGSTOP); its lease expires; W2
//   claims the job with token+1 and opens the ticket; then W1's old call
//   arrives: the gateway answers JSON-RPC -32001 stale-fence and never
//   forwards it; W1 wakes, learns it lost the lease, and stores nothing.
//   The ticket server, NOT idempotent, opened one ticket.
//
//   npm run demo:mcp        (SQLite, temporary files)
//
// Exits 0 when every expectation held, 1 otherwise. The tested version:
// test/lease/mcp-gateway.slow.test.ts.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';
import { parseConfig } from '../dist/config/load.js';
import { startGateway } from '../dist/entry/node.js';
import { createJsonLogger } from '../dist/http/logger.js';
import { createSqliteJobStore, dispatchToolCalls } from '../dist/lease/index.js';
import { holdingPath } from './mcp/network.mjs';
import { HEARTBEAT, TOOLS } from './mcp/tools.mjs';

const here = fileURLToPath(new URL('.', import.meta.url));
const t0 = Date.now();
let step = 0;
const tty = process.stdout.isTTY;
const paint = (code, s) => (tty ? `\x1b[${code}m${s}\x1b[0m` : s);
const say = (text) => console.log(`${paint(2, `${String(((Date.now() - t0) / 1000).toFixed(1)).padStart(5)}s`)}  ${paint(1, `${++step}.`.padEnd(3))} ${text}`);
const detail = (text) => console.log(`${' '.repeat(11)}${paint(2, text)}`);
const ok = (text) => console.log(`${' '.repeat(11)}${paint(32, '✔')} ${text}`);
const bad = (text) => console.log(`${' '.repeat(11)}${paint(31, '✘')} ${text}`);

const cleanup = [];
let failures = 0;
const check = (cond, good, wrong = good) => (cond ? ok(good) : (failures++, bad(wrong)));

/** The ticket server: real MCP SDK, stateless Streamable HTTP. create_ticket is NOT idempotent. */
async function startTicketServer() {
  const tickets = [];
  const http = createHttpServer(async (req, res) => {
    const server = new McpServer({ name: 'tickets', version: '1.0.0' });
    server.registerTool(
      'create_ticket',
      { description: 'Opens a ticket. Every call opens one more.', inputSchema: { title: z.string() } },
      async ({ title }, extra) => {
        const t = { id: `T-${tickets.length + 1}`, title, fence: extra._meta?.['io.fencegate/fence'], key: extra._meta?.['io.fencegate/idempotency-key'] };
        tickets.push(t);
        return { content: [{ type: 'text', text: t.id }], structuredContent: { id: t.id } };
      },
    );
    server.registerTool(
      'search_tickets',
      { description: 'Finds tickets by title.', inputSchema: { q: z.string() }, annotations: { readOnlyHint: true } },
      async ({ q }) => ({
        content: [{ type: 'text', text: JSON.stringify(tickets.filter((t) => t.title.includes(q)).map((t) => t.id)) }],
      }),
    );
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => (transport.close(), server.close()));
    await server.connect(transport);
    await transport.handleRequest(req, res);
  });
  await new Promise((r) => http.listen(0, '127.0.0.1', r));
  cleanup.push(() => new Promise((r) => (http.closeAllConnections(), http.close(r))));
  return { url: `http://127.0.0.1:${http.address().port}`, tickets };
}

/** An agent worker process; resolves its messages as they come. */
function startWorker(workerId, store, mcp, waitForGo) {
  const proc = spawn(process.execPath, [join(here, 'mcp', 'worker.mjs'), JSON.stringify({ workerId, store, mcp, waitForGo })], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const seen = [];
  const waiters = new Set();
  createInterface({ input: proc.stdout }).on('line', (line) => {
    try {
      seen.push(JSON.parse(line));
    } catch {
      return;
    }
    for (const w of waiters) w();
  });
  cleanup.unshift(() => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGCONT');
      proc.kill('SIGKILL');
    }
  });
  return {
    proc,
    send: (line) => proc.stdin.write(`${line}\n`),
    next: (pred, what, ms = 30_000) =>
      new Promise((resolve, reject) => {
        const look = () => {
          const m = seen.find(pred);
          if (!m) return;
          waiters.delete(look);
          clearTimeout(timer);
          resolve(m);
        };
        const timer = setTimeout(() => (waiters.delete(look), reject(new Error(`${workerId}: no ${what} within ${ms} ms`))), ms);
        waiters.add(look);
        look();
      }),
  };
}

/** SIGSTOP, but never inside a write transaction (that would lock W2 out, which is not this story). */
async function freeze(proc, dbFile) {
  const probe = new Database(dbFile, { timeout: 0 });
  try {
    for (let i = 0; ; i++) {
      proc.kill('SIGSTOP');
      try {
        probe.exec('BEGIN IMMEDIATE; ROLLBACK');
        return;
      } catch {
        proc.kill('SIGCONT');
        if (i > 20) throw new Error('could not stop W1 outside a write');
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  } finally {
    probe.close();
  }
}

async function main() {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-demo-mcp-'));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  const ticketServer = await startTicketServer();
  const jobsFile = join(dir, 'jobs.db');
  const jobs = createSqliteJobStore({ path: jobsFile });
  cleanup.unshift(() => jobs.close());

  // --- the gateway ----------------------------------------------------------
  const config = parseConfig({
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: join(dir, 'gateway.db'), synchronous: 'NORMAL' },
    routes: [{ name: 'tickets', protocol: 'mcp', match: { path: '/mcp' }, upstream: ticketServer.url, tools: { search_tickets: { readOnly: true } } }],
  });
  const gateway = await startGateway({ config, logger: createJsonLogger({ level: 'silent' }) });
  cleanup.unshift(() => gateway.close());
  say(`fencegate gateway on ${gateway.url}, an MCP route /mcp in front of a ticket server (real MCP SDK):`);
  detail('create_ticket is NOT idempotent (every call opens a ticket); search_tickets is read-only and passes undecided');

  // --- the model's plan -------------------------------------------------------
  const plan = [
    { type: 'tool_use', id: 'toolu_1', name: 'create_ticket', input: { title: 'Printer on fire' }, leaseMs: 86_400_000 },
    { type: 'tool_use', id: 'toolu_2', name: 'delete_all_tickets', input: {} },
  ];
  const answers = await dispatchToolCalls(jobs, plan, { tools: TOOLS, heartbeat: HEARTBEAT, runId: 'conv-7:turn-3' });
  say('The model proposes two tool calls; dispatchToolCalls enqueues only what the allow-list permits:');
  for (const [i, a] of answers.entries()) detail(`${plan[i].name}: ${a.status}${a.jobId ? ` (job ${a.jobId}, key ${a.key})` : ` (${a.reason})`}`);
  check(answers[0].status === 'enqueued' && answers[1].status === 'refused', 'create_ticket enqueued, delete_all_tickets refused');
  const job = await jobs.get(answers[0].jobId);
  check(job.maxAttempts === 3, `the lease and attempts come from the allow-list (3 attempts, 1.5 s lease), not the model's leaseMs: 86400000`);
  const again = await dispatchToolCalls(jobs, plan, { tools: TOOLS, heartbeat: HEARTBEAT, runId: 'conv-7:turn-3' });
  check(again[0].status === 'duplicate' && again[0].jobId === job.id, `dispatching the same plan again: duplicate (job ${job.id}), nothing new`);
  const entity = job.jobKey;

  // --- W1 claims, sends, and freezes ------------------------------------------
  const w1Net = await holdingPath(Number(new URL(gateway.url).port));
  cleanup.unshift(() => w1Net.close()); // before the gateway: its relayed connections end first
  const w1 = startWorker('w1', { sqlite: jobsFile }, `http://127.0.0.1:${w1Net.port}/mcp`, true);
  const c1 = await w1.next((m) => m.ev === 'job_claimed', 'claim');
  say(`Agent worker W1 claims job ${job.id}: fencing token ${c1.token}, lease 1.5 s, heartbeats every 250 ms`);
  const found = await w1.next((m) => m.type === 'searched', 'search');
  detail(`W1 searches for duplicates (read-only, no fence needed): ${JSON.stringify(found.found)}`);
  w1Net.hold();
  w1.send('go');
  const sent = await w1.next((m) => m.ev === 'tool_request_started', 'create_ticket');
  for (let i = 0; i < 100 && w1Net.requests().length < 1; i++) await new Promise((r) => setTimeout(r, 20));
  say(`W1 sends tools/call create_ticket with _meta fence ${c1.token}, key ${sent.key}: it gets stuck in the network`);
  await freeze(w1.proc, jobsFile);
  say('W1 freezes mid-call (SIGSTOP): a GC pause, a paused VM — no heartbeats, no progress');

  // --- W2 takes over ------------------------------------------------------------
  const w2 = startWorker('w2', { sqlite: jobsFile }, `${gateway.url}/mcp`, false);
  const c2 = await w2.next((m) => m.ev === 'job_claimed', 'claim');
  say(`W1's lease expires (database clock); W2 claims job ${job.id} with token ${c2.token} (previous owner ${c2.previousOwner})`);
  const created = await w2.next((m) => m.type === 'created', 'ticket');
  await w2.next((m) => m.ev === 'result_committed', 'result');
  say(`W2 opens ticket ${created.ticket} through the gateway (fence ${c2.token}, same key) and commits its result`);

  // --- W1's past catches up -------------------------------------------------------
  const late = w1Net.release();
  for (let i = 0; i < 250 && late.some((l) => l.answer === null); i++) await new Promise((r) => setTimeout(r, 20));
  say("The network delivers W1's old create_ticket to the gateway, late");
  for (const l of late)
    check(
      l.refusal === 'stale-fence',
      `answered ${l.answer} with JSON-RPC error -32001 (X-Fencegate-Refusal: ${l.refusal}), never forwarded`,
      `answered ${l.answer} ${l.refusal ?? ''}`,
    );
  w1.proc.kill('SIGCONT');
  say('W1 wakes up (SIGCONT)');
  const failed = await w1.next((m) => m.type === 'call_failed', 'call error');
  check(failed.name === 'LeaseLostError', `W1's call throws ${failed.name}: ${failed.message}`);
  const rejected = await w1.next((m) => m.ev === 'result_rejected', 'result_rejected');
  check(rejected.reason === 'lease_lost', `W1's runner: result_rejected (${rejected.reason}); nothing of W1's is stored`);

  // --- what an auditor sees --------------------------------------------------------
  const audit = await (await fetch(`${gateway.url}/_fencegate/v1/rejections?entity=${encodeURIComponent(entity)}`)).json();
  say(`The audit log (GET /_fencegate/v1/rejections?entity=${entity}):`);
  for (const r of audit.items)
    detail(`${r.at}  ${r.reason}  ${r.method} ${r.path}  presented ${r.presented_fence}, current ${r.current_fence}  key ${r.idempotency_key}`);
  check(
    audit.items.some((r) => r.reason === 'stale-fence' && Number(r.presented_fence) === c1.token),
    "W1's late call is on record",
  );
  const final = await jobs.get(job.id);
  say(`The job: ${final.state}, token ${final.fencingToken}, result written by ${final.result?.worker}`);
  check(
    ticketServer.tickets.length === 1 && ticketServer.tickets[0].fence === String(c2.token),
    `the ticket server opened exactly one ticket, with fence ${c2.token}`,
    `${ticketServer.tickets.length} tickets`,
  );
  for (const t of ticketServer.tickets) detail(`ticket ${t.id} "${t.title}" fence ${t.fence} key ${t.key}`);
  console.log(failures === 0 ? paint(32, '\nOne ticket. The frozen agent was refused by its fence.') : paint(31, `\n${failures} expectation(s) failed.`));
}

try {
  await main();
} catch (err) {
  failures++;
  console.error(err);
} finally {
  for (const fn of cleanup) {
    try {
      await fn();
    } catch {
      // best effort
    }
  }
}
process.exit(failures === 0 ? 0 : 1);
