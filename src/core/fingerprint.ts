import { createHash } from 'node:crypto';

/**
 * The request fingerprint of DESIGN §3.4: sha256 over method, path with
 * query, content type and body. Fields are separated by NUL, which none of
 * the first three can contain, so two different requests never share an
 * encoding. A retry must repeat all four exactly to be replayed.
 */
export function fingerprint(method: string, pathAndQuery: string, contentType: string, body: Uint8Array): string {
  return createHash('sha256')
    .update(method)
    .update('\0')
    .update(pathAndQuery)
    .update('\0')
    .update(contentType)
    .update('\0')
    .update(body)
    .digest('hex');
}

/** sha256 of the body alone, hex: what the rejection log keeps instead of the body. */
export function sha256Hex(body: Uint8Array): string {
  return createHash('sha256').update(body).digest('hex');
}
