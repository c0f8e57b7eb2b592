/**
 * Upstreams that fail on purpose, at the TCP level, for the probe of what
 * workerd's `fetch` reports (upstream-errors.workerd.ts). Started in Node by
 * the workerd suite's globalSetup (fake-upstream.setup.ts); loopback only.
 *
 * `http` is a raw `net` server, so a test decides exactly when the socket
 * goes and how (RST or FIN), by path, once the whole request has arrived:
 *
 *   /ok           200, 2 bytes
 *   /rst-after    the request read, then RST (no answer)
 *   /fin-after    the request read, then FIN (no answer)
 *   /rst-partial  status line, headers and part of the body, then RST
 *   /garbage      the request read, then bytes that are not HTTP
 *   /hang         the request read, never answered
 *
 * Each request that arrives whole is counted per `x-probe-id`
 * (`GET /__arrived?id=…`), so a test can say whether the upstream got it.
 * `rstOnAccept` resets every connection the moment it is accepted, before
 * reading a byte; `tls` is a TLS server with a self-signed certificate that
 * workerd does not trust.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer as createNetServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer as createTlsServer } from 'node:tls';

export interface FaultUrls {
  /** `http://127.0.0.1:<port>`: the raw server above. */
  http: string;
  /** A server that resets every connection on accept. */
  rstOnAccept: string;
  /** `https://127.0.0.1:<port>`: TLS with an untrusted certificate. Null when no openssl was found. */
  tls: string | null;
}

export interface FaultUpstreams {
  urls: FaultUrls;
  close(): Promise<void>;
}

function listen(server: Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)));
}

/** Reads one HTTP/1.1 request (headers and a content-length or chunked body) and hands it over once whole. */
function onRequest(socket: Socket, handle: (path: string, headers: Map<string, string>) => void): void {
  let buf = Buffer.alloc(0);
  socket.on('data', (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    const end = buf.indexOf('\r\n\r\n');
    if (end < 0) return;
    const [line, ...fields] = buf.subarray(0, end).toString('latin1').split('\r\n');
    const headers = new Map(fields.map((f) => [f.slice(0, f.indexOf(':')).trim().toLowerCase(), f.slice(f.indexOf(':') + 1).trim()]));
    const chunked = /chunked/i.test(headers.get('transfer-encoding') ?? '');
    if (
      chunked
        ? !buf
            .subarray(end + 4)
            .toString('latin1')
            .endsWith('0\r\n\r\n')
        : buf.length - end - 4 < Number(headers.get('content-length') ?? 0)
    )
      return;
    socket.removeAllListeners('data');
    handle(line!.split(' ')[1] ?? '/', headers);
  });
  socket.on('error', () => {});
}

export async function startFaultUpstreams(): Promise<FaultUpstreams> {
  const arrived = new Map<string, number>();
  const sockets = new Set<Socket>();
  const track = (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  };

  const http = createNetServer((socket) => {
    track(socket);
    onRequest(socket, (path, headers) => {
      const url = new URL(path, 'http://x');
      if (url.pathname === '/__arrived') {
        const body = JSON.stringify({ count: arrived.get(url.searchParams.get('id') ?? '') ?? 0 });
        socket.end(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
        return;
      }
      const id = headers.get('x-probe-id') ?? '';
      arrived.set(id, (arrived.get(id) ?? 0) + 1);
      switch (url.pathname) {
        case '/ok':
          return void socket.end('HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok');
        case '/rst-after':
          return void socket.resetAndDestroy();
        case '/fin-after':
          return void socket.end();
        case '/rst-partial':
          socket.write('HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 100\r\n\r\npartial');
          return void setTimeout(() => socket.resetAndDestroy(), 50);
        case '/garbage':
          return void socket.end('SSH-2.0-not-http\r\n\r\n');
        case '/hang':
        default:
          return;
      }
    });
  });

  const rstOnAccept = createNetServer((socket) => {
    track(socket);
    socket.on('error', () => {});
    socket.resetAndDestroy();
  });

  let tls: Server | null = null;
  const certDir = mkdtempSync(join(tmpdir(), 'fencegate-probe-tls-'));
  try {
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'rsa:2048',
        '-nodes',
        '-days',
        '1',
        '-subj',
        '/CN=127.0.0.1',
        '-keyout',
        join(certDir, 'key.pem'),
        '-out',
        join(certDir, 'cert.pem'),
      ],
      { stdio: 'ignore' },
    );
    tls = createTlsServer({ key: readFileSync(join(certDir, 'key.pem')), cert: readFileSync(join(certDir, 'cert.pem')) }, (socket) => {
      track(socket);
      onRequest(socket, (_path, headers) => {
        const id = headers.get('x-probe-id') ?? '';
        arrived.set(id, (arrived.get(id) ?? 0) + 1);
        socket.end('HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok');
      });
    });
    tls.on('tlsClientError', () => {});
  } catch {
    tls = null; // no openssl: the TLS probe is skipped
  } finally {
    rmSync(certDir, { recursive: true, force: true });
  }

  const [httpPort, rstPort, tlsPort] = [await listen(http), await listen(rstOnAccept), tls === null ? null : await listen(tls)];
  return {
    urls: { http: `http://127.0.0.1:${httpPort}`, rstOnAccept: `http://127.0.0.1:${rstPort}`, tls: tlsPort === null ? null : `https://127.0.0.1:${tlsPort}` },
    async close() {
      for (const s of sockets) s.destroy();
      await Promise.all([http, rstOnAccept, tls].filter((s): s is Server => s !== null).map((s) => new Promise<void>((r) => s.close(() => r()))));
    },
  };
}
