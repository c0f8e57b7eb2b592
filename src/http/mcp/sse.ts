/**
 * Server-sent events (WHATWG HTML §9.2), split into whole events as the
 * bytes come, each with its exact text (to forward as it came) and its
 * `data` (the JSON-RPC message an MCP server puts there). Lines end in CRLF,
 * LF or CR; an empty line ends an event. Pure: no I/O; a whole event is
 * bounded by `limit` UTF-8 bytes, one under construction by `limit`
 * characters.
 */
export interface SseEvent {
  /** The event as received, its terminating empty line included. */
  raw: string;
  /** The `data` lines joined with "\n"; null when the event has none (a comment, a `retry:`). */
  data: string | null;
  /**
   * The event type: the last `event:` field's value, `message` when there is
   * none or it is empty (WHATWG HTML §9.2.6). An EventSource, and the MCP
   * SDK's client, hand only `message` events to the JSON-RPC layer; an
   * event of another type is no message of the session (./stream.ts).
   */
  type: string;
  /**
   * The event's own `id:` field (the last one, when it has several); null
   * when it has none. An id with a NUL is ignored, as an EventSource does.
   * What a client resumes from (`Last-Event-ID`, ./resume.ts).
   */
  id: string | null;
  /** The event's `retry:` field in milliseconds (ASCII digits only); null when it has none: the reconnection time the server asks for. */
  retry: number | null;
}

export class SseSplitter {
  private readonly decoder = new TextDecoder('utf-8');
  private buffer = '';
  /** Where the scan for the event's end resumes (all before it is whole lines of the current event). */
  private scanned = 0;
  private data: string[] = [];
  private type = '';
  private id: string | null = null;
  private retry: number | null = null;
  private ended = false;

  constructor(private readonly limit: number) {}

  /** The events completed by `chunk`; null once one event would pass the limit (nothing more should be read). */
  push(chunk: Uint8Array): SseEvent[] | null {
    this.buffer += this.decoder.decode(chunk, { stream: true });
    return this.drain();
  }

  /** At the end of the stream: an unterminated last event is dropped, as an EventSource does. */
  end(): SseEvent[] {
    this.buffer += this.decoder.decode();
    this.ended = true;
    return this.drain() ?? [];
  }

  private drain(): SseEvent[] | null {
    const out: SseEvent[] = [];
    for (;;) {
      const line = this.nextLine();
      if (line === null) break;
      if (line.text === '') {
        const raw = this.buffer.slice(0, line.end);
        // In UTF-8 bytes, as each event completes: a chunk may carry a whole
        // event larger than the limit, and the stored answer's bound is bytes.
        if (utf8Length(raw) > this.limit) return null;
        this.buffer = this.buffer.slice(line.end);
        this.scanned = 0;
        out.push({
          raw,
          data: this.data.length > 0 ? this.data.join('\n') : null,
          type: this.type === '' ? 'message' : this.type,
          id: this.id,
          retry: this.retry,
        });
        this.data = [];
        this.type = '';
        this.id = null;
        this.retry = null;
        continue;
      }
      this.scanned = line.end;
      const colon = line.text.indexOf(':');
      const field = colon === -1 ? line.text : line.text.slice(0, colon);
      if (field !== 'data' && field !== 'event' && field !== 'id' && field !== 'retry') continue;
      let value = colon === -1 ? '' : line.text.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'event') this.type = value;
      else if (field === 'data') this.data.push(value);
      else if (field === 'id') {
        if (!value.includes('\u0000')) this.id = value;
      } else if (/^[0-9]{1,9}$/.test(value)) this.retry = Number(value);
    }
    if (this.buffer.length > this.limit) return null;
    return out;
  }

  /** The next whole line from `scanned`, or null; a CR at the very end waits (an LF may follow it). */
  private nextLine(): { text: string; end: number } | null {
    const b = this.buffer;
    for (let i = this.scanned; i < b.length; i++) {
      const c = b.charCodeAt(i);
      if (c === 10) return { text: b.slice(this.scanned, i), end: i + 1 };
      if (c === 13) {
        if (i + 1 === b.length && !this.ended) return null;
        return { text: b.slice(this.scanned, i), end: b.charCodeAt(i + 1) === 10 ? i + 2 : i + 1 };
      }
    }
    return null;
  }
}

/** The UTF-8 length of `text` (a lone surrogate counts 3, as TextEncoder writes U+FFFD). */
function utf8Length(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c < 0xdc00 && i + 1 < text.length && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}
