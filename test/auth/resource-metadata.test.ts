import { discoverOAuthProtectedResourceMetadata, extractWWWAuthenticateParams, selectResourceURL } from '@modelcontextprotocol/sdk/client/auth.js';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { startMcpGateway, connectClient, mcpRoute, rawPost, type McpGateway } from '../mcp/harness.js';
import { startMcpUpstream, type McpUpstream } from '../mcp/mcp-upstream.js';
import { freePort, startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { AUDIENCE, bearer, hsAuth, ISSUER, token } from './tokens.js';

// With `auth.resource` (docs/auth-audit.md "Protected resource metadata"):
// the RFC 9728 document at its well-known path, the 401 challenges of
// proxied requests pointing at it, tokens for another audience refused,
// a `/.well-known/*` route not swallowing it, and the Node listener and the
// Hono app agreeing on every path. Real gateway on loopback, the real MCP
// SDK as client (its discovery and challenge parsing) and server.

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const WELL_KNOWN = '/.well-known/oauth-protected-resource';

interface Setup {
  up: McpUpstream;
  plain: FakeUpstream;
  gw: McpGateway;
  resource: string;
}

/** An mcp route at /mcp and a plain route taking every `/.well-known/*` path; `resource` is the gateway's own /mcp unless `withResource` is false. */
async function setup(withResource = true): Promise<Setup> {
  const up = await startMcpUpstream({ stateful: false, json: true });
  cleanups.push(() => up.close());
  const plain = await startUpstream();
  cleanups.push(() => plain.close());
  const port = await freePort();
  const resource = `http://127.0.0.1:${port}/mcp`;
  const auth = withResource ? hsAuth({ audience: undefined, resource }) : hsAuth();
  const gw = await startMcpGateway(
    [
      mcpRoute(up.url),
      { name: 'known', match: { path: '/.well-known/*', methods: ['GET', 'POST'] }, upstream: plain.url, fence: 'off', idempotency: 'off', mode: 'concurrent' },
    ],
    { config: { listen: { host: '127.0.0.1', port }, auth } },
  );
  cleanups.push(() => gw.close());
  return { up, plain, gw, resource };
}

/** The same request through the Hono app (`app.fetch`, the Workers way in). */
function viaApp(gw: McpGateway, path: string, init: RequestInit = {}): Promise<Response> {
  return Promise.resolve(gw.running.gateway.app.fetch(new Request(`http://127.0.0.1${path}`, init)));
}

const LIST = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}';

describe('the metadata document', () => {
  it('is served at the RFC 9728 path of the resource, on both ways in, and the SDK discovers and accepts it', async () => {
    const { gw, resource, plain } = await setup();
    const expected = { resource, authorization_servers: [ISSUER], scopes_supported: ['fencegate:proxy'], bearer_methods_supported: ['header'] };
    for (const res of [await fetch(`${gw.url}${WELL_KNOWN}/mcp`), await viaApp(gw, `${WELL_KNOWN}/mcp`)]) {
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(res.headers.get('access-control-allow-origin')).toBe('*');
      expect(await res.json()).toEqual(expected);
    }
    // The MCP SDK's own discovery (path-aware, as a client does from the server URL) and its resource check.
    const discovered = await discoverOAuthProtectedResourceMetadata(new URL(`${gw.url}/mcp`));
    expect(discovered.resource).toBe(resource);
    expect((await selectResourceURL(new URL(`${gw.url}/mcp`), {} as never, discovered))?.href).toBe(resource);
    // Only GET and HEAD; no token needed, nothing proxied.
    expect((await fetch(`${gw.url}${WELL_KNOWN}/mcp`, { method: 'HEAD' })).status).toBe(200);
    expect((await fetch(`${gw.url}${WELL_KNOWN}/mcp`, { method: 'POST', body: '{}' })).status).toBe(405);
    expect((await viaApp(gw, `${WELL_KNOWN}/mcp`, { method: 'POST', body: '{}' })).status).toBe(405);
    expect(plain.calls).toHaveLength(0);
  });

  it('a /.well-known/* route does not swallow it (other paths under it are still proxied); without resource that route takes the path', async () => {
    const { gw, plain } = await setup();
    const t = await token({ aud: `${new URL(gw.url).origin}/mcp` });
    expect((await fetch(`${gw.url}${WELL_KNOWN}/mcp`, { headers: bearer(t) })).status).toBe(200);
    expect((await fetch(`${gw.url}${WELL_KNOWN}/mcp%2F`, { headers: bearer(t) })).status).not.toBe(200);
    expect((await fetch(`${gw.url}/.well-known/other`, { headers: bearer(t) })).status).toBe(201);
    expect(plain.calls.map((c) => c.url)).not.toContain(`${WELL_KNOWN}/mcp`);
    expect(plain.calls.map((c) => c.url)).toContain('/.well-known/other');

    // The negative control: no resource, no document; the route proxies the path.
    const off = await setup(false);
    const t2 = await token();
    const res = await fetch(`${off.gw.url}${WELL_KNOWN}/mcp`, { headers: bearer(t2) });
    expect(res.status).toBe(201);
    expect(off.plain.calls.map((c) => c.url)).toContain(`${WELL_KNOWN}/mcp`);
  });

  it('the Node listener and the Hono app agree on every spelling of the path', async () => {
    const { gw } = await setup();
    const paths = [
      `${WELL_KNOWN}/mcp`,
      `${WELL_KNOWN}/%6Dcp`,
      `/.well-known/oauth-protected-resource%2Fmcp`,
      `${WELL_KNOWN}/mcp/`,
      `${WELL_KNOWN}/MCP`,
      `${WELL_KNOWN}/./mcp`,
      `${WELL_KNOWN}`,
      '/mcp',
    ];
    const node: [string, number][] = [];
    const app: [string, number][] = [];
    for (const p of paths) {
      node.push([p, (await fetch(`${gw.url}${p}`)).status]);
      app.push([p, (await viaApp(gw, p)).status]);
    }
    expect(app).toEqual(node);
    // The document answers on the exact path and on every spelling that the proxy's normal form or the app's own reading
    // (decodeURI, which keeps %2F) takes to it, as the admin prefix does: never proxied on one way in and served on the other.
    expect(node.filter(([, s]) => s === 200).map(([p]) => p)).toEqual([`${WELL_KNOWN}/mcp`, `${WELL_KNOWN}/%6Dcp`, `${WELL_KNOWN}/./mcp`]);
    expect(node.filter(([, s]) => s !== 200).every(([, s]) => s === 401)).toBe(true);
  });
});

describe('challenges and audience', () => {
  it('a proxied 401 names the metadata (resource_metadata), as the SDK reads it; without resource it does not', async () => {
    const { gw, up } = await setup();
    const metadataUrl = `${new URL(gw.url).origin}${WELL_KNOWN}/mcp`;
    for (const res of [
      await rawPost(`${gw.url}/mcp`, LIST),
      await viaApp(gw, '/mcp', { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: LIST }),
    ]) {
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toBe(`Bearer realm="fencegate", resource_metadata="${metadataUrl}"`);
      expect(extractWWWAuthenticateParams(res).resourceMetadataUrl?.href).toBe(metadataUrl);
    }
    const expired = await rawPost(`${gw.url}/mcp`, LIST, bearer(await token({ aud: `${new URL(gw.url).origin}/mcp`, expIn: -60 })));
    expect(expired.headers.get('www-authenticate')).toMatch(/^Bearer realm="fencegate", error="invalid_token", error_description="[^"]*", resource_metadata="/);
    // A 403 (a token for the resource without the proxy scope) names it too, so a client can step up its scopes there.
    const noScope = await rawPost(`${gw.url}/mcp`, LIST, bearer(await token({ aud: `${new URL(gw.url).origin}/mcp`, scope: 'fencegate:audit' })));
    expect(noScope.status).toBe(403);
    expect(noScope.headers.get('www-authenticate')).toBe(
      `Bearer realm="fencegate", error="insufficient_scope", scope="fencegate:proxy", resource_metadata="${metadataUrl}"`,
    );
    expect(up.requests).toHaveLength(0);

    const off = await setup(false);
    const plain401 = await rawPost(`${off.gw.url}/mcp`, LIST);
    expect(plain401.status).toBe(401);
    expect(plain401.headers.get('www-authenticate')).toBe('Bearer realm="fencegate"');
  });

  it('a token for this resource works with the SDK client; one for another audience is refused 401 and logged; the old audience is no longer accepted', async () => {
    const { gw, up, resource } = await setup();
    const good = await connectClient(`${gw.url}/mcp`, { headers: bearer(await token({ aud: resource })) });
    cleanups.push(() => good.close());
    expect((await good.client.listTools()).tools.length).toBeGreaterThan(0);
    const reached = up.requests.length;

    for (const aud of ['https://other.example/mcp', AUDIENCE, `${resource}/`]) {
      const res = await rawPost(`${gw.url}/mcp`, LIST, bearer(await token({ aud })));
      expect(res.status, aud).toBe(401);
      expect(res.headers.get('www-authenticate')).toContain('error="invalid_token", error_description="wrong audience"');
    }
    expect(up.requests).toHaveLength(reached);
    const rows = gw.sqlite.db.prepare("SELECT reason, detail FROM rejections WHERE reason = 'unauthorized'").all() as { detail: string }[];
    expect(rows.filter((r) => r.detail.startsWith('wrong audience'))).toHaveLength(3);
  });
});

describe('configuration', () => {
  const route = { name: 'm', protocol: 'mcp', match: { path: '/mcp' }, upstream: 'http://127.0.0.1:1' };
  const parse = (auth: Record<string, unknown>, routes: Record<string, unknown>[] = [route]) => parseConfig({ auth, routes });

  it('resource is the audience by default, the issuer the authorization server; both can be given', () => {
    const a = parse(hsAuth({ audience: undefined, resource: 'https://gw.example/mcp' })).auth!;
    expect(a.audience).toBe('https://gw.example/mcp');
    expect(a.authorizationServers).toEqual([ISSUER]);
    const b = parse(
      hsAuth({ audience: ['https://gw.example/mcp', 'legacy'], resource: 'https://gw.example/mcp', authorizationServers: ['https://as.example'] }),
    ).auth!;
    expect(b.audience).toEqual(['https://gw.example/mcp', 'legacy']);
    expect(b.authorizationServers).toEqual(['https://as.example']);
    // Without resource nothing changes.
    expect(parse(hsAuth()).auth!.audience).toBe(AUDIENCE);
  });

  it('refuses at start-up: an audience without the resource, no authorization server, a bad identifier, a route on the metadata path', () => {
    expect(() => parse(hsAuth({ resource: 'https://gw.example/mcp' }))).toThrow(/audience: must include the resource/);
    expect(() => parse(hsAuth({ audience: undefined, issuer: 'fencegate', resource: 'https://gw.example/mcp' }))).toThrow(/authorizationServers/);
    expect(() => parse(hsAuth({ audience: undefined }))).toThrow(/audience/);
    for (const resource of ['https://gw.example/mcp?x=1', 'https://gw.example/mcp#f', 'https://gw.example/mcp/', 'ftp://gw.example/']) {
      expect(() => parse(hsAuth({ audience: undefined, resource })), resource).toThrow(/resource/);
    }
    expect(() =>
      parse(hsAuth({ audience: undefined, resource: 'https://gw.example/mcp' }), [
        route,
        { ...route, name: 'w', protocol: 'http', match: { path: `${WELL_KNOWN}/mcp` } },
      ]),
    ).toThrow(/protected resource metadata/);
    // A wildcard route may cover it (the path is then kept from it), and the bare origin is a resource too.
    expect(
      parse(hsAuth({ audience: undefined, resource: 'https://gw.example' }), [route, { ...route, name: 'w', protocol: 'http', match: { path: '/*' } }]).auth!
        .resource,
    ).toBe('https://gw.example');
  });
});
