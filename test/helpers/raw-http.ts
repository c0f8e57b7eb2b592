import { connect } from 'node:net';

/**
 * A bare HTTP/1.1 client over a socket, for inputs that fetch and undici
 * refuse to send: repeated headers, control characters, non-ASCII bytes,
 * hop-by-hop fields, chunked bodies of a chosen shape.
 */

export interface RawResponse {
  status: number;
  /** Lower-cased names; repeated fields joined with ", ". */
  headers: Record<string, string>;
  body: Buffer;
  text: string;
}

export interface RawRequest {
  method?: string;
  path: string;
  /** Sent in order, exactly as given (values are written as latin1 bytes). */
  headers: [string, string][];
  body?: Buffer | string;
  /** Send the body with Transfer-Encoding: chunked, in chunks of this size. */
  chunked?: number;
}

export async function rawRequest(url: string, req: RawRequest): Promise<RawResponse> {
  const { hostname, port } = new URL(url);
  const body = req.body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(req.body) ? req.body : Buffer.from(req.body, 'utf8');
  const lines = [`${req.method ?? 'POST'} ${req.path} HTTP/1.1`, `Host: ${hostname}:${port}`, 'Connection: close'];
  for (const [n, v] of req.headers) lines.push(`${n}: ${v}`);
  if (req.chunked !== undefined) lines.push('Transfer-Encoding: chunked');
  else if (body.length > 0 || (req.method ?? 'POST') !== 'GET') lines.push(`Content-Length: ${body.length}`);
  const head = Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1');

  let payload = body;
  if (req.chunked !== undefined) {
    const parts: Buffer[] = [];
    for (let i = 0; i < body.length; i += req.chunked) {
      const chunk = body.subarray(i, i + req.chunked);
      parts.push(Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n'));
    }
    parts.push(Buffer.from('0\r\n\r\n'));
    payload = Buffer.concat(parts);
  }

  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname);
    const chunks: Buffer[] = [];
    socket.on('data', (c) => chunks.push(c));
    // The gateway may answer (413) and close before the whole body is written.
    socket.on('error', (err: NodeJS.ErrnoException) => {
      if (chunks.length > 0 && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) return;
      reject(err);
    });
    socket.on('close', () => {
      try {
        resolve(parseResponse(Buffer.concat(chunks)));
      } catch (err) {
        reject(err);
      }
    });
    socket.write(Buffer.concat([head, payload]));
  });
}

function parseResponse(raw: Buffer): RawResponse {
  const end = raw.indexOf('\r\n\r\n');
  if (end < 0) throw new Error(`incomplete HTTP response: ${JSON.stringify(raw.toString('latin1'))}`);
  const [statusLine, ...headerLines] = raw.subarray(0, end).toString('latin1').split('\r\n');
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine!)?.[1]);
  const headers: Record<string, string> = {};
  for (const line of headerLines) {
    const i = line.indexOf(':');
    const name = line.slice(0, i).trim().toLowerCase();
    const value = line.slice(i + 1).trim();
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  let body = raw.subarray(end + 4);
  if (headers['transfer-encoding']?.toLowerCase() === 'chunked') body = dechunk(body);
  else if (headers['content-length'] !== undefined) body = body.subarray(0, Number(headers['content-length']));
  return { status, headers, body, text: body.toString('utf8') };
}

function dechunk(buf: Buffer): Buffer {
  const out: Buffer[] = [];
  let i = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', i);
    if (eol < 0) break;
    const size = parseInt(buf.subarray(i, eol).toString('latin1'), 16);
    if (!(size > 0)) break;
    out.push(buf.subarray(eol + 2, eol + 2 + size));
    i = eol + 2 + size + 2;
  }
  return Buffer.concat(out);
}
