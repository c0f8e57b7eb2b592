import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, paymentsRoute, snapshot, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { rawRequest } from '../helpers/raw-http.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';

// DESIGN §3: "No error ever reaches the upstream; no bad input changes state."
// Each row is a request that WOULD change state if it were admitted (a fresh
// key, and a fence of 11 above the entity's current 10) with exactly one
// thing wrong. For each: the right 4xx and code, the same rows in all three
// gateway tables (fences, records, rejections) before and after, and no new
// upstream call. The last test is the control: the same request done right
// does change state, so the snapshot comparison can see a change.

let up: FakeUpstream;
let gw: TestGateway;

const LIMIT = 1024;

beforeAll(async () => {
  up = await startUpstream();
  gw = await startTestGateway({
    routes: [
      paymentsRoute(up.url, { maxBodyBytes: LIMIT }),
      paymentsRoute(up.url, { name: 'invoices', match: { path: '/invoices/:invoice/pay' }, entity: { path: ':invoice' } }),
      paymentsRoute(up.url, { name: 'orders', match: { path: '/orders/*' }, entity: { json: '/order/id' } }),
    ],
  });
  // Current state: fence 10 accepted for each entity, one completed record each.
  const seed = [
    command(gw.url, '/payments/charges', { fence: 10, entity: 'job-1', key: 'seed-1' }),
    command(gw.url, '/invoices/inv-1/pay', { fence: 10, key: 'seed-2' }),
    command(gw.url, '/orders/new', { fence: 10, key: 'seed-3', body: '{"order":{"id":"o-1"}}' }),
  ];
  for (const res of await Promise.all(seed)) expect(res.status).toBe(201);
  expect(up.effects).toBe(3);
});

afterAll(async () => {
  await up?.close();
  await gw?.close();
});

/** A header value carrying these UTF-8 bytes on the wire (the raw client writes latin1). */
const utf8 = (s: string) => Buffer.from(s, 'utf8').toString('latin1');

interface Row {
  name: string;
  method?: string;
  path?: string;
  /** undefined: the valid default; null: header absent; string: this value. */
  fence?: string | null;
  entity?: string | null;
  key?: string | null;
  /** Extra raw header lines, sent after the others (duplicates). */
  extra?: [string, string][];
  body?: Buffer | string;
  chunked?: number;
  status: number;
  /**
   * The problem type; null when Node's HTTP parser refuses the bytes itself
   * (control characters), so the request never reaches the gateway at all.
   */
  code: string | null;
}

let n = 0;
function headersOf(row: Row): [string, string][] {
  const h: [string, string][] = [['Content-Type', 'application/json']];
  const fence = row.fence === undefined ? '11' : row.fence;
  const entity = row.entity === undefined ? (row.path === undefined ? 'job-1' : null) : row.entity;
  const key = row.key === undefined ? `fresh-${++n}` : row.key;
  if (fence !== null) h.push(['X-Execution-Fence', fence]);
  if (entity !== null) h.push(['X-Fence-Entity', entity]);
  if (key !== null) h.push(['Idempotency-Key', key]);
  return [...h, ...(row.extra ?? [])];
}

const big = (len: number, ch = 'a') => ch.repeat(len);
const order = (id: unknown) => JSON.stringify({ order: { id } });

const rows: Row[] = [
  // X-Execution-Fence (DESIGN §3: one canonical decimal 0 … 2^63−1)
  { name: 'fence with a leading +', fence: '+11', status: 400, code: 'invalid-fence' },
  { name: 'fence with a leading zero', fence: '011', status: 400, code: 'invalid-fence' },
  { name: 'fence with a space inside', fence: '1 1', status: 400, code: 'invalid-fence' },
  { name: 'fence with a tab inside', fence: '1\t1', status: 400, code: 'invalid-fence' },
  { name: 'fence with a decimal point', fence: '11.0', status: 400, code: 'invalid-fence' },
  { name: 'fence with an exponent', fence: '1e3', status: 400, code: 'invalid-fence' },
  { name: 'negative fence', fence: '-1', status: 400, code: 'invalid-fence' },
  { name: 'hexadecimal fence', fence: '0x10', status: 400, code: 'invalid-fence' },
  { name: 'fence of 2^63', fence: '9223372036854775808', status: 400, code: 'invalid-fence' },
  { name: 'fence of 20 digits', fence: '99999999999999999999', status: 400, code: 'invalid-fence' },
  { name: 'two fences in one header', fence: '11,12', status: 400, code: 'invalid-fence' },
  { name: 'fence header repeated with another value', extra: [['X-Execution-Fence', '12']], status: 400, code: 'invalid-fence' },
  { name: 'fence header repeated with the same value', extra: [['X-Execution-Fence', '11']], status: 400, code: 'invalid-fence' },
  { name: 'empty fence', fence: '', status: 400, code: 'invalid-fence' },
  { name: 'fence with digit separators', fence: '1_1', status: 400, code: 'invalid-fence' },
  { name: 'fence in full-width digits (non-ASCII)', fence: utf8('１１'), status: 400, code: 'invalid-fence' },
  { name: 'fence in Arabic-Indic digits (non-ASCII)', fence: utf8('١١'), status: 400, code: 'invalid-fence' },
  { name: 'fence with a parameter', fence: '11;v=1', status: 400, code: 'invalid-fence' },
  { name: 'fence that is a word', fence: 'eleven', status: 400, code: 'invalid-fence' },
  { name: 'no fence on a fence-required route', fence: null, status: 400, code: 'missing-fence' },
  { name: 'fence with a control character (refused by the HTTP parser)', fence: '1\x011', status: 400, code: null },
  // Idempotency-Key (1–255 printable characters; an sf-string is unquoted)
  { name: 'empty key', key: '', status: 400, code: 'invalid-idempotency-key' },
  { name: 'key of 256 characters', key: big(256), status: 400, code: 'invalid-idempotency-key' },
  { name: 'quoted key of 256 characters', key: `"${big(256)}"`, status: 400, code: 'invalid-idempotency-key' },
  { name: 'empty quoted key', key: '""', status: 400, code: 'invalid-idempotency-key' },
  { name: 'key "." (a dot segment in the admin path)', key: '.', status: 400, code: 'invalid-idempotency-key' },
  { name: 'quoted key ".."', key: '".."', status: 400, code: 'invalid-idempotency-key' },
  { name: 'unterminated quoted key', key: '"abc', status: 400, code: 'invalid-idempotency-key' },
  { name: 'quoted key with an invalid escape', key: '"a\\xb"', status: 400, code: 'invalid-idempotency-key' },
  { name: 'quoted key with a trailing backslash', key: '"ab\\', status: 400, code: 'invalid-idempotency-key' },
  { name: 'quoted key followed by more text', key: '"abc"def', status: 400, code: 'invalid-idempotency-key' },
  { name: 'two quoted keys', key: '"a", "b"', status: 400, code: 'invalid-idempotency-key' },
  { name: 'two bare keys', key: 'a,b', status: 400, code: 'invalid-idempotency-key' },
  { name: 'key header repeated', extra: [['Idempotency-Key', 'other']], status: 400, code: 'invalid-idempotency-key' },
  { name: 'bare key with a quote inside', key: 'a"b', status: 400, code: 'invalid-idempotency-key' },
  { name: 'key with a tab inside', key: 'a\tb', status: 400, code: 'invalid-idempotency-key' },
  { name: 'quoted key with a tab inside', key: '"a\tb"', status: 400, code: 'invalid-idempotency-key' },
  { name: 'non-ASCII key', key: utf8('clé'), status: 400, code: 'invalid-idempotency-key' },
  { name: 'no key on a key-required route', key: null, status: 400, code: 'missing-idempotency-key' },
  { name: 'key with DEL (refused by the HTTP parser)', key: 'a\x7fb', status: 400, code: null },
  // X-Fence-Entity (1–512 printable bytes)
  { name: 'empty entity', entity: '', status: 400, code: 'invalid-entity' },
  { name: 'entity of 513 bytes', entity: big(513), status: 400, code: 'invalid-entity' },
  { name: 'entity with a tab inside', entity: 'job\t1', status: 400, code: 'invalid-entity' },
  { name: 'non-ASCII entity', entity: utf8('jöb-1'), status: 400, code: 'invalid-entity' },
  { name: 'entity header repeated with the same value', extra: [['X-Fence-Entity', 'job-1']], status: 400, code: 'invalid-entity' },
  { name: 'entity header repeated with another value', extra: [['X-Fence-Entity', 'job-2']], status: 400, code: 'invalid-entity' },
  { name: 'no entity with a fence', entity: null, status: 400, code: 'missing-entity' },
  { name: 'entity with NUL (refused by the HTTP parser)', entity: 'job\x001', status: 400, code: null },
  // Entity from the path (`/invoices/:invoice/pay`)
  { name: 'path entity decoding to a tab', path: '/invoices/inv%091/pay', status: 400, code: 'invalid-entity' },
  { name: 'path entity decoding to non-ASCII', path: '/invoices/inv%C3%A91/pay', status: 400, code: 'invalid-entity' },
  { name: 'path entity of 513 bytes', path: `/invoices/${big(513)}/pay`, status: 400, code: 'invalid-entity' },
  { name: 'path entity that does not percent-decode', path: '/invoices/inv%ZZ/pay', status: 404, code: 'no-route' },
  // Entity from the body (`{json: "/order/id"}`)
  { name: 'body without the entity pointer', path: '/orders/new', body: '{"order":{}}', status: 400, code: 'missing-entity' },
  { name: 'body that is not JSON', path: '/orders/new', body: 'order=o-1', status: 400, code: 'missing-entity' },
  { name: 'body entity that is not an integer', path: '/orders/new', body: order(1.5), status: 400, code: 'missing-entity' },
  { name: 'empty body entity', path: '/orders/new', body: order(''), status: 400, code: 'invalid-entity' },
  { name: 'body entity of 513 bytes', path: '/orders/new', body: order(big(513)), status: 400, code: 'invalid-entity' },
  { name: 'body entity with a newline', path: '/orders/new', body: order('o\n1'), status: 400, code: 'invalid-entity' },
  // Body over the route's limit
  { name: 'declared body over the limit', body: Buffer.alloc(LIMIT + 1, 0x61), status: 413, code: 'payload-too-large' },
  { name: 'chunked body over the limit', body: Buffer.alloc(LIMIT * 3, 0x61), chunked: 256, status: 413, code: 'payload-too-large' },
  // No route
  { name: 'method the route does not list', method: 'GET', status: 404, code: 'no-route' },
  { name: 'path no route matches', path: '/paymentz/charges', status: 404, code: 'no-route' },
];

describe('malformed inputs: the right 4xx, no state change, the upstream never called', () => {
  it('has at least 30 rows', () => {
    expect(rows.length).toBeGreaterThanOrEqual(30);
  });

  it.each(rows.map((r) => [r.name, r] as const))('%s', async (_name, row) => {
    const before = snapshot(gw.sqlite);
    const effects = up.effects;
    const res = await rawRequest(gw.url, {
      method: row.method ?? 'POST',
      path: row.path ?? '/payments/charges',
      headers: headersOf(row),
      body: row.body ?? '{"amount":1200}',
      chunked: row.chunked,
    });
    expect(res.status, res.text).toBe(row.status);
    if (row.code !== null) {
      expect(res.headers['content-type']).toBe('application/problem+json');
      const problem = JSON.parse(res.text);
      expect(problem).toMatchObject({ status: row.status, type: expect.stringMatching(new RegExp(`/${row.code}$`)) });
      expect(typeof problem.title).toBe('string');
      expect(typeof problem.detail).toBe('string');
    }
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(up.effects).toBe(effects);
  });
});

describe('control: well-formed requests do change state', () => {
  it('outer whitespace is not part of a header value (RFC 9110 §5.5), so " 11 " is fence 11', async () => {
    const before = snapshot(gw.sqlite);
    const res = await rawRequest(gw.url, {
      path: '/payments/charges',
      headers: headersOf({ name: 'padded', fence: '  11  ', status: 201, code: null }),
      body: '{}',
    });
    expect(res.status, res.text).toBe(201);
    expect(snapshot(gw.sqlite)).not.toBe(before);
    expect((await gw.admin('/v1/entities/job-1')).body.fence).toBe('11');
    expect(up.calls.at(-1)!.fence).toBe('11');
  });

  it.each([
    ['header entity', '/payments/charges', '{}', 'job-1'],
    ['path entity', '/invoices/inv-1/pay', '{}', 'inv-1'],
    ['body entity', '/orders/new', order('o-1'), 'o-1'],
  ])('%s: fence 12 with a fresh key is admitted and forwarded', async (_name, path, body, entity) => {
    const before = snapshot(gw.sqlite);
    const effects = up.effects;
    const headers = headersOf({ name: 'ok', path: path === '/payments/charges' ? undefined : path, fence: '12', status: 201, code: null });
    const res = await rawRequest(gw.url, { path, headers, body });
    expect(res.status, res.text).toBe(201);
    expect(snapshot(gw.sqlite)).not.toBe(before);
    expect(up.effects).toBe(effects + 1);
    expect((await gw.admin(`/v1/entities/${entity}`)).body.fence).toBe('12');
  });
});
