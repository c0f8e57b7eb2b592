import { afterEach, describe, expect, it, vi } from 'vitest';
import { MCP_META } from '../../src/protocol/mcp.js';
import { snapshot } from '../helpers/gateway.js';
import { mcpRoute, rawPost, startMcpGateway } from './harness.js';
import { rawUpstream, type RawUpstream } from './raw-upstream.js';
import { fold } from '../helpers/fold-switch.js';

// A tools/call whose params (or params._meta) hold a member that differs only
// in case from one the route reads: `_Meta`, `IdempotencyKey`, `Arguments`,
// `Name`, `io.fencegate/Fence`. JSON.parse finds no `_meta` there, so before
// this check the call was decided without the fence, entity or key it
// carries, while an MCP server that decodes like Go's encoding/json (member
// names matched case-insensitively) reads them and acts (DESIGN §3.3; names
// folded as in §3.4, as the message's `method` already is, docs/mcp.md "What
// is decided, what passes"). Refused as the route refuses a malformed call: a
// JSON-RPC error `invalid-request`, nothing stored, nothing forwarded. The
// fold is switchable here (`fold.mode`): with `none` the checks are off, and
// the controls show the calls then get through.

vi.mock('../../src/core/json-duplicates.js', async (original) => (await import('../helpers/fold-switch.js')).foldSwitched(await original()));

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  fold.mode = 'real';
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Go encoding/json v1 matching of a struct tag: exact first, else case-insensitive with ſ→s, K→k. */
const goFold = (s: string) =>
  s
    .replace(/\u017f/g, 's')
    .replace(/\u212a/g, 'k')
    .toLowerCase();
function goField(obj: unknown, tag: string): unknown {
  if (obj === null || typeof obj !== 'object') return undefined;
  const o = obj as Record<string, unknown>;
  if (Object.hasOwn(o, tag)) return o[tag];
  const k = Object.keys(o).find((key) => goFold(key) === goFold(tag));
  return k === undefined ? undefined : o[k];
}

interface Ran {
  name: unknown;
  fence: unknown;
  entity: unknown;
  key: unknown;
}

/** An MCP server that decodes as a Go server on encoding/json v1 does, recording what each tools/call it ran carried. */
async function goLikeServer(): Promise<RawUpstream & { ran: Ran[] }> {
  const ran: Ran[] = [];
  const up = await rawUpstream((_req, res, body) => {
    const m = JSON.parse(body) as unknown;
    if (goField(m, 'method') === 'tools/call') {
      const params = goField(m, 'params');
      const meta = goField(params, '_meta');
      ran.push({
        name: goField(params, 'name'),
        fence: goField(meta, MCP_META.fence),
        entity: goField(meta, MCP_META.entity),
        key: goField(meta, MCP_META.idempotencyKey) ?? goField(params, 'idempotencyKey'),
      });
    }
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ jsonrpc: '2.0', id: goField(m, 'id'), result: { content: [{ type: 'text', text: 'paid' }] } }));
  });
  cleanups.push(() => up.close());
  return Object.assign(up, { ran });
}

async function setup(overrides: Record<string, unknown> = {}) {
  const up = await goLikeServer();
  const gw = await startMcpGateway([mcpRoute(up.url, { fence: 'optional', idempotency: 'optional', ...overrides })]);
  cleanups.push(() => gw.close());
  return { up, gw };
}

const call = (params: Record<string, unknown>, id = 1) => JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params });

interface Answer {
  status: number;
  refusal: string | null;
  body: { id: unknown; result?: unknown; error?: { code: number; message: string; data: { type: string; detail: string } } };
}
async function post(url: string, body: string): Promise<Answer> {
  const res = await rawPost(`${url}/mcp`, body);
  return { status: res.status, refusal: res.headers.get('x-fencegate-refusal'), body: (await res.json()) as Answer['body'] };
}

/** The fence, entity and key under their exact names. */
const META = { [MCP_META.fence]: '5', [MCP_META.entity]: 'bob', [MCP_META.idempotencyKey]: 'k-secret-1' };
/** Each refused shape, and the same call with the exact names (its negative control). */
const shapes: [string, Record<string, unknown>, Record<string, unknown>][] = [
  ['_Meta', { name: 'pay', arguments: {}, _Meta: META }, { name: 'pay', arguments: {}, _meta: META }],
  ['_META', { name: 'pay', arguments: {}, _META: META }, { name: 'pay', arguments: {}, _meta: META }],
  ['IdempotencyKey', { name: 'pay', arguments: {}, IdempotencyKey: 'k-secret-1' }, { name: 'pay', arguments: {}, idempotencyKey: 'k-secret-1' }],
  // `Name` and `Arguments` were refused before as well (no name; the arguments' digest refuses a folded pointer, src/core/fingerprint.ts): kept so every member is covered.
  ['Name', { Name: 'pay', arguments: {} }, { name: 'pay', arguments: {} }],
  ['Arguments', { name: 'pay', Arguments: { amount: 1 } }, { name: 'pay', arguments: { amount: 1 } }],
  [
    '_meta fence',
    { name: 'pay', arguments: {}, _meta: { 'IO.fencegate/Fence': '5', [MCP_META.entity]: 'bob' } },
    { name: 'pay', arguments: {}, _meta: { [MCP_META.fence]: '5', [MCP_META.entity]: 'bob' } },
  ],
  [
    '_meta entity',
    { name: 'pay', arguments: {}, _meta: { 'io.fencegate/Entity': 'bob' } },
    { name: 'pay', arguments: {}, _meta: { [MCP_META.entity]: 'bob' } },
  ],
  [
    '_meta key',
    { name: 'pay', arguments: {}, _meta: { 'io.fencegate/idempotency-KEY': 'k-secret-1' } },
    { name: 'pay', arguments: {}, _meta: { [MCP_META.idempotencyKey]: 'k-secret-1' } },
  ],
  [
    '_meta key with K (Kelvin sign)',
    { name: 'pay', arguments: {}, _meta: { 'io.fencegate/idempotency-\u212aey': 'k-secret-1' } },
    { name: 'pay', arguments: {}, _meta: { [MCP_META.idempotencyKey]: 'k-secret-1' } },
  ],
];

describe('tools/call params: a member that differs only in case from one the route reads is invalid-request', () => {
  it.each(shapes)('%s: a JSON-RPC invalid-request error to the call, nothing stored, nothing forwarded', async (c, params) => {
    const { up, gw } = await setup();
    const before = snapshot(gw.sqlite);
    const a = await post(gw.url, call(params, 41));
    expect(a.status).toBe(200);
    expect(a.refusal).toBe('invalid-request');
    expect(a.body.id).toBe(41);
    expect(a.body.error).toMatchObject({ code: -32007, data: { type: 'invalid-request' } });
    // A lone `Name` is a call without a name, refused as such (the reason is still true).
    expect(a.body.error!.data.detail).toContain(c === 'Name' ? 'params.name must be a non-empty string' : 'differs only in case');
    expect(a.body.error!.message).not.toContain('k-secret-1');
    expect(up.seen).toHaveLength(0);
    expect(snapshot(gw.sqlite)).toBe(before);
  });

  it.each(shapes)('%s control: the same call with the exact names is decided and runs', async (_c, _folded, exact) => {
    const { up, gw } = await setup();
    const a = await post(gw.url, call(exact, 42));
    expect(a.refusal, JSON.stringify(a.body)).toBeNull();
    expect(a.body.result).toBeDefined();
    expect(up.ran).toHaveLength(1);
  });
});

describe('the gap, with the fold switched off', () => {
  it('`_Meta` carries a stale fence past the check: the gateway saw no fence, the upstream runs it as fence 5 for bob', async () => {
    const { up, gw } = await setup();
    // bob's fence is at 9.
    expect(
      (await post(gw.url, call({ name: 'pay', arguments: {}, _meta: { ...META, [MCP_META.fence]: '9', [MCP_META.idempotencyKey]: 'k-9' } }))).body.result,
    ).toBeDefined();
    // The stale fence under the exact name is refused.
    expect((await post(gw.url, call({ name: 'pay', arguments: {}, _meta: META }))).refusal).toBe('stale-fence');
    // Under `_Meta`: refused with the check; with it off, admitted as a call with no fence, entity or key.
    expect((await post(gw.url, call({ name: 'pay', arguments: {}, _Meta: META }))).refusal).toBe('invalid-request');
    fold.mode = 'none';
    const a = await post(gw.url, call({ name: 'pay', arguments: {}, _Meta: META }));
    expect(a.refusal).toBeNull();
    expect(up.ran.at(-1)).toEqual({ name: 'pay', fence: '5', entity: 'bob', key: 'k-secret-1' });
  });

  it('`IdempotencyKey` is no key to the gateway: with the check off, a retry runs twice', async () => {
    const { up, gw } = await setup();
    const params = { name: 'pay', arguments: {}, IdempotencyKey: 'k-once' };
    fold.mode = 'none';
    await post(gw.url, call(params, 1));
    await post(gw.url, call(params, 2));
    expect(up.ran).toHaveLength(2);
    // Under the exact name the retry is the stored answer.
    fold.mode = 'real';
    const exact = { name: 'pay', arguments: {}, idempotencyKey: 'k-exact' };
    await post(gw.url, call(exact, 3));
    await post(gw.url, call(exact, 4));
    expect(up.ran).toHaveLength(3);
  });
});

describe('a `{json}` entity pointer into params: a member that differs from a token only in case is invalid-entity', () => {
  const route = { entity: { json: '/arguments/customer' } };

  it('`Customer` for /arguments/customer: refused, nothing forwarded; `customer` is the entity', async () => {
    const { up, gw } = await setup(route);
    const a = await post(gw.url, call({ name: 'pay', arguments: { Customer: 'bob-secret' }, _meta: { [MCP_META.fence]: '5' } }));
    expect(a.refusal).toBe('invalid-entity');
    expect(a.body.error!.data.detail).toContain('a member whose name differs only in case');
    expect(a.body.error!.message).not.toContain('bob-secret');
    expect(up.seen).toHaveLength(0);
    const exact = await post(gw.url, call({ name: 'pay', arguments: { customer: 'bob' }, _meta: { [MCP_META.fence]: '5' } }));
    expect(exact.refusal).toBeNull();
    expect(up.ran).toHaveLength(1);
  });

  it('`customer` and `Customer` side by side: refused as well, invalid-request (what the dispatcher refuses to enqueue, test/lease/dispatch.test.ts)', async () => {
    const { up, gw } = await setup(route);
    const a = await post(gw.url, call({ name: 'pay', arguments: { customer: 'bob', Customer: 'eve' }, _meta: { [MCP_META.fence]: '5' } }));
    expect(a.refusal).toBe('invalid-request');
    expect(a.body.error!.data.detail).toContain('the object at "/params/arguments" has');
    expect(up.seen).toHaveLength(0);
  });

  it('the gap, with the fold switched off: the call is admitted with no entity (no fence check, no serial slot) and runs', async () => {
    const { up, gw } = await setup(route);
    fold.mode = 'none';
    const a = await post(gw.url, call({ name: 'pay', arguments: { Customer: 'bob' } }));
    expect(a.refusal).toBeNull();
    expect(up.ran).toHaveLength(1);
    expect(gw.logs.find((l) => l.msg === 'decision')).toMatchObject({ entity: null });
  });
});
