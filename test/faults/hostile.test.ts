import fc from 'fast-check';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, recordRows, snapshot, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { sendBytes, type RawAnswer } from './toolkit/raw-socket.js';
import { normalizePath } from '../../src/http/path.js';

// Hostile input, property-based (fast-check): fences, duplicate headers,
// keys, paths, bodies, methods and framing that try to slip a command past
// the gateway. The rule (DESIGN §3): every refusal is a 4xx (a problem body
// where the gateway answers; Node's own parser may answer a bare 400 or 431
// first), no state changes (all three gateway tables byte-identical), and
// nothing reaches the upstream. Each generated request WOULD change state if
// it were admitted: a fresh key, and fence 11 above the entity's 10.
// Where valid input is generated too (keys, paths, framing), the property is
// "the gateway's verdict equals an independent reference", and an accepted
// request must reach the upstream exactly as the reference says.

const LIMIT = 1024;
const RUNS = Number(process.env.FENCEGATE_FC_RUNS ?? 40);

let up: FakeUpstream;
let gw: TestGateway;

beforeAll(async () => {
  up = await startUpstream();
  gw = await startTestGateway({
    routes: [
      paymentsRoute(up.url, { maxBodyBytes: LIMIT }),
      paymentsRoute(up.url, { name: 'invoices', match: { path: '/invoices/:invoice/pay' }, entity: { path: ':invoice' } }),
    ],
  });
  const seeded = await command(gw.url, '/payments/charges', { fence: 10, entity: 'job-1', key: 'seed-1' });
  expect(seeded.status).toBe(201);
});

afterAll(async () => {
  await gw?.close();
  await up?.close();
});

let fresh = 0;
const freshKey = () => `hostile-${++fresh}`;

/** Header lines of a request that would be admitted: fence 11 (above 10), entity job-1, a fresh key. */
function validHeaders(over: { fence?: string; entity?: string; key?: string } = {}): [string, string][] {
  return [
    ['Host', 'gateway.test'],
    ['Content-Type', 'application/json'],
    ['X-Execution-Fence', over.fence ?? '11'],
    ['X-Fence-Entity', over.entity ?? 'job-1'],
    ['Idempotency-Key', over.key ?? freshKey()],
  ];
}

/** A request as bytes: the request line, the header lines as given, a blank line, the body. No framing added. */
function bytesOf(requestLine: string, headers: [string, string][], body: Buffer | string = ''): Buffer {
  const head = [requestLine, ...headers.map(([n, v]) => `${n}: ${v}`)].join('\r\n') + '\r\n\r\n';
  return Buffer.concat([Buffer.from(head, 'latin1'), Buffer.isBuffer(body) ? body : Buffer.from(body, 'latin1')]);
}

/** A POST to /payments/charges with a Content-Length body and extra header lines. */
function post(headers: [string, string][], body = '{"amount":1200}', target = '/payments/charges'): Buffer {
  return bytesOf(`POST ${target} HTTP/1.1`, [...headers, ['Content-Length', String(Buffer.byteLength(body))]], body);
}

/**
 * Until the gateway handles no request (a condition, not a sleep): an answer
 * Node sent early (its own 400) says nothing about what the gateway still does.
 */
async function idle(): Promise<void> {
  for (let i = 0; i < 500 && gw.running.gateway.inflight() > 0; i++) await new Promise((r) => setTimeout(r, 10));
  expect(gw.running.gateway.inflight(), 'the gateway is still handling a request').toBe(0);
}

/** Sends, and checks the refusal rule: a 4xx, no state change, no upstream call. */
async function expectRefused(bytes: Buffer | string, what: string, options: Parameters<typeof sendBytes>[2] = {}): Promise<RawAnswer> {
  await idle();
  const before = snapshot(gw.sqlite);
  const calls = up.calls.length;
  const answer = await sendBytes(gw.url, bytes, options);
  expect(answer.status, `${what}: ${answer.raw.slice(0, 300)}`).toBeGreaterThanOrEqual(400);
  expect(answer.status, `${what}: ${answer.raw.slice(0, 300)}`).toBeLessThan(500);
  await idle();
  if (answer.headers['content-type'] === 'application/problem+json' && answer.text !== '') {
    const problem = JSON.parse(answer.text);
    expect(problem.status).toBe(answer.status);
    expect(typeof problem.type).toBe('string');
    expect(typeof problem.detail).toBe('string');
  }
  expect(snapshot(gw.sqlite), `${what}: state changed`).toBe(before);
  expect(up.calls.length, `${what}: reached the upstream`).toBe(calls);
  return answer;
}

/** The problem code of an answer, or null (a bare answer, or HEAD's empty body). */
const codeOf = (a: RawAnswer): string | null =>
  a.headers['content-type'] === 'application/problem+json' && a.text !== '' ? String(JSON.parse(a.text).type).split('/').pop()! : null;

/** HTTP strips spaces and tabs around a field value (RFC 9110 §5.5). */
const ows = (v: string) => v.replace(/^[ \t]+|[ \t]+$/g, '');
const noLineBreaks = (v: string) => !/[\r\n]/.test(v);

// --- fences ------------------------------------------------------------------

/** Reference: one canonical decimal 0 … 2^63−1 (DESIGN §3), after HTTP trimmed it. */
function isValidFence(raw: string): boolean {
  const v = ows(raw);
  return /^(0|[1-9][0-9]*)$/.test(v) && BigInt(v) <= 9223372036854775807n;
}

const malformedFence = fc
  .oneof(
    fc.stringMatching(/^0[0-9]{1,20}$/),
    fc.tuple(fc.constantFrom('+', '-', '−', '0x', '#'), fc.stringMatching(/^[0-9]{1,19}$/)).map(([s, d]) => s + d),
    fc.stringMatching(/^[1-9][0-9]{19,60}$/),
    fc.stringMatching(/^[1-9][0-9]{2000,6000}$/),
    fc.stringMatching(/^[1-9][0-9]{0,6}[ .,;_eE\t/:][0-9]{1,6}$/),
    fc.constantFrom('9223372036854775808', '18446744073709551616', '1e3', '11.0', '11,12', '11, 11', '', ' ', 'NaN', 'Infinity', '0b11', '١١'),
    fc.string({ unit: 'binary-ascii', maxLength: 40 }),
    fc.string({ unit: 'grapheme', maxLength: 10 }).map((s) => Buffer.from(s, 'utf8').toString('latin1')),
  )
  .filter((v) => noLineBreaks(v) && !isValidFence(v));

describe('hostile fences', () => {
  it('malformed and huge fences: 4xx (invalid-fence where the gateway answers), nothing changes, nothing forwarded', async () => {
    await fc.assert(
      fc.asyncProperty(malformedFence, async (fence) => {
        const a = await expectRefused(post(validHeaders({ fence })), `fence ${JSON.stringify(fence.slice(0, 60))}`);
        // Node answers a bare 400 (control characters) or 431 (headers too large) before the gateway sees it.
        if (codeOf(a) !== null) expect(codeOf(a)).toBe('invalid-fence');
        else expect([400, 431]).toContain(a.status);
      }),
      { numRuns: RUNS },
    );
  });
});

// --- duplicate headers ---------------------------------------------------------

describe('duplicate headers', () => {
  it('a second fence, entity, key, Host, Content-Length or Transfer-Encoding line: 4xx, nothing changes, nothing forwarded', async () => {
    const duplicate = fc.record({
      name: fc.constantFrom(
        'X-Execution-Fence',
        'x-execution-fence',
        'X-Fence-Entity',
        'Idempotency-Key',
        'idempotency-key',
        'Host',
        'Content-Length',
        'Transfer-Encoding',
      ),
      same: fc.boolean(),
      other: fc.string({ unit: fc.constantFrom(...'abcxyz0123456789-:., '), minLength: 1, maxLength: 12 }),
      first: fc.boolean(),
    });
    await fc.assert(
      fc.asyncProperty(duplicate, async ({ name, same, other, first }) => {
        const key = freshKey();
        const body = '{"amount":1200}';
        const base: [string, string][] = [...validHeaders({ key }), ['Content-Length', String(body.length)]];
        const original = base.find(([n]) => n.toLowerCase() === name.toLowerCase())?.[1] ?? 'chunked';
        const extra: [string, string] = [name, same ? original : other];
        const headers = first ? [extra, ...base] : [...base, extra];
        await expectRefused(bytesOf('POST /payments/charges HTTP/1.1', headers, body), `duplicate ${name}: ${extra[1]}`);
      }),
      { numRuns: RUNS },
    );
  });
});

// --- idempotency keys ---------------------------------------------------------

/**
 * Reference for `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header,
 * RFC 8941 sf-string, DESIGN §3): after HTTP trimmed the value, a quoted
 * string is unquoted (`\"` and `\\` only); a bare value may not contain `"`
 * or `,`; the key is 1–255 printable ASCII characters (a quoted one may
 * start or end with a space).
 */
function referenceKey(raw: string): string | null {
  const v = ows(raw);
  let key: string;
  if (v.startsWith('"')) {
    const m = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(v);
    if (m === null) return null;
    key = m[1]!.replace(/\\(["\\])/g, '$1');
  } else {
    if (/[",]/.test(v) || v !== v.trim()) return null;
    key = v;
  }
  // Spaces inside the quotes are the key's (RFC 8941 sf-string), at its ends too.
  if (key.length < 1 || key.length > 255 || !/^[\x20-\x7e]+$/.test(key)) return null;
  if (key === '.' || key === '..') return null; // not addressable in the admin API's path
  return key;
}

const CLASSES = {
  alnum: 'abcXYZ019',
  punct: "!#$%&'*+-.^_`|~:/;<=>?@[]{}()",
  quote: '"\\',
  space: ' \t',
  comma: ',',
  ctl: '\x00\x01\x1f\x7f',
};

const keyArb = fc
  .oneof(
    fc.string({ unit: fc.constantFrom(...CLASSES.alnum, ...CLASSES.punct), minLength: 0, maxLength: 300 }),
    fc.integer({ min: 250, max: 260 }).map((n) => 'k'.repeat(n)),
    fc.string({ unit: fc.constantFrom(...Object.values(CLASSES).join('')), maxLength: 30 }),
    fc.string({ unit: fc.constantFrom(...CLASSES.alnum, ...CLASSES.punct, ...CLASSES.quote, ' ', ','), maxLength: 40 }).map((s) => `"${s}"`),
    fc.string({ unit: fc.constantFrom(...CLASSES.alnum, ' ', ','), maxLength: 30 }).map((s) => `"${s.replace(/["\\]/g, '\\$&')}"`),
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: 8 }).map((s) => Buffer.from(s, 'utf8').toString('latin1')),
    // Dot segments (refused: the admin path cannot name them) and their neighbours (accepted).
    fc.constantFrom('.', '..', '"."', '".."', '...', './', '.a'),
  )
  .filter(noLineBreaks);

describe('idempotency keys of every length and character class', () => {
  it("the gateway's verdict equals the reference; an accepted key is stored unquoted and replayed on reuse", async () => {
    const used = new Set<string>();
    // A reused key comes with the entity of its first use: the same key for
    // another entity is another command (422), not a replay.
    const entityOf = new Map<string, string>();
    let entityN = 0;
    await fc.assert(
      fc.asyncProperty(keyArb, async (raw) => {
        const expected = referenceKey(raw);
        const entity = (expected !== null ? entityOf.get(expected) : undefined) ?? `key-prop-${++entityN}`;
        if (expected !== null) entityOf.set(expected, entity);
        const headers = validHeaders({ key: raw, entity, fence: '1' });
        if (expected === null) {
          const a = await expectRefused(post(headers), `key ${JSON.stringify(raw.slice(0, 60))}`);
          if (codeOf(a) !== null) expect(codeOf(a)).toBe('invalid-idempotency-key');
          return;
        }
        const calls = up.calls.length;
        const a = await sendBytes(gw.url, post(headers));
        expect(a.status, `${JSON.stringify(raw)}: ${a.raw.slice(0, 300)}`).toBe(201);
        if (used.has(expected)) {
          // Same key, same method, path, content type and body: the stored answer.
          expect(a.headers['idempotent-replayed']).toBe('true');
          expect(up.calls.length).toBe(calls);
        } else {
          used.add(expected);
          expect(up.calls.length).toBe(calls + 1);
          expect(up.calls.at(-1)!.key).toBe(ows(raw));
        }
        const found = await gw.admin(`/v1/idempotency/${encodeURIComponent(expected)}`);
        expect(found.body.records.map((r: { scope: string }) => r.scope)).toEqual(['payments']);
      }),
      { numRuns: RUNS * 2 },
    );
  });
});

// --- paths --------------------------------------------------------------------

/**
 * What an upstream that decodes `%2E`, `%2F` and `%5C` (and treats `\` as a
 * separator) makes of a path: the dot segments resolved. A request must never
 * reach the upstream at a path that resolves outside its route's prefix.
 */
function resolvedByAnUpstream(path: string): string {
  const decoded = path.replace(/%2e/gi, '.').replace(/%2f|%5c|\\/gi, '/');
  const out: string[] = [];
  for (const seg of decoded.split('?')[0]!.split('/').slice(1)) {
    if (seg === '..') out.pop();
    else if (seg !== '.') out.push(seg);
  }
  return `/${out.join('/')}`;
}

const SEGMENTS = ['payments', 'charges', 'invoices', 'inv-1', 'pay', '_fencegate', 'v1', 'rejections', 'admin', 'x'];
const TRICKS = [
  '..',
  '.',
  '%2e%2e',
  '%2E%2e',
  '.%2e',
  '%2e',
  '..%2f',
  '..%2F',
  '%2f',
  '%2F..',
  '%5c',
  '..%5c',
  '%5C..%5C',
  '',
  '%00',
  '%25',
  '%252e%252e',
  ';',
  '..;',
  '.%00.',
  '%c0%ae%c0%ae',
];
const pathArb = fc
  .tuple(
    fc.constantFrom('', 'http://evil.example', 'http://127.0.0.1:1', '/'),
    // Mostly starting inside a route, where an escape would matter.
    fc
      .tuple(fc.constantFrom('payments', 'payments', 'invoices', ...SEGMENTS, ...TRICKS), fc.array(fc.constantFrom(...SEGMENTS, ...TRICKS), { maxLength: 5 }))
      .map(([first, rest]) => [first, ...rest]),
    fc.constantFrom('', '?a=1', '?..%2f=1'),
  )
  .map(([prefix, segs, query]) => ({ target: `${prefix}/${segs.join('/')}${query}` }));

describe('path tricks', () => {
  it('never reaches the upstream outside its route, never reaches the admin API as a command; refusals change nothing', async () => {
    await fc.assert(
      fc.asyncProperty(pathArb, async ({ target }) => {
        await idle();
        const before = snapshot(gw.sqlite);
        const calls = up.calls.length;
        const a = await sendBytes(gw.url, post(validHeaders(), '{"amount":1200}', target));
        await idle();
        const what = `${target}: ${a.raw.slice(0, 200)}`;
        expect(a.status, what).toBeGreaterThanOrEqual(200);
        expect(a.status, what).toBeLessThan(500);
        if (a.status >= 400) {
          expect(snapshot(gw.sqlite), what).toBe(before);
          expect(up.calls.length, what).toBe(calls);
          return;
        }
        // Admitted: exactly one call, at a path that stays under the route's prefix
        // whoever decodes it, and is the path the gateway routed (nothing re-written).
        expect(a.status, what).toBe(201);
        expect(up.calls.length, what).toBe(calls + 1);
        const forwarded = up.calls.at(-1)!.url;
        expect(resolvedByAnUpstream(forwarded), `${what} → upstream ${forwarded}`).toMatch(/^\/(payments|invoices)\//);
        const origin = target.replace(/^https?:\/\/[^/]+/, '');
        // The normalised path (RFC 3986 §6.2.2: unreserved characters decoded, hex in upper case) is what is routed and sent.
        expect(forwarded, what).toBe(normalizePath(new URL(origin, 'http://gateway.test').pathname) + new URL(origin, 'http://gateway.test').search);
      }),
      { numRuns: RUNS * 2 },
    );
  });

  it.each([
    ['/payments/..%2F_fencegate/v1/rejections'],
    ['/payments/x/..%2f..%2fadmin'],
    ['/payments/..%5Cadmin'],
    ['/payments/%2e%2e%2Fadmin'],
    ['/invoices/..%2f..%2fadmin/pay'],
  ])('%s hides a dot segment behind an encoded separator: refused', async (target) => {
    const a = await expectRefused(post(validHeaders(), '{}', target), target);
    expect([400, 404]).toContain(a.status);
  });
});

// --- bodies -------------------------------------------------------------------

describe('oversized, slow and truncated bodies', () => {
  it('over the limit, declared or streamed, fast or slow: 413 payload-too-large, nothing changes, nothing forwarded', async () => {
    const arb = fc.record({
      size: fc.integer({ min: LIMIT + 1, max: LIMIT * 8 }),
      framing: fc.constantFrom('length', 'chunked'),
      piece: fc.integer({ min: 64, max: 4096 }),
      pauseMs: fc.constantFrom(0, 0, 5, 20),
    });
    await fc.assert(
      fc.asyncProperty(arb, async ({ size, framing, piece, pauseMs }) => {
        const body = Buffer.alloc(size, 0x61);
        let bytes: Buffer;
        if (framing === 'length') {
          bytes = bytesOf('POST /payments/charges HTTP/1.1', [...validHeaders(), ['Content-Length', String(size)]], body);
        } else {
          const parts: Buffer[] = [];
          for (let i = 0; i < size; i += piece) {
            const c = body.subarray(i, i + piece);
            parts.push(Buffer.from(`${c.length.toString(16)}\r\n`), c, Buffer.from('\r\n'));
          }
          bytes = bytesOf(
            'POST /payments/charges HTTP/1.1',
            [...validHeaders(), ['Transfer-Encoding', 'chunked']],
            Buffer.concat([...parts, Buffer.from('0\r\n\r\n')]),
          );
        }
        const a = await expectRefused(bytes, `${framing} body of ${size} bytes`, { pieceBytes: piece, pauseMs, then: 'wait' });
        expect(a.status).toBe(413);
        expect(codeOf(a)).toBe('payload-too-large');
      }),
      { numRuns: Math.ceil(RUNS / 2) },
    );
  });

  it('a body cut short (the client goes away mid-body, slowly or at once) admits nothing and forwards nothing', async () => {
    const arb = fc.record({
      declared: fc.integer({ min: 20, max: LIMIT }),
      sentFraction: fc.double({ min: 0, max: 0.95, noNaN: true }),
      pauseMs: fc.constantFrom(0, 10),
      end: fc.constantFrom('end', 'destroy') as fc.Arbitrary<'end' | 'destroy'>,
    });
    await fc.assert(
      fc.asyncProperty(arb, async ({ declared, sentFraction, pauseMs, end }) => {
        await idle();
        const before = snapshot(gw.sqlite);
        const calls = up.calls.length;
        const sent = Buffer.alloc(Math.floor(declared * sentFraction), 0x61);
        const bytes = bytesOf('POST /payments/charges HTTP/1.1', [...validHeaders(), ['Content-Length', String(declared)]], sent);
        const a = await sendBytes(gw.url, bytes, { pieceBytes: 16, pauseMs, then: end, timeoutMs: 5_000 });
        // No answer at all, or a 4xx (Node's 400 for an incomplete message): never a success.
        expect(a.status === 0 || (a.status >= 400 && a.status < 500), a.raw.slice(0, 200)).toBe(true);
        await idle();
        expect(snapshot(gw.sqlite)).toBe(before);
        expect(up.calls.length).toBe(calls);
      }),
      { numRuns: Math.ceil(RUNS / 2) },
    );
  });
});

// --- methods --------------------------------------------------------------------

describe('unknown and unlisted methods', () => {
  it('4xx (Node: 400 for what it cannot parse; the gateway: 404 no-route), nothing changes, nothing forwarded', async () => {
    const method = fc.oneof(
      fc.stringMatching(/^[A-Z]{1,12}$/).filter((m) => !['POST', 'PUT', 'PATCH', 'DELETE'].includes(m)),
      fc.constantFrom(
        'GET',
        'HEAD',
        'OPTIONS',
        'TRACE',
        'PROPFIND',
        'MKCOL',
        'LINK',
        'PURGE',
        'SEARCH',
        'QUERY',
        'M-SEARCH',
        'post',
        'Post',
        'P0ST',
        'POST\t',
        'PRI',
      ),
    );
    await fc.assert(
      fc.asyncProperty(method, async (m) => {
        const a = await expectRefused(post(validHeaders()).toString('latin1').replace(/^POST/, m), `method ${m}`);
        if (codeOf(a) !== null) expect(codeOf(a)).toBe('no-route');
      }),
      { numRuns: RUNS },
    );
  });

  it('CONNECT is never tunnelled: the connection is closed without an answer or refused, nothing changes', async () => {
    const before = snapshot(gw.sqlite);
    const calls = up.calls.length;
    const a = await sendBytes(gw.url, `CONNECT ${new URL(up.url).host} HTTP/1.1\r\nHost: ${new URL(up.url).host}\r\n\r\nPOST /payments/x HTTP/1.1\r\n\r\n`);
    expect(a.status === 0 || (a.status >= 400 && a.status < 500)).toBe(true);
    expect(snapshot(gw.sqlite)).toBe(before);
    expect(up.calls.length).toBe(calls);
  });
});

// --- request smuggling -------------------------------------------------------------

/**
 * Reference framing (RFC 9112 §6): a body is framed by exactly one valid
 * Content-Length, or by Transfer-Encoding whose only coding is chunked;
 * anything else (both, two lengths, a coding the gateway would drop, an
 * obs-folded framing header) is refused before anything is admitted.
 */
interface Framing {
  lengths: string[];
  codings: string[];
  fold: boolean;
}

function framingIsSound(f: Framing): boolean {
  if (f.fold) return false;
  if (f.lengths.length > 0 && f.codings.length > 0) return false;
  if (f.lengths.length > 1) return false;
  if (f.codings.length > 1) return false;
  if (f.codings.length === 1) return ows(f.codings[0]!).toLowerCase() === 'chunked';
  return true;
}

describe('request smuggling', () => {
  it('ambiguous framing is refused; sound framing carries exactly one command; a smuggled inner request never reaches the upstream', async () => {
    const framing = fc.record({
      // A valid but short length is not ambiguous: the rest is a second, pipelined request that
      // goes through every check on its own. The lengths here are the ones no parser may guess at.
      lengths: fc.array(fc.constantFrom('correct', '+5', '-1', '0x10', '5 5', 'correct, correct', ' correct'), { maxLength: 2 }),
      codings: fc.array(
        fc.constantFrom(
          'chunked',
          'Chunked',
          ' chunked',
          'chunked ',
          'gzip, chunked',
          'chunked, gzip',
          'identity',
          'identity, chunked',
          'chunked, chunked',
          'xchunked',
          'chunked;q=1',
        ),
        { maxLength: 2 },
      ),
      fold: fc.boolean(),
    });
    await fc.assert(
      fc.asyncProperty(framing, async ({ lengths, codings, fold }) => {
        // Without any framing header there is no body, and the bytes after the head are a
        // second, pipelined request with every check of its own: not an ambiguity.
        fc.pre(lengths.length + codings.length > 0);
        const smuggledKey = freshKey();
        const inner = post(validHeaders({ key: smuggledKey, fence: '12' }), '{}', '/payments/smuggled').toString('latin1');
        const outerKey = freshKey();
        const chunkedBody = `${Buffer.byteLength(inner).toString(16)}\r\n${inner}\r\n0\r\n\r\n`;
        const usesChunked = codings.length > 0;
        const body = usesChunked ? chunkedBody : inner;
        const n = String(Buffer.byteLength(body));
        const lengthValue = (l: string) => l.replace(/correct/g, n);
        const headers: [string, string][] = [...validHeaders({ key: outerKey })];
        for (const l of lengths) headers.push(['Content-Length', lengthValue(l)]);
        for (const c of codings) headers.push(['Transfer-Encoding', c]);
        // obs-fold: the last framing header's value continues on the next line.
        let bytes = bytesOf('POST /payments/charges HTTP/1.1', headers, body).toString('latin1');
        if (fold && (lengths.length > 0 || codings.length > 0))
          bytes = bytes.replace(/(\r\n(Content-Length|Transfer-Encoding): [^\r]*)\r\n\r\n/, '$1\r\n x\r\n\r\n');
        const f: Framing = { lengths: lengths.map(lengthValue), codings, fold: fold && (lengths.length > 0 || codings.length > 0) };
        const sound = framingIsSound(f) && f.lengths.every((l) => ows(l) === n);
        const what = `CL=${JSON.stringify(f.lengths)} TE=${JSON.stringify(codings)} fold=${f.fold}`;

        await idle();
        const before = snapshot(gw.sqlite);
        const calls = up.calls.length;
        const a = await sendBytes(gw.url, Buffer.from(bytes, 'latin1'), { timeoutMs: 5_000 });
        await idle();
        // Whatever happened, the inner request was never a request of its own.
        expect(
          up.calls.filter((c) => c.key === smuggledKey),
          what,
        ).toEqual([]);
        expect(a.statuses.length, `${what}: one request, at most one answer`).toBeLessThanOrEqual(1);
        if (sound) {
          expect(a.status, `${what}: ${a.raw.slice(0, 300)}`).toBe(201);
          expect(up.calls.length).toBe(calls + 1);
          expect(up.calls.at(-1)!.key).toBe(outerKey);
          // The body arrived as the outer request's body, byte for byte.
          expect(up.calls.at(-1)!.body.toString('latin1')).toBe(inner);
        } else {
          expect(a.status === 0 || (a.status >= 400 && a.status < 500), `${what}: ${a.raw.slice(0, 300)}`).toBe(true);
          expect(snapshot(gw.sqlite), what).toBe(before);
          expect(up.calls.length, what).toBe(calls);
        }
      }),
      { numRuns: RUNS * 2 },
    );
  });

  it.each([
    ['CL.TE', 'Content-Length: 6\r\nTransfer-Encoding: chunked', '0\r\n\r\nX'],
    ['TE.CL', 'Transfer-Encoding: chunked\r\nContent-Length: 3', '8\r\nSMUGGLED\r\n0\r\n\r\n'],
    ['two lengths', 'Content-Length: 2\r\nContent-Length: 40', '{}'],
    ['obs-fold on Transfer-Encoding', 'Transfer-Encoding: identity\r\n chunked', '0\r\n\r\n'],
    ['space before the colon', 'Transfer-Encoding : chunked', '0\r\n\r\n'],
    ['a coding the gateway would drop', 'Transfer-Encoding: gzip, chunked', '2\r\n{}\r\n0\r\n\r\n'],
    ['bare LF line ends', 'Content-Length: 2', '{}'],
  ])('%s: refused, nothing changes, nothing forwarded', async (name, framingLines, body) => {
    const head = ['POST /payments/charges HTTP/1.1', ...validHeaders().map(([n, v]) => `${n}: ${v}`), framingLines].join('\r\n');
    let raw = `${head}\r\n\r\n${body}`;
    if (name === 'bare LF line ends') raw = raw.replace(/\r\n/g, '\n');
    await expectRefused(Buffer.from(raw, 'latin1'), name);
  });
});

/**
 * The answer side: an upstream that answers too much, forever, or too
 * slowly. The gateway must stop reading at the route's maxResponseBytes
 * (memory and storage bounded by it), end the key in a defined state that
 * never forwards it again, and keep its deadline against a trickle.
 */
describe('hostile answers', () => {
  const LIMIT = 64 * 1024;
  let server: Server;
  let answers: TestGateway;
  /** Per key: requests that reached this upstream, and the bytes it managed to write before the gateway hung up. */
  const reached = new Map<string, number>();
  const written = new Map<string, Promise<number>>();

  const writeUntilClosed = (res: ServerResponse, chunk: Buffer, pauseMs = 0): Promise<number> => {
    let n = 0;
    return new Promise((resolve) => {
      res.once('close', () => resolve(n));
      const pump = () => {
        while (!res.destroyed) {
          n += chunk.length;
          const more = res.write(chunk);
          if (pauseMs > 0) return void setTimeout(pump, pauseMs);
          if (!more) return void res.once('drain', pump);
        }
      };
      pump();
    });
  };

  beforeAll(async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        const key = String(req.headers['idempotency-key']);
        reached.set(key, (reached.get(key) ?? 0) + 1);
        if (req.url!.startsWith('/huge/')) {
          // 300 MiB announced and sent: refused on the header.
          res.writeHead(201, { 'content-type': 'application/json', 'content-length': String(300 * 1024 * 1024) });
          written.set(key, writeUntilClosed(res, Buffer.alloc(64 * 1024, 0x61)));
        } else if (req.url!.startsWith('/endless/')) {
          res.writeHead(200, { 'content-type': 'application/json' });
          written.set(key, writeUntilClosed(res, Buffer.alloc(1024, 0x62)));
        } else {
          // A byte every 20 ms: never over the limit, never done.
          res.writeHead(200, { 'content-type': 'application/json' });
          written.set(key, writeUntilClosed(res, Buffer.from('.'), 20));
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const upstream = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    answers = await startTestGateway({
      routes: [
        // Deadlines far past this file's test timeout: only the limit can end these in time.
        paymentsRoute(upstream, { name: 'huge', match: { path: '/huge/*' }, maxResponseBytes: LIMIT, timeoutMs: 600_000 }),
        paymentsRoute(upstream, { name: 'endless', match: { path: '/endless/*' }, maxResponseBytes: LIMIT, timeoutMs: 600_000 }),
        paymentsRoute(upstream, { name: 'trickle', match: { path: '/trickle/*' }, maxResponseBytes: LIMIT, timeoutMs: 300 }),
      ],
    });
  });
  afterAll(async () => {
    await answers?.close();
    server?.closeAllConnections();
    await new Promise<void>((r) => server?.close(() => r()));
  });

  const storedBytes = (key: string) =>
    (answers.sqlite.db.prepare('SELECT length(body) AS n FROM idempotency_records WHERE key = ?').get(key) as { n: number | null } | undefined)?.n ?? null;

  it.each([
    ['a 300 MiB answer', '/huge/charges', 201],
    ['an endless chunked answer', '/endless/charges', 200],
  ])(
    '%s: 502 upstream-response-too-large, the connection cut, the key finished small and replayed, never forwarded again',
    async (_name, path, upstreamStatus) => {
      const key = `answer-${path}`;
      const first = await command(answers.url, path, { fence: 1, entity: `e${path}`, key });
      const text = await first.clone().text();
      await expectProblem(first, 502, 'upstream-response-too-large', { upstream_status: upstreamStatus, max_response_bytes: LIMIT });
      // The upstream's writes end because the gateway hung up.
      expect(await written.get(key)).toBeLessThan(300 * 1024 * 1024);
      for (let retry = 0; retry < 3; retry++) {
        const again = await command(answers.url, path, { fence: 1, entity: `e${path}`, key });
        expect(again.status).toBe(502);
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expect(await again.text()).toBe(text);
      }
      expect(reached.get(key)).toBe(1);
      expect(recordRows(answers.sqlite, key)).toMatchObject([{ state: 'completed', status: 502 }]);
      expect(storedBytes(key)).toBeLessThan(2_048);
    },
  );

  it('a trickling answer that never ends: 504 at the deadline, outcome_unknown, the retry refused', async () => {
    const key = 'answer-trickle';
    await expectProblem(await command(answers.url, '/trickle/charges', { fence: 1, entity: 'e-trickle', key }), 504, 'upstream-timeout');
    expect(await written.get(key)).toBeLessThan(LIMIT);
    expect(recordRows(answers.sqlite, key)).toMatchObject([{ state: 'outcome_unknown' }]);
    await expectProblem(await command(answers.url, '/trickle/charges', { fence: 1, entity: 'e-trickle', key }), 409, 'outcome-unknown');
    expect(reached.get(key)).toBe(1);
  });
});
