/**
 * fencedFetch and step against a plain FenceContext (no database, no
 * runner) and real local HTTP servers.
 */
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test, vi } from 'vitest';
import { LeaseLostError, OutcomeUnknownError, OwnershipUnknownError } from '../../src/lease/errors.js';
import { createFencedFetch, createStep, type FenceContext } from '../../src/lease/fenced-fetch.js';
import { fenceContext } from './helpers/fence-context.js';

type Answer = { status: number; type?: string; body: string; delayMs?: number };

let server: Server;
let base = '';
const seen: { path: string; headers: IncomingHttpHeaders }[] = [];
/** What the server answers, by path. */
const answers = new Map<string, Answer>();

beforeAll(async () => {
  server = createServer((req, res) => {
    seen.push({ path: req.url ?? '', headers: req.headers });
    const answer = answers.get(req.url ?? '') ?? { status: 200, body: '{"ok":true}' };
    const send = () => {
      res.writeHead(answer.status, { 'content-type': answer.type ?? 'application/json' });
      res.end(answer.body);
    };
    if (answer.delayMs) setTimeout(send, answer.delayMs);
    else send();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

const context = (overrides: Partial<FenceContext> = {}) =>
  fenceContext({ jobId: 42, kind: 'payment', jobKey: 'tool-job:5f0c9e:42', fenceKey: 'tool-job:5f0c9e:42', ...overrides });

describe('fencedFetch', () => {
  test('adds the fence, the entity, a stable idempotency key and a request id, and reports the start', async () => {
    const { ctx, events } = context();
    const fencedFetch = createFencedFetch(ctx);
    const res = await fencedFetch(`${base}/payments/charges?secret=1`, { step: 'charge', method: 'post', body: '{}' });
    expect(res.status).toBe(200);
    const { headers } = seen.at(-1)!;
    expect(headers).toMatchObject({ 'x-execution-fence': '7', 'x-fence-entity': 'tool-job:5f0c9e:42', 'idempotency-key': 'tool-job:5f0c9e:42:charge' });
    expect(events).toEqual([
      expect.objectContaining({
        type: 'tool_request_started',
        jobId: 42,
        fencingToken: 7,
        step: 'charge',
        idempotencyKey: 'tool-job:5f0c9e:42:charge',
        requestId: headers['x-request-id'],
        method: 'POST',
        url: `${base}/payments/charges`, // no query string: it may carry secrets
      }),
    ]);
    // The same step on a later call (or a later attempt) has the same key.
    await fencedFetch(`${base}/payments/charges`, { step: 'charge', method: 'POST', body: '{}' });
    expect(seen.at(-1)!.headers['idempotency-key']).toBe('tool-job:5f0c9e:42:charge');
  });

  test('refuses to start when the lease cannot be confirmed: nothing is sent', async () => {
    const before = seen.length;
    const { ctx, events } = context({
      assertCanStart: () => {
        throw new OwnershipUnknownError('confirmed for 10 ms');
      },
    });
    await expect(createFencedFetch(ctx)(`${base}/payments/x`, { step: 'charge' })).rejects.toBeInstanceOf(OwnershipUnknownError);
    expect(seen.length).toBe(before);
    expect(events).toEqual([]);
  });

  test('a 409 problem+json stale-fence (or fence-expired, or the Stripe shape) is lease loss', async () => {
    answers.set('/stale', {
      status: 409,
      type: 'application/problem+json',
      body: JSON.stringify({ type: '/_fencegate/problems/stale-fence', title: 'Stale execution fence', status: 409 }),
    });
    answers.set('/expired', {
      status: 409,
      type: 'application/problem+json',
      body: JSON.stringify({ type: 'https://gw.example/problems/fence-expired', status: 409 }),
    });
    answers.set('/stripe', { status: 409, body: JSON.stringify({ error: { type: 'invalid_request_error', code: 'stale_fence' } }) });
    for (const path of ['/stale', '/expired', '/stripe']) {
      const { ctx, lost } = context();
      const err = await createFencedFetch(ctx)(`${base}${path}`, { step: 'charge' }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(LeaseLostError);
      expect(lost).toEqual(['stale_fence']);
      // An expired fence is said to be one, never "a newer owner".
      expect((err as Error).message).toMatch(path === '/expired' ? /as expired \(fence-expired\)/ : /a newer owner holds it/);
    }
  });

  test('other 409s are answers, not lease loss', async () => {
    answers.set('/busy', {
      status: 409,
      type: 'application/problem+json',
      body: JSON.stringify({ type: '/_fencegate/problems/idempotency-in-progress', status: 409 }),
    });
    const { ctx, lost } = context();
    expect((await createFencedFetch(ctx)(`${base}/busy`, { step: 'charge' })).status).toBe(409);
    expect(lost).toEqual([]);
  });

  test('a timeout is outcome unknown (it may have happened); a refused connection is a plain error (it did not)', async () => {
    answers.set('/slow', { status: 200, body: '{}', delayMs: 2_000 });
    const { ctx } = context();
    await expect(createFencedFetch(ctx)(`${base}/slow`, { step: 'charge', timeoutMs: 50 })).rejects.toBeInstanceOf(OutcomeUnknownError);

    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const err = await createFencedFetch(ctx)(`http://127.0.0.1:${port}/x`, { step: 'charge' }).catch((e: unknown) => e);
    expect(err).not.toBeInstanceOf(OutcomeUnknownError);
    expect((err as { cause?: { code?: string } }).cause?.code).toBe('ECONNREFUSED');
  });

  test('a redirect is not followed: the handler gets the 307, the Location never sees the fenced command (unless the caller asks)', async () => {
    const elsewhere: IncomingHttpHeaders[] = [];
    const target = createServer((req, res) => {
      elsewhere.push(req.headers);
      res.writeHead(201, { 'content-type': 'application/json' }).end('{}');
    });
    await new Promise<void>((resolve) => target.listen(0, '127.0.0.1', resolve));
    const location = `http://127.0.0.1:${(target.address() as AddressInfo).port}/direct`;
    const redirecting = createServer((_req, res) => res.writeHead(307, { location }).end());
    await new Promise<void>((resolve) => redirecting.listen(0, '127.0.0.1', resolve));
    const from = `http://127.0.0.1:${(redirecting.address() as AddressInfo).port}/payments/charges`;
    try {
      const { ctx } = context();
      const res = await createFencedFetch(ctx)(from, { step: 'charge', method: 'POST', body: '{"amount":1}' });
      expect(res.status).toBe(307);
      expect(elsewhere).toHaveLength(0);
      // Control: the caller's own redirect: 'follow' does send it on, fence and key included.
      const followed = await createFencedFetch(ctx)(from, { step: 'charge', method: 'POST', body: '{"amount":1}', redirect: 'follow' });
      expect(followed.status).toBe(201);
      expect(elsewhere).toHaveLength(1);
      expect(elsewhere[0]!['idempotency-key']).toBe('tool-job:5f0c9e:42:charge');
      // Followed on the caller's word to a place that refuses: the first hop had the command, so unknown.
      target.closeAllConnections();
      await new Promise((resolve) => target.close(resolve));
      const refusedAfter = await createFencedFetch(ctx)(from, { step: 'charge', method: 'POST', body: '{"amount":1}', redirect: 'follow' }).catch(
        (e: unknown) => e,
      );
      expect(refusedAfter).toBeInstanceOf(OutcomeUnknownError);
    } finally {
      redirecting.closeAllConnections();
      target.closeAllConnections();
      await new Promise((resolve) => redirecting.close(resolve));
      if (target.listening) await new Promise((resolve) => target.close(resolve));
    }
  });

  test('losing the lease aborts a request in flight with the lease error', async () => {
    answers.set('/hang', { status: 200, body: '{}', delayMs: 2_000 });
    const { ctx, controller } = context();
    const pending = createFencedFetch(ctx)(`${base}/hang`, { step: 'charge' });
    controller.abort(new LeaseLostError('gone'));
    await expect(pending).rejects.toThrow('gone');
  });

  test('the Idempotency-Key is built from the job key, also when a custom fence key names the entity', async () => {
    const { ctx } = context({ fenceKey: 'invoice:77' });
    await createFencedFetch(ctx)(`${base}/payments/custom`, { step: 'charge', method: 'POST', body: '{}' });
    expect(seen.at(-1)!.headers).toMatchObject({ 'x-fence-entity': 'invoice:77', 'idempotency-key': 'tool-job:5f0c9e:42:charge' });
  });

  test('a context without a job key sends nothing (the job id alone would collide across job stores)', async () => {
    const before = seen.length;
    const { ctx, events } = context({ jobKey: undefined as unknown as string });
    await expect(createFencedFetch(ctx)(`${base}/payments/x`, { step: 'charge' })).rejects.toMatchObject({ code: 'invalid_input' });
    await expect(createStep(ctx)('receipt', () => 'ran')).rejects.toMatchObject({ code: 'invalid_input' });
    expect(seen.length).toBe(before);
    expect(events).toEqual([]);
  });

  test('reports each request as in flight from its start until it is answered or fails', async () => {
    answers.set('/held', { status: 200, body: '{}', delayMs: 300 });
    const inFlight = new Set<unknown>();
    const { ctx, events } = context({
      started(request) {
        inFlight.add(request);
        return () => inFlight.delete(request);
      },
    });
    const pending = createFencedFetch(ctx)(`${base}/held`, { step: 'charge', method: 'POST', body: '{}' });
    await vi.waitFor(() => expect(seen.at(-1)?.path).toBe('/held'));
    const started = events.find((e) => e.type === 'tool_request_started')!;
    expect([...inFlight]).toEqual([
      { step: 'charge', idempotencyKey: 'tool-job:5f0c9e:42:charge', requestId: (started as { requestId: string }).requestId, startedAt: expect.any(Date) },
    ]);
    await pending;
    expect(inFlight.size).toBe(0);

    answers.set('/slow-2', { status: 200, body: '{}', delayMs: 2_000 });
    await expect(createFencedFetch(ctx)(`${base}/slow-2`, { step: 'charge', timeoutMs: 50 })).rejects.toBeInstanceOf(OutcomeUnknownError);
    expect(inFlight.size).toBe(0);

    const step = createStep(ctx);
    let during: unknown[] = [];
    await step('receipt', () => (during = [...inFlight]));
    expect(during).toEqual([expect.objectContaining({ step: 'receipt', idempotencyKey: 'tool-job:5f0c9e:42:receipt' })]);
    expect(inFlight.size).toBe(0);
  });

  test('step names are checked (they become part of the Idempotency-Key)', async () => {
    const { ctx } = context();
    await expect(createFencedFetch(ctx)(`${base}/x`, { step: 'has space' })).rejects.toThrow(/step must match/);
    await expect(createFencedFetch(ctx)(`${base}/x`, { step: '' })).rejects.toThrow(/step must match/);
  });

  test('the signed-fence seam: a fenceSigner turns {ent, fence, sub, exp} into the header value', async () => {
    const { ctx } = context();
    const claims: unknown[] = [];
    const fencedFetch = createFencedFetch(ctx, {
      fenceSigner: (c) => {
        claims.push(c);
        return 'header.payload.signature';
      },
    });
    await fencedFetch(`${base}/signed`, { step: 'charge' });
    expect(claims).toEqual([{ ent: 'tool-job:5f0c9e:42', fence: 7, sub: 'w1', exp: Date.parse('2030-01-01T00:00:30Z') / 1000 }]);
    expect(seen.at(-1)!.headers['x-execution-fence']).toBe('header.payload.signature');
  });

  test('header names follow the gateway route’s configuration', async () => {
    const { ctx } = context();
    await createFencedFetch(ctx, { headers: { fence: 'Fence', entity: 'Fence-Entity' } })(`${base}/renamed`, { step: 'charge' });
    expect(seen.at(-1)!.headers).toMatchObject({ fence: '7', 'fence-entity': 'tool-job:5f0c9e:42', 'idempotency-key': 'tool-job:5f0c9e:42:charge' });
  });
});

describe('step', () => {
  test('gives a non-HTTP action the same check, key and fence, and reports it', async () => {
    const { ctx, events } = context();
    const step = createStep(ctx);
    const got = await step('receipt', (s) => s);
    expect(got).toMatchObject({ idempotencyKey: 'tool-job:5f0c9e:42:receipt', fence: '7', fenceKey: 'tool-job:5f0c9e:42' });
    expect(events).toEqual([expect.objectContaining({ type: 'tool_request_started', step: 'receipt', requestId: got.requestId })]);

    const refused = createStep(
      context({
        assertCanStart: () => {
          throw new LeaseLostError('gone');
        },
      }).ctx,
    );
    let ran = false;
    await expect(refused('receipt', () => (ran = true))).rejects.toBeInstanceOf(LeaseLostError);
    expect(ran).toBe(false);
  });
});

describe("fencedFetch and the gateway's reconciling hint (DESIGN §3.12, §6.4)", () => {
  /** The gateway's 409 outcome-unknown; with `reconciling` and `retryAfter` as a route with `reconcile` sends it. */
  const outcomeUnknown = (hint: { reconciling?: boolean; retryAfter?: string } = { reconciling: true, retryAfter: '1' }) =>
    new Response(
      JSON.stringify({
        type: '/_fencegate/problems/outcome-unknown',
        title: 'Outcome of an earlier attempt is unknown',
        status: 409,
        detail: 'an earlier attempt with this key may have reached the upstream',
        idempotency_key: 'tool-job:5f0c9e:42:charge',
        ...(hint.reconciling === undefined ? {} : { reconciling: hint.reconciling }),
      }),
      { status: 409, headers: { 'content-type': 'application/problem+json', ...(hint.retryAfter === undefined ? {} : { 'retry-after': hint.retryAfter }) } },
    );
  const reconciled = () =>
    new Response('{"id":"ch_1"}', {
      status: 200,
      headers: { 'content-type': 'application/json', 'fencegate-reconciled': 'true', 'idempotent-replayed': 'true' },
    });
  /** A fetch that answers `answers` in order and records what each send carried. */
  function scripted(...answers: Response[]) {
    const sent: { at: number; headers: Headers; body: unknown }[] = [];
    const fetch = (async (_url: URL, init: RequestInit) => {
      sent.push({ at: Date.now(), headers: new Headers(init.headers), body: init.body });
      return answers.shift()!;
    }) as unknown as typeof globalThis.fetch;
    return { fetch, sent };
  }
  const charge = { step: 'charge', method: 'POST', body: '{"amount":500}' };

  test('waits Retry-After and sends the same request again; the reconciled answer is returned and reported with its key and request id', async () => {
    const { ctx, events } = context();
    const { fetch, sent } = scripted(outcomeUnknown(), reconciled());
    const res = await createFencedFetch(ctx, { fetch })(`${base}/payments/charges`, charge);
    expect(res.status).toBe(200);
    expect(sent).toHaveLength(2);
    expect(sent[1]!.at - sent[0]!.at).toBeGreaterThanOrEqual(990);
    for (const name of ['x-execution-fence', 'x-fence-entity', 'idempotency-key', 'x-request-id'])
      expect(sent[1]!.headers.get(name)).toBe(sent[0]!.headers.get(name));
    expect(sent[1]!.body).toBe(sent[0]!.body);
    const requestId = sent[0]!.headers.get('x-request-id');
    expect(events.map((e) => e.type)).toEqual(['tool_request_started', 'outcome_reconciled']);
    expect(events[1]).toMatchObject({ step: 'charge', idempotencyKey: 'tool-job:5f0c9e:42:charge', requestId, waits: 1, fencingToken: 7 });
  });

  test("the route's Stripe error shape carries the same hint", async () => {
    const { ctx, events } = context();
    const stripe = new Response(JSON.stringify({ error: { type: 'idempotency_error', code: 'outcome_unknown', reconciling: true, retry_after: 1 } }), {
      status: 409,
      headers: { 'content-type': 'application/json', 'retry-after': '1', 'stripe-should-retry': 'false' },
    });
    const { fetch, sent } = scripted(stripe, reconciled());
    const res = await createFencedFetch(ctx, { fetch })(`${base}/payments/charges`, charge);
    expect(res.status).toBe(200);
    expect(sent).toHaveLength(2);
    expect(events.at(-1)).toMatchObject({ type: 'outcome_reconciled', waits: 1 });
  });

  test('never waits past what the confirmed lease covers: stops and hands the 409 on', async () => {
    // A lease confirmed for 1.5 s more and never extended: one 1 s wait fits, a second does not.
    const until = Date.now() + 1_500;
    const { ctx, events } = context({ waitableMs: () => until - Date.now() });
    const { fetch, sent } = scripted(outcomeUnknown(), outcomeUnknown(), reconciled());
    const res = await createFencedFetch(ctx, { fetch })(`${base}/payments/charges`, charge);
    expect(res.status).toBe(409);
    expect(sent).toHaveLength(2);
    expect(Date.now()).toBeLessThan(until);
    expect(events.map((e) => e.type)).toEqual(['tool_request_started']);
  });

  // Negative controls: each of these is handed to the handler on the first answer, as before the hint.
  test.each([
    ['a 409 outcome-unknown without the hint (a route without reconcile)', () => outcomeUnknown({}), charge.body],
    ['reconciling without Retry-After', () => outcomeUnknown({ reconciling: true }), charge.body],
    ['a Retry-After over the bound of one wait', () => outcomeUnknown({ reconciling: true, retryAfter: '61' }), charge.body],
    ['a body that cannot be sent twice (a stream)', () => outcomeUnknown(), 'stream'],
  ])('%s: no wait, no resend', async (_, answer, body) => {
    const { ctx } = context();
    const { fetch, sent } = scripted(answer(), reconciled());
    const sentBody = body === 'stream' ? new Blob([charge.body]).stream() : body;
    const res = await createFencedFetch(ctx, { fetch })(`${base}/payments/charges`, {
      ...charge,
      body: sentBody,
      ...(body === 'stream' ? { duplex: 'half' } : {}),
    } as never);
    expect(res.status).toBe(409);
    expect(sent).toHaveLength(1);
  });

  test('the lease ending during the wait ends the wait: nothing more is sent', async () => {
    const { ctx, controller } = context();
    const { fetch, sent } = scripted(outcomeUnknown({ reconciling: true, retryAfter: '30' }), reconciled());
    const pending = createFencedFetch(ctx, { fetch })(`${base}/payments/charges`, charge);
    setTimeout(() => controller.abort(new LeaseLostError('lease lost in the test')), 50);
    await expect(pending).rejects.toBeInstanceOf(LeaseLostError);
    expect(sent).toHaveLength(1);
  });

  test('a reconciled answer on the first send is reported too (waits: 0)', async () => {
    const { ctx, events } = context();
    const { fetch } = scripted(reconciled());
    await createFencedFetch(ctx, { fetch })(`${base}/payments/charges`, charge);
    expect(events.at(-1)).toMatchObject({ type: 'outcome_reconciled', waits: 0 });
  });
});
