import { createHash } from 'node:crypto';

/**
 * The request fingerprint of DESIGN §3.4: sha256 over method, path with
 * query, content type and body, and the fence entity when there is one. The
 * body enters as its own sha256 (hex), which the rejection log needs anyway,
 * so a large body is hashed once, not twice; a collision of the fingerprint
 * would still need a sha256 collision. Fields are separated by NUL, which
 * none of them can contain (HTTP refuses it in a header value and URL
 * parsing encodes it in a path; an entity is printable ASCII), so two
 * different requests never share an encoding. A retry must repeat all of
 * them exactly to be replayed.
 *
 * The entity is in it because the store compares fingerprints only: without
 * it, the same key sent for another entity would be replayed that entity's
 * stored answer (another customer's charge). It is appended as a fifth field
 * only when present, so a request without an entity keeps the fingerprint it
 * had before; a record stored before the entity counted answers a retry that
 * carries one with 422 `idempotency-key-reused`, never a second execution.
 */
export function fingerprint(method: string, pathAndQuery: string, contentType: string, bodySha256: string, entity: string | null): string {
  const fields = `${method}\0${pathAndQuery}\0${contentType}\0${bodySha256}`;
  return createHash('sha256').update(entity === null ? fields : `${fields}\0${entity}`).digest('hex');
}

/** sha256 of the body alone, hex: what the rejection log keeps instead of the body. */
export function sha256Hex(body: Uint8Array): string {
  return createHash('sha256').update(body).digest('hex');
}
