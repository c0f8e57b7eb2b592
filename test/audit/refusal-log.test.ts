/**
 * The 400s of a malformed or missing fence, entity or key go to the
 * rejection log (DESIGN §3.11, src/http/refusal-log.ts), through a real Node
 * gateway on loopback on the SQLite store: each code with its presented
 * value quoted and cut to REJECTION_TEXT_LIMITS.presented, a JWS only as
 * length and hash, never the query string. Other refusals write no row, and
 * a store that cannot write the row changes nothing in the answer.
 *
 * Negative controls: `payload-too-large` and `no-route` (codes not in the
 * set) leave the table empty, so a hook that logged every refusal fails
 * here; the cut value is compared with a 5000-character input, so a hook
 * that did not cut fails too.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { CUT_MARKER, cutText, REJECTION_TEXT_LIMITS } from '../../src/store/bounds.js';
import { delegate } from '../helpers/delegate.js';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream } from '../helpers/upstream.js';
import { mcpRoute, rawPost } from '../mcp/harness.js';
import { startMcpUpstream } from '../mcp/mcp-upstream.js';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

type Row = Record<string, string | null>;
const rows = (gw: TestGateway): Row[] => gw.sqlite.db.prepare('SELECT * FROM rejections ORDER BY id').all() as Row[];

async function gateway(options: Parameters<typeof startTestGateway>[0] extends infer O ? Partial<O> : never = {}) {
  const up = await startUpstream();
  cleanups.push(() => up.close());
  const mcp = await startMcpUpstream({ stateful: false, json: true });
  cleanups.push(() => mcp.close());
  const gw = await startTestGateway({
    routes: [paymentsRoute(up.url, { maxBodyBytes: 64 }), mcpRoute(mcp.url) as ReturnType<typeof paymentsRoute>],
    ...options,
  });
  cleanups.push(() => gw.close());
  return { gw, up };
}

describe('the rejection log keeps the 400s of a malformed or missing fence, entity or key', () => {
  it('one row per code, with the presented value quoted and cut; never the query string; the upstream never reached', async () => {
    const { gw, up } = await gateway();
    const secret = 'SECRET-in-query-3f9a';
    const long = `x${'9'.repeat(4999)}`;
    const cases: [code: string, r: Parameters<typeof command>[2]][] = [
      ['invalid-fence', { fence: long, entity: 'acct:1', key: 'k-1' }],
      ['missing-fence', { entity: 'acct:1', key: 'k-2' }],
      ['invalid-entity', { fence: 1, entity: 'acct:1, acct:2', key: 'k-3' }],
      ['missing-entity', { fence: 1, key: 'k-4' }],
      ['invalid-idempotency-key', { fence: 1, entity: 'acct:1', key: 'a,b' }],
      ['missing-idempotency-key', { fence: 1, entity: 'acct:1' }],
    ];
    for (const [code, r] of cases) {
      const res = await command(gw.url, `/payments/p1?token=${secret}`, r);
      expect(res.status, code).toBe(400);
      expect(((await res.json()) as { type: string }).type).toMatch(new RegExp(`/${code}$`));
    }
    const logged = rows(gw);
    expect(logged.map((r) => r.reason)).toEqual(cases.map(([c]) => c));
    for (const r of logged) {
      expect(r).toMatchObject({ path: '/payments/p1', method: 'POST', tool: null, payload_sha256: null });
      expect(r.request_id).toMatch(/^[0-9a-f-]{36}$/);
    }
    expect(JSON.stringify(logged)).not.toContain(secret);
    // The fence as presented, quoted and cut to the bound; the whole 5000 characters nowhere.
    const fence = logged[0]!.detail!;
    expect(fence).toContain(`presented ${JSON.stringify(cutText(long, REJECTION_TEXT_LIMITS.presented))}`);
    expect(fence).toContain(CUT_MARKER);
    expect(fence.length).toBeLessThan(REJECTION_TEXT_LIMITS.presented + 200);
    expect(logged[2]!.detail).toContain('presented "acct:1, acct:2"');
    expect(logged[4]!.detail).toContain('presented "a,b"');
    expect(logged[1]!.detail).not.toContain('presented');
    expect(up.calls).toHaveLength(0);
  });

  it('a JWS in the fence header is logged as its length and a short hash, never the token', async () => {
    const { gw } = await gateway();
    const jws = 'eyJhbGciOiJIUzI1NiJ9.eyJmZW5jZSI6IjcifQ.c2lnbmF0dXJlLW9mLWEtYmVhcmVy';
    expect((await command(gw.url, '/payments/p1', { fence: jws, entity: 'acct:1', key: 'k-1' })).status).toBe(400);
    const [row] = rows(gw);
    expect(row!.reason).toBe('invalid-fence');
    expect(row!.detail).toMatch(new RegExp(`presented a JWS of ${jws.length} characters, sha256 [0-9a-f]{16}$`));
    expect(JSON.stringify(row)).not.toContain('c2lnbmF0dXJl');
  });

  it('negative control: refusals outside the set (payload-too-large, no-route) write no row', async () => {
    const { gw } = await gateway();
    const big = await command(gw.url, '/payments/p1', { fence: 1, entity: 'acct:1', key: 'k-1', body: JSON.stringify({ pad: 'p'.repeat(200) }) });
    expect(big.status).toBe(413);
    expect((await fetch(`${gw.url}/nowhere`, { method: 'POST' })).status).toBe(404);
    expect(rows(gw)).toEqual([]);
  });

  it('a tools/call with a malformed _meta fence is logged with its tool and value', async () => {
    const { gw } = await gateway();
    const res = await rawPost(
      `${gw.url}/mcp`,
      JSON.stringify({
        jsonrpc: '2.0',
        id: 7,
        method: 'tools/call',
        params: {
          name: 'create_ticket',
          arguments: { title: 't' },
          _meta: { 'io.fencegate/fence': '07', 'io.fencegate/entity': 'job', 'io.fencegate/idempotency-key': 'k' },
        },
      }),
    );
    expect(((await res.json()) as { error: { data: { type: string } } }).error.data.type).toMatch(/invalid-fence$/);
    const [row] = rows(gw);
    expect(row).toMatchObject({ reason: 'invalid-fence', tool: 'create_ticket', path: '/mcp' });
    expect(row!.detail).toContain('presented "07"');
  });

  it('a store that cannot write the row changes nothing in the answer; the fault is logged as store-error', async () => {
    const logs: Record<string, unknown>[] = [];
    const keep = (msg: string, fields?: Record<string, unknown>) => void logs.push({ msg, ...fields });
    const { gw } = await gateway({
      logger: { info: keep, warn: keep, error: keep },
      wrapStore: (s) => delegate(s, { recordRejection: () => Promise.reject(new Error('disk full')) }),
    });
    const res = await command(gw.url, '/payments/p1', { fence: 'nope', entity: 'acct:1', key: 'k-1' });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { type: string }).type).toMatch(/\/invalid-fence$/);
    expect(rows(gw)).toEqual([]);
    expect(logs).toContainEqual(
      expect.objectContaining({ msg: 'store-error', phase: 'rejection-log', reason: 'invalid-fence', error: expect.stringContaining('disk full') }),
    );
    expect(logs.filter((l) => l.msg === 'decision').map((l) => [l.decision, l.status])).toEqual([['invalid-fence', 400]]);
  });
});
