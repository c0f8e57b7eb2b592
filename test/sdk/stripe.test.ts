import { rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import Stripe from 'stripe';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import type { ConfigInput } from '../../src/config/schema.js';
import { startGateway, type RunningGateway } from '../../src/entry/node.js';
import { silentLogger } from '../../src/http/logger.js';
import { tempDir } from '../helpers/temp.js';

/**
 * A real provider SDK (stripe-node) as the client (DESIGN §3.8, the
 * `stripe` error shape). What matters is what the APPLICATION sees: a
 * refusal must surface as an SDK error, never as a charge object, and must
 * not set off a retry storm.
 */

interface FakeStripe {
  server: Server;
  url: string;
  /** Every charge the fake made (one per effect). */
  charges: { id: string; amount: number; key: string | undefined }[];
  /** Make the next charge answer after `ms`. */
  delayNext(ms: number): void;
  /** Make the next charge fail with a 500 (after creating nothing). */
  failNext(): void;
}

/** A Stripe-shaped upstream that is deliberately NOT idempotent. */
async function startFakeStripe(): Promise<FakeStripe> {
  const charges: FakeStripe['charges'] = [];
  let delay = 0;
  let fail = false;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const form = new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
      const answer = () => {
        if (fail) {
          fail = false;
          res.writeHead(500, { 'content-type': 'application/json', 'request-id': 'req_failed' });
          res.end(JSON.stringify({ error: { type: 'api_error', message: 'upstream exploded' } }));
          return;
        }
        const charge = { id: `ch_${charges.length + 1}`, object: 'charge', amount: Number(form.get('amount')), currency: form.get('currency') };
        charges.push({ id: charge.id, amount: charge.amount, key: req.headers['idempotency-key'] as string | undefined });
        res.writeHead(200, { 'content-type': 'application/json', 'request-id': `req_${charge.id}` });
        res.end(JSON.stringify(charge));
      };
      const ms = delay;
      delay = 0;
      if (ms > 0) setTimeout(answer, ms);
      else answer();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    server,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    charges,
    delayNext: (ms) => (delay = ms),
    failNext: () => (fail = true),
  };
}

const dir = tempDir('fencegate-sdk-').dir;
let upstream: FakeStripe;
const gateways: RunningGateway[] = [];

beforeAll(async () => {
  upstream = await startFakeStripe();
});
afterEach(async () => {
  await Promise.all(gateways.splice(0).map((g) => g.close()));
  upstream.charges.length = 0;
});
afterAll(async () => {
  await new Promise((r) => upstream.server.close(r));
  rmSync(dir, { recursive: true, force: true });
});

let dbSeq = 0;
async function gatewayWith(errors: 'stripe' | 'problem'): Promise<{ stripe: Stripe; gateway: RunningGateway }> {
  const input: ConfigInput = {
    listen: { host: '127.0.0.1', port: 0 },
    store: { sqlite: join(dir, `sdk-${++dbSeq}.db`) },
    routes: [
      {
        name: 'stripe',
        match: { path: '/v1/*', methods: ['POST'] },
        upstream: upstream.url,
        entity: { header: 'X-Fence-Entity' },
        fence: 'optional',
        idempotency: 'required',
        mode: 'serial',
        timeoutMs: 5_000,
        errors,
      },
    ],
  };
  const gateway = await startGateway({ config: parseConfig(input), logger: silentLogger });
  gateways.push(gateway);
  const { port } = new URL(gateway.url);
  const stripe = new Stripe('sk_test_fencegate', {
    host: '127.0.0.1',
    port: Number(port),
    protocol: 'http',
    maxNetworkRetries: 3,
    telemetry: false,
  });
  return { stripe, gateway };
}

async function rejections(gateway: RunningGateway, reason: string): Promise<number> {
  const page = await gateway.gateway.store.listRejections({ reason, limit: 1000 });
  return page.items.length;
}

describe('stripe-node through fencegate (errors: "stripe")', () => {
  it('a charge goes through once and the application gets it', async () => {
    const { stripe } = await gatewayWith('stripe');
    const charge = await stripe.charges.create({ amount: 1200, currency: 'usd' });
    expect(charge.id).toBe('ch_1');
    expect(charge.amount).toBe(1200);
    expect(charge.lastResponse.requestId).toBe('req_ch_1'); // the upstream's Request-Id passes through
    expect(upstream.charges).toHaveLength(1);
  });

  it('a client timeout with automatic retries yields exactly one upstream charge, and the client gets it', async () => {
    const { stripe } = await gatewayWith('stripe');
    upstream.delayNext(900); // longer than the SDK's timeout below
    const charge = await stripe.charges.create({ amount: 5000, currency: 'usd' }, { timeout: 300, maxNetworkRetries: 8 });
    expect(charge.id).toBe('ch_1');
    expect(charge.amount).toBe(5000);
    expect(upstream.charges).toHaveLength(1);
    // The answer came from the stored response, not a second execution.
    expect(charge.lastResponse.headers['idempotent-replayed']).toBe('true');
  });

  it('a reused key with another amount throws the SDK idempotency error and charges nothing', async () => {
    const { stripe } = await gatewayWith('stripe');
    await stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: 'order-7' });
    const err = await stripe.charges.create({ amount: 999, currency: 'usd' }, { idempotencyKey: 'order-7' }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Stripe.errors.StripeError);
    const e = err as InstanceType<typeof Stripe.errors.StripeError>;
    expect(e.rawType).toBe('idempotency_error');
    expect(e.code).toBe('idempotency_key_reused');
    expect(e.statusCode).toBe(422);
    expect(upstream.charges.map((c) => c.amount)).toEqual([100]);
  });

  it('a stale fence surfaces as an error after ONE attempt (Stripe-Should-Retry: false, no retry storm)', async () => {
    const { stripe, gateway } = await gatewayWith('stripe');
    const fenced = (fence: number, key: string) => ({ idempotencyKey: key, headers: { 'X-Execution-Fence': String(fence), 'X-Fence-Entity': 'tool-job:9' } });
    await stripe.charges.create({ amount: 700, currency: 'usd' }, fenced(42, 'job-9-w2'));
    const err = await stripe.charges.create({ amount: 700, currency: 'usd' }, { ...fenced(41, 'job-9-w1'), maxNetworkRetries: 5 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Stripe.errors.StripeError);
    const e = err as InstanceType<typeof Stripe.errors.StripeError>;
    expect(e.code).toBe('stale_fence');
    expect(e.statusCode).toBe(409);
    expect(e.headers?.['stripe-should-retry']).toBe('false');
    expect(upstream.charges).toHaveLength(1);
    // The SDK asked once: one refusal in the log, not 1 + maxNetworkRetries.
    expect(await rejections(gateway, 'stale-fence')).toBe(1);
  });

  it('an upstream 500 is replayed to the retries, never re-executed', async () => {
    const { stripe } = await gatewayWith('stripe');
    upstream.failNext();
    const err = await stripe.charges.create({ amount: 300, currency: 'usd' }, { idempotencyKey: 'boom-1', maxNetworkRetries: 2 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Stripe.errors.StripeAPIError);
    const e = err as InstanceType<typeof Stripe.errors.StripeAPIError>;
    expect(e.message).toBe('upstream exploded');
    expect(e.headers?.['idempotent-replayed']).toBe('true'); // the retries got the stored 500
    expect(upstream.charges).toHaveLength(0);
    // And the stored 500 is what a later retry sees too: still nothing charged.
    await expect(stripe.charges.create({ amount: 300, currency: 'usd' }, { idempotencyKey: 'boom-1', maxNetworkRetries: 0 })).rejects.toThrow(
      'upstream exploded',
    );
    expect(upstream.charges).toHaveLength(0);
  });
});

describe('negative control: the same route with errors: "problem"', () => {
  it('the SDK takes a 422 idempotency-key-reused problem body for a successful charge', async () => {
    const { stripe } = await gatewayWith('problem');
    await stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: 'order-8' });
    // This is why `errors: "stripe"` exists: the refusal does not throw.
    const looksLikeCharge = (await stripe.charges.create({ amount: 999, currency: 'usd' }, { idempotencyKey: 'order-8' })) as unknown as Record<
      string,
      unknown
    >;
    expect(String(looksLikeCharge.type)).toMatch(/\/idempotency-key-reused$/);
    expect(upstream.charges).toHaveLength(1);
  });
});
