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
 * stack) and without building the document.
 */

/** Where the repeat is: the pointer of the object (`""` for the root) and the repeated name. */
export interface DuplicateMember {
  object: string;
  name: string;
}

/**
 * The first repeated member name in an object on the path of `tokens` (the
 * unescaped reference tokens of the pointer), or null.
 *
 * @example
 * duplicateOnPointerPath('{"order":{"id":"a","id":"b"}}', ['order', 'id']) // { object: '/order', name: 'id' }
 */
export function duplicateOnPointerPath(text: string, tokens: string[]): DuplicateMember | null {
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

  for (let depth = 0; depth < tokens.length; depth++) {
    const token = tokens[depth]!;
    skipWhitespace();
    if (text[i] === '{') {
      i++;
      skipWhitespace();
      if (text[i] === '}') return null;
      const names = new Set<string>();
      let next = -1;
      for (;;) {
        skipWhitespace();
        const start = i;
        skipString();
        const name = JSON.parse(text.slice(start, i)) as string;
        // Compared case-folded: Go's encoding/json and ASP.NET Core match
        // member names without regard to case (the last one wins), so
        // `"customer"` and `"Customer"` are one member to them.
        const folded = name.toLowerCase();
        if (names.has(folded)) return { object: pointerOf(tokens.slice(0, depth)), name };
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
      if (next === -1) return null;
      i = next;
    } else if (text[i] === '[') {
      // JSON.parse's array has own properties "0", "1", …: only those name an element.
      if (!/^(0|[1-9][0-9]*)$/.test(token)) return null;
      const index = Number(token);
      i++;
      skipWhitespace();
      if (text[i] === ']') return null;
      for (let k = 0; k < index; k++) {
        skipValue();
        skipWhitespace();
        if (text[i] !== ',') return null;
        i++;
        skipWhitespace();
      }
    } else {
      return null;
    }
  }
  return null;
}

function pointerOf(tokens: string[]): string {
  return tokens.map((t) => `/${t.replace(/~/g, '~0').replace(/\//g, '~1')}`).join('');
}
