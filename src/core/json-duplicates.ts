/**
 * A duplicated member name on the way to a JSON-pointer entity (RFC 6901).
 *
 * RFC 8259 §4 leaves an object with a repeated name to the parser: JSON.parse
 * keeps the last value, many parsers (and some hand-written upstreams) keep
 * the first. The gateway reads the entity with JSON.parse and forwards the
 * body as it came, so in `{"customer":"A","customer":"B"}` it would fence B
 * while an upstream that keeps the first name acts on A. Only the objects
 * the pointer passes through matter; a repeat anywhere in one of them is
 * refused, since either copy could be the one an upstream reads.
 *
 * A scanner, not a parser: `text` must be JSON that JSON.parse accepted (the
 * caller parses first), so it only skips values and reads names. It walks
 * the text once, without recursion (a deeply nested body cannot exhaust the
 * stack) and without building the document. It also hands back the text of
 * the value a pointer names (`scanPointer`), so that a number can be read
 * from its lexeme rather than from the double JSON.parse made of it.
 */

/** Where the repeat is: the pointer of the object (`""` for the root) and the repeated name. */
export interface DuplicateMember {
  object: string;
  name: string;
}

/**
 * A member name as Go's encoding/json and .NET's System.Text.Json (with
 * case-insensitive binding) compare it: without regard to case, under
 * Unicode simple folding, so `ſ` (U+017F) is `s` and `K` (U+212A, Kelvin) is
 * `k` to them. Lower- then upper-casing puts every such orbit on one string;
 * it also joins a few names those parsers keep apart (`ß` and `ss`), which
 * only refuses more bodies, never fewer.
 */
export function foldName(name: string): string {
  return name.toLowerCase().toUpperCase();
}

/**
 * The first repeated member name in an object on the path of `tokens` (the
 * unescaped reference tokens of the pointer), or null.
 *
 * @example
 * duplicateOnPointerPath('{"order":{"id":"a","id":"b"}}', ['order', 'id']) // { object: '/order', name: 'id' }
 */
export function duplicateOnPointerPath(text: string, tokens: string[], fold: (name: string) => string = foldName): DuplicateMember | null {
  const found = scanPointer(text, tokens, fold);
  return 'duplicate' in found ? found.duplicate : null;
}

/** A plain decimal integer, no fraction, exponent or `-0`: read as written, it is one key (or tenant) to every parser. */
const PLAIN_INTEGER = /^(0|-?[1-9][0-9]*)$/;

/**
 * A key's (or a claim's) value from its JSON text as written: a string's
 * value, or a plain integer within ±(2^53−1) as its decimal text (`42` and
 * `"42"` are one key); null for anything else (`1.0`, `1e0`, `-0`, a larger
 * integer, a boolean, an object, an array, `null`), which no two parsers are
 * sure to read as the same key.
 */
export function keyTextOf(lexeme: string): string | null {
  if (lexeme.startsWith('"')) return JSON.parse(lexeme) as string;
  return PLAIN_INTEGER.test(lexeme) && Number.isSafeInteger(Number(lexeme)) ? lexeme : null;
}

/**
 * What `tokens` name in `text`: a repeated member on the way, the value's
 * text as written (`start`..`end`, a number's lexeme intact), or nothing.
 * `fold` is how names are compared (foldName; the negative controls of
 * test/gateway/interop-fold.test.ts pass a weaker one).
 */
export type PointerScan = { duplicate: DuplicateMember } | { start: number; end: number } | { absent: true };

export function scanPointer(text: string, tokens: string[], fold: (name: string) => string = foldName): PointerScan {
  let i = 0;
  const end = text.length;
  const skipWhitespace = () => {
    while (i < end && (text[i] === ' ' || text[i] === '\t' || text[i] === '\n' || text[i] === '\r')) i++;
  };
  const skipString = () => {
    i++; // the opening quote
    while (i < end && text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    i++; // the closing quote
  };
  const skipValue = () => {
    const first = text[i];
    if (first === '"') return skipString();
    if (first === '{' || first === '[') {
      let depth = 0;
      do {
        const c = text[i];
        if (c === '"') {
          skipString();
          continue;
        }
        if (c === '{' || c === '[') depth++;
        else if (c === '}' || c === ']') depth--;
        i++;
      } while (depth > 0 && i < end);
      return;
    }
    // A number, true, false or null.
    while (i < end && !',]} \t\n\r'.includes(text[i]!)) i++;
  };
  const absent = { absent: true } as const;

  for (let depth = 0; depth < tokens.length; depth++) {
    const token = tokens[depth]!;
    skipWhitespace();
    if (text[i] === '{') {
      i++;
      skipWhitespace();
      if (text[i] === '}') return absent;
      const names = new Set<string>();
      let next = -1;
      for (;;) {
        skipWhitespace();
        const start = i;
        skipString();
        const name = JSON.parse(text.slice(start, i)) as string;
        // Compared folded (foldName): to Go's encoding/json and ASP.NET Core
        // `"customer"`, `"Customer"` and `"cuſtomer"` are one member, and the
        // last one wins.
        const folded = fold(name);
        if (names.has(folded)) return { duplicate: { object: pointerOf(tokens.slice(0, depth)), name } };
        names.add(folded);
        skipWhitespace();
        i++; // ':'
        skipWhitespace();
        if (name === token) next = i;
        skipValue();
        skipWhitespace();
        if (text[i] !== ',') break; // '}'
        i++;
      }
      if (next === -1) return absent;
      i = next;
    } else if (text[i] === '[') {
      // JSON.parse's array has own properties "0", "1", …: only those name an element.
      if (!/^(0|[1-9][0-9]*)$/.test(token)) return absent;
      const index = Number(token);
      i++;
      skipWhitespace();
      if (text[i] === ']') return absent;
      for (let k = 0; k < index; k++) {
        skipValue();
        skipWhitespace();
        if (text[i] !== ',') return absent;
        i++;
        skipWhitespace();
      }
    } else {
      return absent;
    }
  }
  skipWhitespace();
  const start = i;
  skipValue();
  return { start, end: i };
}

function pointerOf(tokens: string[]): string {
  return tokens.map((t) => `/${t.replace(/~/g, '~0').replace(/\//g, '~1')}`).join('');
}
