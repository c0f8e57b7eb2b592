import { describe, expect, it } from 'vitest';
import type { Exchange } from '../../src/http/pipeline/exchange.js';
import { InFlightCalls, sessionOf } from '../../src/http/mcp/resume.js';

// A resuming GET or a cancel is tied to a call by its session, within the
// route, the endpoint and the authenticated caller (src/http/mcp/resume.ts
// sessionOf): the same Mcp-Session-Id and event id elsewhere tie nothing.
const exchange = (over: { route?: string; path?: string; caller?: string | null; session?: string | null }): Exchange =>
  ({
    req: { headers: new Headers(over.session === null ? {} : { 'mcp-session-id': over.session ?? 's-1' }) },
    route: { name: over.route ?? 'tools' },
    pathname: over.path ?? '/mcp',
    search: '',
    caller: over.caller === undefined ? 'alice' : over.caller,
  }) as unknown as Exchange;

describe('the session a call is tied by', () => {
  it('ties the same session, route, endpoint and caller; nothing else', () => {
    const calls = new InFlightCalls();
    const watch = calls.open(sessionOf(exchange({})), 7, 60_000)!;
    watch.saw({ raw: '', data: null, type: 'message', id: 'ev-1', retry: null } as unknown as Parameters<typeof watch.saw>[0]);
    expect(calls.tiedTo(sessionOf(exchange({})), 'ev-1')).toBe(watch);
    expect(calls.cancelled(sessionOf(exchange({})), 7)).toBe(watch);
    for (const other of [{ route: 'other' }, { path: '/mcp2' }, { caller: 'mallory' }, { caller: null }]) {
      expect(calls.tiedTo(sessionOf(exchange(other)), 'ev-1'), JSON.stringify(other)).toBeUndefined();
      expect(calls.cancelled(sessionOf(exchange(other)), 7), JSON.stringify(other)).toBeUndefined();
    }
    expect(sessionOf(exchange({ session: null }))).toBeNull();
  });
});
