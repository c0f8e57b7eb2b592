import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { command, effectOf, paymentsRoute, tempDir } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { killAll, ROOT, spawnProc, writeJson, type Proc } from '../helpers/child.js';

// A gateway process that is paused (SIGSTOP here; a long GC or VM pause in
// the wild) while its upstream answers, for longer than the route's
// deadline. On resume the deadline timer is due before the answer, already
// in the socket, has been read: libuv runs due timers at the start of a loop
// turn, before it polls the sockets. The forwarder gives the loop two turns
// to read it, so the caller gets the upstream's answer (stored for replay)
// instead of 504 and an outcome_unknown record for a request the gateway has
// the answer to. The negative control runs the same gateway with no grace
// turns (the forwarder's test-only option).

const CHILD = join(ROOT, 'test', 'faults', 'toolkit', 'grace-gateway-child.mjs');
// Long enough that the deadline cannot pass between the upstream getting
// the request and the stop taking effect, however slow a loaded box is to
// get there (at a few hundred ms it did, and the caller got a 504 with no
// pause at all); the pause is measured from the request, so a longer
// deadline costs only its own length.
const TIMEOUT_MS = 3_000;
// Linux only: the test stops the gateway once its main thread sleeps in epoll_wait.
const HAS_WCHAN = existsSync('/proc/self/wchan');

let up: FakeUpstream;
const tmp = tempDir('fencegate-paused-answer-');

beforeAll(async () => {
  if (!existsSync(join(ROOT, 'dist', 'entry', 'node.js'))) throw new Error('dist/ is missing: run `npm run build` first');
  up = await startUpstream();
});
afterEach(async () => {
  await killAll();
  up.behave(null);
});
afterAll(async () => {
  await up?.close();
  tmp.cleanup();
});

/** Until the process's main thread waits in epoll_wait (idle in its event loop). Bounded. */
async function untilIdleInPoll(pid: number): Promise<void> {
  for (let i = 0; i < 1_000; i++) {
    if (readFileSync(`/proc/${pid}/wchan`, 'utf8').includes('epoll')) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`process ${pid} never went idle in epoll_wait`);
}

/**
 * Until the process is stopped: SIGSTOP is delivered asynchronously, and an
 * answer that lands before the main thread has left epoll_wait would be
 * read on resume before the timers, pause or not.
 */
async function untilStopped(pid: number): Promise<void> {
  for (let i = 0; i < 1_000; i++) {
    // The state is the field after the parenthesised command name.
    if (readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('T')) return;
    await new Promise((r) => setTimeout(r, 2));
  }
  throw new Error(`process ${pid} did not stop`);
}

async function pausedWhileAnswered(name: string, graceTurns?: number): Promise<{ res: Response; gateway: Proc; retry: () => Promise<Response> }> {
  const dbPath = join(tmp.dir, `${name}.db`);
  const config = writeJson(join(tmp.dir, `${name}.json`), {
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: dbPath, synchronous: 'NORMAL' },
    // The lock outlives the pause by far: only the deadline is at stake here.
    routes: [paymentsRoute(up.url, { timeoutMs: TIMEOUT_MS, lockMarginMs: 30_000 })],
  });
  const gateway = spawnProc(name, [CHILD, config, ...(graceTurns === undefined ? [] : [String(graceTurns)])]);
  const { url } = await gateway.waitFor((m) => m.msg === 'listening', 'listening');

  const stopped = up.gate();
  up.behave(() => ({ kind: 'hold', gate: stopped.promise }));
  const calls = up.calls.length;
  const answer = command(url, '/payments/charges', { fence: 1, entity: `e-${name}`, key: `k-${name}` });
  await up.waitForCalls(calls + 1);
  // The gateway started its deadline before it sent the request, so the
  // deadline is due by TIMEOUT_MS from now at the latest.
  const sentAt = Date.now();
  // The request is sent and the gateway waits for the answer: stop it there.
  await untilIdleInPoll(gateway.pid);
  gateway.pause();
  await untilStopped(gateway.pid);
  // The answer goes into the stopped gateway's socket.
  stopped.open();
  await up.waitFor(() => up.calls[calls]!.finished, 'the answer written');
  // Paused until well past the deadline (a wait, not a timing assertion).
  await new Promise((r) => setTimeout(r, Math.max(0, sentAt + TIMEOUT_MS + 500 - Date.now())));
  gateway.resume();
  const retry = () => command(url, '/payments/charges', { fence: 1, entity: `e-${name}`, key: `k-${name}` });
  return { res: await answer, gateway, retry };
}

describe.skipIf(!HAS_WCHAN)('an answer that arrived while the gateway was paused past its deadline', () => {
  it('is read on resume and passed on (and stored), not a 504', async () => {
    const { res, gateway, retry } = await pausedWhileAnswered('grace');
    expect(res.status).toBe(201);
    expect((await effectOf(res)).key).toBe('k-grace');
    const decision = await gateway.waitFor((m) => m.msg === 'decision', 'decision line');
    expect(decision).toMatchObject({ decision: 'forwarded', status: 201 });
    const again = await retry();
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(up.callsFor('k-grace')).toHaveLength(1);
  });

  it('negative control: with no grace turns the same pause gives 504 upstream-timeout (outcome unknown)', async () => {
    const { res, gateway, retry } = await pausedWhileAnswered('no-grace', 0);
    expect(res.status).toBe(504);
    expect(((await res.json()) as { type: string }).type).toMatch(/\/upstream-timeout$/);
    const decision = await gateway.waitFor((m) => m.msg === 'decision', 'decision line');
    expect(decision).toMatchObject({ decision: 'upstream-timeout' });
    expect((await retry()).status).toBe(409);
  });
});
