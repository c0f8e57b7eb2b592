/**
 * PostgreSQL `text` (and `jsonb` strings) cannot hold U+0000, but the store
 * interface can hand it one: the gateway's idempotency scope is
 * `route + "\u0000" + caller` once caller auth is on, and an entity taken from
 * a JSON body may contain "\u0000". SQLite and D1 keep such strings as they
 * are, so PostgreSQL must too, through the interface.
 *
 * The escape is injective and leaves every realistic string unchanged: only
 * strings containing U+0000 or the private-use escape character U+E000 are
 * rewritten (U+E000 → U+E000 U+E000, U+0000 → U+E000 "0"), and every read
 * decodes. Equality and prefix-free comparisons (all the store does with
 * these values) are preserved; ordering of such exotic strings is not.
 */
const ESC = '\uE000';

export function encodeText(value: string): string {
  if (!value.includes('\u0000') && !value.includes(ESC)) return value;
  return value.replace(/\uE000/g, ESC + ESC).replace(/\u0000/g, ESC + '0');
}

export function encodeNullable(value: string | null | undefined): string | null {
  return value === null || value === undefined ? null : encodeText(value);
}

export function decodeText(value: string): string {
  if (!value.includes(ESC)) return value;
  return value.replace(/\uE000([\uE0000])/g, (_, c: string) => (c === '0' ? '\u0000' : ESC));
}

export function decodeNullable(value: string | null | undefined): string | null {
  return value === null || value === undefined ? null : decodeText(value);
}

/** Quotes an SQL identifier (schema name). */
export function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}
