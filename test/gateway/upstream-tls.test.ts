import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, recordRows, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { tempDir } from '../helpers/temp.js';

// routes[].tls against a real HTTPS upstream on 127.0.0.1 whose certificate
// a private CA signed and which asks for a client certificate (mutual TLS,
// as payment APIs do): the CA is what makes the upstream trusted, the client
// certificate is what the upstream sees (docs/deploy.md §5).

const tmp = tempDir();
const file = (name: string) => join(tmp.dir, name);
const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: tmp.dir, stdio: ['ignore', 'pipe', 'pipe'] });

/** A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it. */
function makeCertificates(): void {
  openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=fencegate test CA');
  for (const [name, cn, ext] of [
    ['server', '127.0.0.1', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n'],
    ['client', 'fencegate-client', 'extendedKeyUsage=clientAuth\n'],
  ] as const) {
    writeFileSync(file(`${name}.ext`), ext);
    openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`);
    openssl(
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      `${name}.pem`,
      '-days',
      '2',
      '-extfile',
      `${name}.ext`,
    );
  }
}

let upstream: Server;
let upstreamUrl: string;
/** What the upstream saw of each request's TLS client. */
const seen: { authorized: boolean; cn: string | null }[] = [];
const gateways: TestGateway[] = [];

beforeAll(async () => {
  makeCertificates();
  upstream = createServer(
    {
      key: readFileSync(file('server.key')),
      cert: readFileSync(file('server.pem')),
      ca: readFileSync(file('ca.pem')),
      requestCert: true,
      rejectUnauthorized: false,
    },
    (req, res) => {
      const socket = req.socket as TLSSocket;
      const peer = socket.getPeerCertificate();
      seen.push({ authorized: socket.authorized, cn: peer && typeof peer.subject?.CN === 'string' ? peer.subject.CN : null });
      req.resume();
      req.on('end', () => {
        res.writeHead(201, { 'content-type': 'application/json' });
        res.end('{"ok":true}');
      });
    },
  );
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  upstreamUrl = `https://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const g of gateways) await g.close();
  upstream.closeAllConnections();
  await new Promise<void>((resolve) => upstream.close(() => resolve()));
  tmp.cleanup();
});

async function gatewayWith(tls: Record<string, unknown> | undefined): Promise<TestGateway> {
  const g = await startTestGateway({ routes: [paymentsRoute(upstreamUrl, tls === undefined ? {} : { tls })] });
  gateways.push(g);
  return g;
}

describe('upstream TLS', () => {
  it('without the CA the upstream is not trusted: 502 upstream-unavailable, nothing reached it', async () => {
    const g = await gatewayWith(undefined);
    const before = seen.length;
    await expectProblem(await command(g.url, '/payments/charges', { fence: 1, entity: 'e1', key: 'k1' }), 502, 'upstream-unavailable');
    expect(seen.length).toBe(before);
    // A refused certificate is before any byte of the request: no outcome_unknown record for an operator to resolve.
    expect(recordRows(g.sqlite, 'k1').map((r) => r.state)).not.toContain('outcome_unknown');
  });

  it('with the CA file it passes; without a client certificate the upstream sees none', async () => {
    const g = await gatewayWith({ ca: file('ca.pem') });
    const res = await command(g.url, '/payments/charges', { fence: 1, entity: 'e2', key: 'k2' });
    expect(res.status).toBe(201);
    expect(seen.at(-1)).toEqual({ authorized: false, cn: null });
  });

  it('with a client certificate and key the upstream sees it, verified against its CA (mutual TLS)', async () => {
    const g = await gatewayWith({ ca: file('ca.pem'), cert: file('client.pem'), key: file('client.key') });
    const res = await command(g.url, '/payments/charges', { fence: 1, entity: 'e3', key: 'k3' });
    expect(res.status).toBe(201);
    expect(seen.at(-1)).toEqual({ authorized: true, cn: 'fencegate-client' });
  });

  it('PEM text from the environment ({ "env": … }) works as the files do', async () => {
    const env = {
      FG_TEST_CA_PEM: readFileSync(file('ca.pem'), 'utf8'),
      FG_TEST_CLIENT_PEM: readFileSync(file('client.pem'), 'utf8'),
      FG_TEST_CLIENT_KEY: readFileSync(file('client.key'), 'utf8'),
    };
    Object.assign(process.env, env);
    try {
      const g = await gatewayWith({ ca: { env: 'FG_TEST_CA_PEM' }, cert: { env: 'FG_TEST_CLIENT_PEM' }, key: { env: 'FG_TEST_CLIENT_KEY' } });
      expect((await command(g.url, '/payments/charges', { fence: 1, entity: 'e4', key: 'k4' })).status).toBe(201);
      expect(seen.at(-1)).toEqual({ authorized: true, cn: 'fencegate-client' });
    } finally {
      for (const k of Object.keys(env)) delete process.env[k];
    }
  });

  it("a key that is not the certificate's stops start-up naming the field", async () => {
    await expect(gatewayWith({ ca: file('ca.pem'), cert: file('client.pem'), key: file('server.key') })).rejects.toThrow(
      /routes\[0\]\.tls: .*key values mismatch/,
    );
  });
});
