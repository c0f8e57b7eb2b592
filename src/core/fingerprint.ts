import * as nodeCrypto from 'node:crypto';
import { foldName } from './json-duplicates.js';

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
 *
 * The hash of the credentials the upstream sees (`credentials`, with the
 * route's `credentialBinding: "fingerprint"`, DESIGN §2 G2) is in it for the
 * same reason: a record is bound to the credentials that made it, so another
 * caller's request under the key (other credentials, or none) is 422, never
 * that caller's answer. With credentials the encoding always has six fields:
 * the entity slot (empty when there is none) and then `cred:<hash>`. It
 * cannot equal a 4- or 5-field encoding: no field holds a NUL, so the number
 * of NULs (3, 4, 5) tells the forms apart, and an entity that reads
 * `cred:…` is the fifth field of a 5-field form, never a sixth. Within the
 * 6-field form the empty slot means no entity (an entity is 1–512
 * printable characters, ../protocol/headers.ts parseEntity), and the hash
 * is hex. Without credentials nothing is appended, so those requests keep
 * the fingerprint they had and existing records keep replaying; a record
 * stored before credentials counted answers a retry that carries them with
 * 422, as for the entity. The credential hash is an HMAC
 * under `credentialHashKey` (../http/key-scope.ts), and this digest adds
 * only public parts to it (method, path, body digest, entity), so a reader
 * of the table who lacks that key can no more test a guessed credential
 * against the fingerprint than against the hash; without the key (the
 * `credential-hash-unkeyed` warning) the hash is recomputable from a guess,
 * and so is this digest from a guess and the request's public parts.
 */
export function fingerprint(
  method: string,
  pathAndQuery: string,
  contentType: string,
  bodySha256: string,
  entity: string | null,
  credentials: string | null = null,
): string {
  const fields = `${method}\0${pathAndQuery}\0${contentType}\0${bodySha256}`;
  if (credentials !== null) return sha256Hex(`${fields}\0${entity ?? ''}\0cred:${credentials}`);
  return sha256Hex(entity === null ? fields : `${fields}\0${entity}`);
}

/**
 * Node's one-shot digest (`crypto.hash`, Node 20.12 and later): the same
 * bytes as createHash(...).update(...).digest('hex') without a Hash object
 * per call, about half the cost for a request's small inputs, and two run
 * per request (the body, the fingerprint). Where the runtime lacks it
 * (Workers' node:crypto), the Hash object.
 */
const oneShot = (nodeCrypto as { hash?: (algorithm: string, data: string | Uint8Array, encoding: 'hex') => string }).hash;

/** sha256 of the body alone (or of any text), hex: what the rejection log keeps instead of the body. */
export function sha256Hex(data: Uint8Array | string): string {
  return oneShot !== undefined ? oneShot('sha256', data, 'hex') : nodeCrypto.createHash('sha256').update(data).digest('hex');
}

/** What of the body a route's fingerprint covers (the route's `fingerprint` option). */
export type BodyFingerprint = 'raw' | { json: string[] } | { ignore: string[] };

/**
 * The body's part of the fingerprint. `raw`: its sha256, as always. With
 * JSON options, a digest of its canonical JSON (members sorted, strings
 * decoded, whitespace gone), of only the `json` pointers' values or of all
 * but the `ignore` ones, so that a retry whose body differs only there (a
 * regenerated timestamp) is the same command. Two commands that differ only
 * in what is left out share one key's stored answer: that is the point, and
 * the risk (docs/configuration.md, the route field `fingerprint`).
 *
 * A body this cannot read the same way as any upstream is fingerprinted raw,
 * which is the strict choice (any byte changed is another command, 422 on
 * reuse), never a looser one: a Content-Type other than `application/json`
 * or `…+json` (an upstream reading form data or text does not read JSON
 * members; `contentType` undefined means the caller knows the body is JSON),
 * a byte order mark (some parsers refuse it, some skip it), not UTF-8 JSON, a
 * repeated member name anywhere, compared case-folded as Go and .NET compare
 * them (./json-duplicates.ts foldName; JSON.parse keeps the last copy, other
 * parsers the first, so two bodies with one canonical form could mean two
 * commands), nesting deeper than MAX_DEPTH, or, with `json`, a member on a
 * pointer's way that folds to its token without being it (`"Amount"` for
 * `/amount`: absent here, the amount to a case-insensitive binder). Numbers
 * keep their text: JSON.parse would read 10000000000000001 and
 * 10000000000000000 as one double, an upstream with exact decimals as two
 * amounts; `1.0` and `1` then differ too (strict again). The JSON digest is
 * marked `json:` so it never equals a raw body's digest.
 */
export function bodyDigest(mode: BodyFingerprint, body: Uint8Array, rawSha256: string, contentType?: string): string {
  if (mode === 'raw' || body.byteLength === 0) return rawSha256;
  if (contentType !== undefined && (!isJsonMediaType(contentType) || (body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf))) return rawSha256;
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    JSON.parse(text);
  } catch {
    return rawSha256;
  }
  const doc = readJson(text);
  if (doc === null) return rawSha256;
  let canonical: string;
  if ('json' in mode) {
    const picked = mode.json.map((p) => at(doc, p));
    if (picked.includes(FOLDED)) return rawSha256;
    canonical = `[${mode.json.map((p, k) => `${JSON.stringify(p)},${canon(picked[k] as Json | undefined)}`).join(',')}]`;
  } else {
    canonical = canon(without(doc, mode.ignore));
  }
  return `json:${sha256Hex(canonical)}`;
}

/**
 * `application/json` or a structured `…+json` type (RFC 6839), with no
 * charset but UTF-8 (RFC 8259 §8.1: JSON exchanged between systems is UTF-8).
 */
export function isJsonMediaType(contentType: string): boolean {
  const [type, ...params] = contentType.toLowerCase().split(';');
  const media = type!.trim();
  if (media !== 'application/json' && !/^application\/[a-z0-9!#$&^_.+-]+\+json$/.test(media)) return false;
  return params.every((p) => {
    const [name, value] = p.split('=').map((x) => x.trim());
    return name !== 'charset' || value === 'utf-8' || value === '"utf-8"';
  });
}

type Json = { o: Map<string, Json> } | { a: Json[] } | { s: string } | { lit: string };
/** Absent (a pointer that names nothing, or a left-out array element): `?` is not JSON, so no value canonicalises to it. */
const ABSENT = '?';
const MAX_DEPTH = 128;

function canon(node: Json | undefined): string {
  if (node === undefined) return ABSENT;
  if ('s' in node) return JSON.stringify(node.s);
  if ('lit' in node) return node.lit;
  if ('a' in node) return `[${node.a.map(canon).join(',')}]`;
  const names = [...node.o.keys()].sort();
  return `{${names.map((n) => `${JSON.stringify(n)}:${canon(node.o.get(n))}`).join(',')}}`;
}

function tokensOf(pointer: string): string[] {
  return pointer
    .slice(1)
    .split('/')
    .map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/** A member that folds to a pointer token without being it: what a case-insensitive binder would read there. */
const FOLDED = Symbol('folded');

function child(node: Json, token: string): Json | undefined | typeof FOLDED {
  if ('o' in node) {
    const exact = node.o.get(token);
    if (exact !== undefined) return exact;
    const folded = foldName(token);
    for (const name of node.o.keys()) if (foldName(name) === folded) return FOLDED;
    return undefined;
  }
  if ('a' in node && /^(0|[1-9][0-9]*)$/.test(token)) return node.a[Number(token)];
  return undefined;
}

function at(doc: Json, pointer: string): Json | undefined | typeof FOLDED {
  let node: Json | undefined | typeof FOLDED = doc;
  for (const t of tokensOf(pointer)) {
    if (node === undefined || node === FOLDED) return node;
    node = child(node, t);
  }
  return node;
}

/** A copy of `doc` without what the pointers name; a left-out array element keeps its place, as ABSENT. */
function without(doc: Json, pointers: string[]): Json | undefined {
  const drop = pointers.map(tokensOf);
  const walk = (node: Json, path: string[]): Json | undefined => {
    if (drop.some((d) => d.length === path.length && d.every((t, i) => t === path[i]))) return undefined;
    if ('o' in node) {
      const o = new Map<string, Json>();
      for (const [n, v] of node.o) {
        const kept = walk(v, [...path, n]);
        if (kept !== undefined) o.set(n, kept);
      }
      return { o };
    }
    if ('a' in node) return { a: node.a.map((v, i) => walk(v, [...path, String(i)]) ?? { lit: ABSENT }) };
    return node;
  };
  return walk(doc, []);
}

/**
 * `text` (which JSON.parse accepted) as a tree that keeps number lexemes, or
 * null when an object repeats a member name (compared folded, as Go's
 * encoding/json and ASP.NET Core match names: foldName) or nesting passes
 * MAX_DEPTH.
 */
function readJson(text: string): Json | null {
  let i = 0;
  const ws = () => {
    while (text[i] === ' ' || text[i] === '\t' || text[i] === '\n' || text[i] === '\r') i++;
  };
  const str = (): string => {
    const start = i++;
    while (text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  const value = (depth: number): Json | null => {
    if (depth > MAX_DEPTH) return null;
    ws();
    const c = text[i];
    if (c === '"') return { s: str() };
    if (c === '{' || c === '[') {
      i++;
      ws();
      const close = c === '{' ? '}' : ']';
      const o = new Map<string, Json>();
      const a: Json[] = [];
      const folded = new Set<string>();
      while (text[i] !== close) {
        let name = '';
        if (c === '{') {
          ws();
          name = str();
          if (folded.has(foldName(name))) return null;
          folded.add(foldName(name));
          ws();
          i++; // ':'
        }
        const v = value(depth + 1);
        if (v === null) return null;
        if (c === '{') o.set(name, v);
        else a.push(v);
        ws();
        if (text[i] === ',') i++;
        ws();
      }
      i++;
      return c === '{' ? { o } : { a };
    }
    const start = i;
    while (i < text.length && !',]} \t\n\r'.includes(text[i]!)) i++;
    return { lit: text.slice(start, i) };
  };
  return value(0);
}
