export type BodyResult = { ok: true; body: Uint8Array } | { ok: false; tooLarge: true };

/**
 * Reads the request body, refusing (before reading) a declared length over
 * the limit and (while reading) any stream that passes it. The body must be
 * whole before admission: it is part of the fingerprint.
 */
export async function readBody(request: Request, maxBytes: number): Promise<BodyResult> {
  const declared = request.headers.get('content-length');
  if (declared !== null && Number(declared) > maxBytes) return { ok: false, tooLarge: true };
  if (request.body === null) return { ok: true, body: new Uint8Array(0) };
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => {});
      return { ok: false, tooLarge: true };
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return { ok: true, body: chunks[0]! };
  const body = new Uint8Array(size);
  let offset = 0;
  for (const c of chunks) {
    body.set(c, offset);
    offset += c.byteLength;
  }
  return { ok: true, body };
}
