import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { csvLine, CSV_HEADER, ndjsonLine, tableLine, type RejectionJson } from '../../src/http/audit/format.js';
import type { RejectionInput } from '../../src/store/types.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import { command, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { CLI, killAll as killChildren, runNode } from '../helpers/child.js';
import { startUpstream } from '../helpers/upstream.js';

// What the audit formats print when a rejection row holds characters that
// drive a terminal: ESC sequences, the one-byte C1 CSI (U+009B), DEL, CR, BS
// and bidi overrides. Unit checks of each format, then `fencegate audit`
// (compiled: `npm run build` first) against a real gateway and its SQLite
// file, with the bytes it writes to stdout inspected.

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  await killChildren();
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Clear screen, red text, cursor home, a C1 CSI, a right-to-left override, DEL, backspace, CR. */
const HOSTILE = 'e\u001b[2J\u001b[31mred\u009b2J\u009b0m\u202egnp.exe\u2066x\u007f\b\rZ';

/** Any byte sequence a terminal would act on: C0 but LF (and CR only before LF), DEL, C1 (UTF-8 C2 80–9F), bidi controls. */
function terminalControls(text: string, { crlf = false } = {}): string[] {
  const lines = crlf ? text.replace(/\r\n/g, '\n') : text;
  return [...lines.matchAll(/[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g)].map(
    (m) => `U+${m[0].charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}

function row(o: Partial<RejectionJson> = {}): RejectionJson {
  return {
    id: '7',
    at: '2026-01-01T00:00:00.000Z',
    reason: 'stale-fence',
    entity: HOSTILE,
    presented_fence: '1',
    current_fence: '2',
    idempotency_key: 'k',
    caller: `c${HOSTILE}`,
    method: 'POST',
    path: `/payments/${HOSTILE}`,
    payload_sha256: null,
    request_id: 'r',
    client_request_id: null,
    tool: null,
    detail: HOSTILE,
    ...o,
  };
}

describe('the audit formats neutralise control characters', () => {
  it('table: every C0, DEL, C1 and bidi control becomes ?', () => {
    const line = tableLine(row());
    expect(terminalControls(line.slice(0, -1))).toEqual([]);
    expect(line).toContain('e?[2J?[31mred?2J?0m?gnp');
  });

  it('CSV: written as visible \\uXXXX escapes; formula cells still defused, also behind an escaped tab', () => {
    const line = csvLine(row());
    expect(terminalControls(line, { crlf: true })).toEqual([]);
    expect(line.endsWith('\r\n')).toBe(true);
    expect(line.split('\r\n')).toHaveLength(2); // a CR inside a cell never starts a line
    expect(line).toContain('e\\u001b[2J\\u001b[31mred\\u009b2J\\u009b0m\\u202egnp.exe\\u2066x\\u007f\\u0008\\u000dZ');
    expect(csvLine(row({ entity: '=cmd|"/c calc"!A1' }))).toContain(`,"'=cmd|""/c calc""!A1",`);
    expect(csvLine(row({ entity: '\t=1+1' }))).toContain(',\\u0009=1+1,');
    expect(CSV_HEADER).toMatch(/^id,at,reason,entity,/);
  });

  it('NDJSON: DEL, C1 and bidi controls escaped too, and the line parses back to the exact values', () => {
    const r = row();
    const line = ndjsonLine(r);
    expect(terminalControls(line.slice(0, -1))).toEqual([]);
    expect(line).toContain('\\u009b2J');
    expect(line).toContain('\\u202e');
    expect(JSON.parse(line)).toEqual(r);
    // Negative control: plain JSON.stringify lets C1 and bidi through.
    expect(terminalControls(JSON.stringify(r))).toEqual(expect.arrayContaining(['U+009b', 'U+202e', 'U+007f']));
  });
});

describe('fencegate audit prints no terminal controls', () => {
  async function seeded(): Promise<{ gw: TestGateway; auditor: string }> {
    const up = await startUpstream();
    cleanups.push(() => up.close());
    const gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: hsAuth() } });
    cleanups.unshift(() => gw.close());
    // End to end: a caller whose token's `sub` carries the sequences (the
    // caller id is whatever the identity provider signed) sends a stale fence.
    const hostile = await token({ sub: HOSTILE });
    expect((await command(gw.url, '/payments/x', { fence: 5, entity: 'tool-job:1', key: 'a', headers: bearer(hostile) })).status).toBe(201);
    expect((await command(gw.url, '/payments/x', { fence: 4, entity: 'tool-job:1', key: 'b', headers: bearer(hostile) })).status).toBe(409);
    // Rows written by the store as they are (another gateway version, a
    // restored file): the sequences in the entity, the path and the key.
    const injected: RejectionInput = {
      reason: 'stale-fence',
      entity: HOSTILE,
      presentedFence: 1n,
      currentFence: 2n,
      idempotencyKey: `k${HOSTILE}`,
      audit: { requestId: 'req-x', clientRequestId: null, caller: null, method: 'POST', path: `/payments/${HOSTILE}`, payloadSha256: 'ab'.repeat(32) },
    };
    await gw.sqlite.recordRejection(injected);
    const rows = gw.sqlite.db.prepare('SELECT entity, caller, path FROM rejections').all() as { entity: string; caller: string | null; path: string }[];
    expect(rows.map((r) => r.caller)).toContain(HOSTILE);
    expect(rows.map((r) => r.entity)).toContain(HOSTILE);
    return { gw, auditor: await token({ sub: 'auditor', scope: 'fencegate:audit' }) };
  }

  it('table, csv and ndjson, against the gateway and against its file', async () => {
    const { gw, auditor } = await seeded();
    const sources = [
      ['--url', gw.url, '--token', auditor],
      ['--db', gw.dbPath],
    ];
    for (const source of sources) {
      for (const format of ['table', 'csv', 'ndjson']) {
        const r = await runNode([CLI, 'audit', ...source, '--format', format]);
        const what = `${source[0]} --format ${format}`;
        expect(r.code, `${what}: ${r.stderr}`).toBe(0);
        const body = r.stdout;
        expect(body.trim().split(/\r?\n/), what).toHaveLength(format === 'ndjson' ? 2 : 3);
        expect(terminalControls(body, { crlf: format === 'csv' }), what).toEqual([]);
        if (format === 'ndjson') {
          const parsed = body
            .trim()
            .split('\n')
            .map((l) => JSON.parse(l));
          expect(parsed.map((p) => p.caller ?? p.entity)).toEqual([HOSTILE, HOSTILE]);
          expect(parsed.find((p) => p.caller === null).path).toBe(`/payments/${HOSTILE}`);
        }
        if (format === 'csv') expect(body).toContain('\\u009b2J');
      }
    }
  });

  it('an error answer is printed to stderr with its control characters made visible', async () => {
    // Whatever answers at --url (a proxy in between, a gateway of another
    // version) may echo what a caller sent.
    const server = createServer((_req, res) => res.writeHead(502, { 'content-type': 'text/plain' }).end(`bad gateway for ${HOSTILE}`));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const r = await runNode([CLI, 'audit', '--url', `http://127.0.0.1:${(server.address() as AddressInfo).port}`, '--token', 'x']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^fencegate: 502 Bad Gateway: bad gateway for e\\u001b\[2J/);
    expect(r.stderr).toContain('\\u009b2J');
    expect(terminalControls(r.stderr.replace(/\n$/, ''))).toEqual([]);
  });
});
