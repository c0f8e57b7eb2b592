import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { readMessage } from '../../src/http/mcp/message.js';
import { ToolAnnotations, toolPolicy } from '../../src/http/mcp/policy.js';
import { SseSplitter } from '../../src/http/mcp/sse.js';

// The pure parts of the mcp route: event splitting, message reading, the
// canonical arguments, the tool policy, and the config fields.

const enc = new TextEncoder();

describe('SseSplitter', () => {
  it('splits events on LF, CRLF and CR (a last CR at the end of the stream), across chunk boundaries, keeping each event as it came', () => {
    const text = 'event: message\r\ndata: {"a":1}\r\n\r\n: comment\n\ndata: x\rdata: y\r\r';
    const one = new SseSplitter(1000);
    const whole = [...one.push(enc.encode(text))!, ...one.end()];
    const bytewise: { raw: string; data: string | null }[] = [];
    const s = new SseSplitter(1000);
    for (const b of enc.encode(text)) bytewise.push(...s.push(Uint8Array.of(b))!);
    bytewise.push(...s.end());
    expect(whole).toEqual(bytewise);
    expect(whole.map((e) => e.data)).toEqual(['{"a":1}', null, 'x\ny']);
    expect(whole.map((e) => e.raw).join('')).toBe(text);
  });

  it('gives up (null) once one event passes the limit', () => {
    const s = new SseSplitter(16);
    expect(s.push(enc.encode('data: 0123456789'))).toEqual([]);
    expect(s.push(enc.encode('0123456789'))).toBeNull();
  });
});

describe('readMessage', () => {
  const digestOf = (args: string) => {
    const m = readMessage(enc.encode(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","arguments":${args}}}`));
    return m.kind === 'call' ? m.argsDigest : m.kind;
  };

  it('reads a tools/call and digests its arguments: member order and whitespace do not count', () => {
    const a = digestOf('{"b":[1,{"y":2,"x":1}],"a":"s"}');
    expect(a).toMatch(/^json:[0-9a-f]{64}$/);
    expect(digestOf('{ "a" : "s", "b" : [ 1 , { "x":1, "y":2 } ] }')).toBe(a);
    expect(digestOf('{"a":"s","b":[1,{"x":1,"y":3}]}')).not.toBe(a);
  });

  it.each([
    ['9007199254740993', '9007199254740992'],
    ['1e400', 'null'],
    ['-0', '0'],
    ['1.0', '1'],
  ])('keeps the number literal as written: %s and %s are two calls', (x, y) => {
    expect(digestOf(`{"n":${x}}`)).not.toBe(digestOf(`{"n":${y}}`));
    // Negative control: JSON.parse reads them as one value (the old canonical form merged them).
    expect(JSON.stringify(JSON.parse(`{"n":${x}}`))).toBe(JSON.stringify(JSON.parse(`{"n":${y}}`)));
  });

  it('refuses a repeated member name at any depth of arguments (invalid-request)', () => {
    expect(digestOf('{"to":{"iban":"A","iban":"B"}}')).toBe('refused');
    expect(digestOf('{"x":[{"k":1,"K":2}]}')).toBe('refused');
    expect(digestOf('{"to":{"iban":"B"}}')).toMatch(/^json:/);
  });

  it.each([
    ['{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","name":"u"}}', /more than once/],
    ['{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","_meta":{"k":1,"k":2}}}', /more than once/],
    ['{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"t"}}', /id/],
    ['{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a\\u0000b"}}', /control/],
    ['[{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}]', /more than once/],
  ])('refuses %s', (body, why) => {
    const m = readMessage(enc.encode(body));
    expect(m.kind).toBe('refused');
    if (m.kind === 'refused') expect(m.refusal.detail).toMatch(why);
  });
});

describe('tool policy and config', () => {
  const config = parseConfig({
    store: { sqlite: ':memory:' },
    routes: [
      {
        name: 'm',
        protocol: 'mcp',
        match: { path: '/mcp' },
        upstream: 'http://127.0.0.1:1',
        tools: { pay: { timeoutMs: 500, entity: { json: '/arguments/invoice' } }, '*': { mode: 'concurrent' } },
      },
    ],
  });
  const route = config.routes[0]!;

  it('an mcp route defaults to POST, GET and DELETE; tools override the route, then "*"', () => {
    expect(route.match.methods).toEqual(['POST', 'GET', 'DELETE']);
    const p = toolPolicy(route, 'pay', new ToolAnnotations(), '/mcp');
    expect(p.route).toMatchObject({ timeoutMs: 500, entity: { json: '/arguments/invoice' }, mode: 'concurrent', fence: 'required' });
    expect(toolPolicy(route, 'other', new ToolAnnotations(), '/mcp').route.timeoutMs).toBe(10_000);
  });

  it('readOnlyHint makes a listed tool read-only unless the config says otherwise; unlisted tools are side-effecting', () => {
    const a = new ToolAnnotations();
    expect(toolPolicy(route, 'search', a, '/mcp').readOnly).toBe(false);
    a.learn('m', '/mcp', {
      tools: [
        { name: 'search', annotations: { readOnlyHint: true } },
        { name: 'pay', annotations: { readOnlyHint: true } },
      ],
    });
    expect(toolPolicy(route, 'search', a, '/mcp')).toMatchObject({ readOnly: true, readOnlyFrom: 'annotations' });
    const strict = parseConfig({ store: { sqlite: ':memory:' }, routes: [{ ...route, match: { path: '/mcp' }, tools: { '*': { readOnly: false } } }] })
      .routes[0]!;
    expect(toolPolicy(strict, 'search', a, '/mcp')).toMatchObject({ readOnly: false, readOnlyFrom: 'config' });
  });

  it('tools on a plain route stop start-up naming the field', () => {
    expect(() =>
      parseConfig({ store: { sqlite: ':memory:' }, routes: [{ name: 'p', match: { path: '/p' }, upstream: 'http://127.0.0.1:1', tools: { x: {} } }] }),
    ).toThrow(/routes\.0\.tools|routes\[0\]\.tools/);
  });
});
