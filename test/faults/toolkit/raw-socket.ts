import { connect } from 'node:net';

/**
 * Exact bytes over a socket, for inputs no HTTP client will produce:
 * smuggling attempts (Content-Length with Transfer-Encoding, two lengths,
 * obs-fold), absolute-form request targets, bodies sent slowly or cut short.
 * (test/helpers/raw-http.ts builds well-framed requests; this one frames nothing.)
 */

export interface RawAnswer {
  /** 0 when the connection closed without any answer. */
  status: number;
  /** Every status line seen on the connection, in order (pipelined answers). */
  statuses: number[];
  headers: Record<string, string>;
  /** The body of the first answer, as text. */
  text: string;
  raw: string;
}

export interface SendOptions {
  /** Write the bytes in pieces of this size, `pauseMs` apart (a slow client). */
  pieceBytes?: number;
  pauseMs?: number;
  /** After the last byte: 'wait' (keep open until one whole answer came, the default), 'end' (half-close), 'destroy' (reset). */
  then?: 'end' | 'destroy' | 'wait';
  /** Bound on the whole exchange. */
  timeoutMs?: number;
}

export function sendBytes(url: string, bytes: Buffer | string, options: SendOptions = {}): Promise<RawAnswer> {
  const { hostname, port } = new URL(url);
  const data = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes, 'latin1');
  const piece = options.pieceBytes ?? data.length;
  // The answer to HEAD has a Content-Length but never a body (RFC 9110 §9.3.2).
  const headOnly = data.subarray(0, 5).toString('latin1') === 'HEAD ';
  return new Promise((resolve) => {
    const socket = connect(Number(port), hostname);
    const chunks: Buffer[] = [];
    let settled = false;
    const finish = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(parseAnswer(Buffer.concat(chunks).toString('latin1')));
    };
    const timer = setTimeout(finish, options.timeoutMs ?? 10_000);
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      // 'wait': done once one whole answer (head and declared body) is in.
      if ((options.then ?? 'wait') === 'wait' && complete(Buffer.concat(chunks).toString('latin1'), headOnly)) finish();
    });
    socket.on('error', () => finish());
    socket.on('close', () => finish());
    socket.on('connect', async () => {
      for (let i = 0; i < data.length && !socket.destroyed; i += piece) {
        socket.write(data.subarray(i, i + piece));
        if (options.pauseMs && i + piece < data.length) await new Promise((r) => setTimeout(r, options.pauseMs));
      }
      if (socket.destroyed) return;
      if (options.then === 'destroy') {
        socket.resetAndDestroy();
        finish();
      } else if (options.then === 'end') {
        socket.end();
      }
    });
  });
}

function complete(raw: string, headOnly: boolean): boolean {
  const end = raw.indexOf('\r\n\r\n');
  if (end < 0) return false;
  if (headOnly || /^HTTP\/1\.[01] (1\d\d|204|304)/.test(raw)) return true;
  const len = /\r\ncontent-length:\s*(\d+)/i.exec(raw.slice(0, end));
  return len === null ? /\r\ntransfer-encoding:\s*chunked/i.test(raw.slice(0, end)) && raw.endsWith('0\r\n\r\n') : raw.length - end - 4 >= Number(len[1]);
}

function parseAnswer(raw: string): RawAnswer {
  const statuses = [...raw.matchAll(/(?:^|\r\n)HTTP\/1\.[01] (\d{3})/g)].map((m) => Number(m[1]));
  const end = raw.indexOf('\r\n\r\n');
  if (end < 0) return { status: 0, statuses, headers: {}, text: '', raw };
  const [, ...lines] = raw.slice(0, end).split('\r\n');
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const i = line.indexOf(':');
    if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  let text = raw.slice(end + 4);
  if (headers['content-length'] !== undefined) text = text.slice(0, Number(headers['content-length']));
  return { status: statuses[0] ?? 0, statuses, headers, text: Buffer.from(text, 'latin1').toString('utf8'), raw };
}
