/** JSON pointers (RFC 6901), shared by the routes' entity and key pointers and the dispatcher's tool entities. */

/** A JSON pointer's reference tokens, unescaped (RFC 6901). */
export function tokensOf(pointer: string): string[] {
  return pointer === ''
    ? []
    : pointer
        .slice(1)
        .split('/')
        .map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/**
 * What JSON.parse made of a document at the pointer's tokens, or undefined
 * when nothing is there. An array is entered only by an index (RFC 6901:
 * `0`, or digits without a leading zero): `/items/length` names no member,
 * never the array's length.
 */
export function valueAtPointer(doc: unknown, tokens: string[]): unknown {
  let node = doc;
  for (const t of tokens) {
    if (node === null || typeof node !== 'object') return undefined;
    if (Array.isArray(node) ? !ARRAY_INDEX.test(t) : !Object.hasOwn(node, t)) return undefined;
    node = (node as Record<string, unknown>)[t];
  }
  return node;
}
const ARRAY_INDEX = /^(0|[1-9][0-9]*)$/;
