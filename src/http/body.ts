import type { HeaderReader, IncomingLike } from './inbound.js';

export type BodyResult = { ok: true; body: Uint8Array } | { ok: false; tooLarge: true } | { ok: false; aborted: true };

/**
 * Reads the request body, refusing (before reading) a declared length over
 * the limit and (while reading) any stream that passes it. The body must be
 * whole before admission: it is part of the fingerprint.
 *
 * On Node, `incoming` (the raw `IncomingMessage`) is read directly: the
 * WHATWG `Request` and its web stream cost about 5% of a proxied request's
 * CPU (profile of `npm run bench`), and nothing else reads the body. Other
 * runtimes (Workers) read `request.body`.
 */
export async function readBody(
  request: { headers: HeaderReader; body: ReadableStream<Uint8Array> | null },
  maxBytes: number,
  incoming?: IncomingLike,
): Promise<BodyResult> {
  const declared = request.headers.get('content-length');
  if (declared !== null && Number(declared) > maxBytes) return { ok: false, tooLarge: true };
  if (incoming !== undefined && !incoming.readableEnded) return readIncoming(incoming, maxBytes);
  if (request.body === null) return { ok: true, body: new Uint8Array(0) };
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    let next: Awaited<ReturnType<typeof reader.read>>;
    try {
      next = await reader.read();
    } catch {
      return { ok: false, aborted: true };
    }
    if (next.done) break;
    size += next.value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => {});
      return { ok: false, tooLarge: true };
    }
    chunks.push(next.value);
  }
  return { ok: true, body: concat(chunks, size) };
}

function readIncoming(incoming: IncomingLike, maxBytes: number): Promise<BodyResult> {
  return new Promise((resolve) => {
    const chunks: Uint8Array[] = [];
    let size = 0;
    const settle = (result: BodyResult) => {
      incoming.off('data', onData);
      incoming.off('end', onEnd);
      incoming.off('error', onAbort);
      incoming.off('close', onAbort);
      resolve(result);
    };
    const onData = (chunk: Uint8Array) => {
      size += chunk.byteLength;
      if (size > maxBytes) {
        // The server drains or closes the rest once the 413 is sent.
        incoming.pause();
        settle({ ok: false, tooLarge: true });
      } else {
        chunks.push(chunk);
      }
    };
    const onEnd = () => settle({ ok: true, body: concat(chunks, size) });
    // The client went away (or the server's request timeout fired) mid-body.
    const onAbort = () => settle({ ok: false, aborted: true });
    incoming.on('data', onData);
    incoming.on('end', onEnd);
    incoming.on('error', onAbort);
    incoming.on('close', onAbort);
  });
}

function concat(chunks: Uint8Array[], size: number): Uint8Array {
  if (chunks.length === 1) return chunks[0]!;
  const body = new Uint8Array(size);
  let offset = 0;
  for (const c of chunks) {
    body.set(c, offset);
    offset += c.byteLength;
  }
  return body;
}
