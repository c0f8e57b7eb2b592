import { createHash } from 'node:crypto';

/**
 * The request fingerprint of DESIGN §3.4: sha256 over method, path with
 * query, content type and body. The body enters as its own sha256 (hex),
 * which the rejection log needs anyway, so a large body is hashed once, not
 * twice; a collision of the fingerprint would still need a sha256 collision.
 * Fields are separated by NUL, which none of them can contain, so two
 * different requests never share an encoding. A retry must repeat all four
 * exactly to be replayed.
 */
export function fingerprint(method: string, pathAndQuery: string, contentType: string, bodySha256: string): string {
  return createHash('sha256').update(`${method}\0${pathAndQuery}\0${contentType}\0${bodySha256}`).digest('hex');
}

/** sha256 of the body alone, hex: what the rejection log keeps instead of the body. */
export function sha256Hex(body: Uint8Array): string {
  return createHash('sha256').update(body).digest('hex');
}
