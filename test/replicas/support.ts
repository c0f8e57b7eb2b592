/**
 * Small pieces shared by the replica suites: answers reduced to what the
 * assertions need, a Fisher–Yates shuffle, and a bounded wait.
 */

export interface Answer {
  status: number;
  /** The problem code (last segment of `type`), or null for a non-problem answer. */
  code: string | null;
  replayed: boolean;
  contentType: string | null;
  body: string;
}

export async function answerOf(res: Response): Promise<Answer> {
  const body = await res.text();
  const contentType = res.headers.get('content-type');
  let code: string | null = null;
  if (contentType === 'application/problem+json') code = String(JSON.parse(body).type).split('/').pop() ?? null;
  return { status: res.status, code, replayed: res.headers.get('idempotent-replayed') === 'true', contentType, body };
}

/** A transport failure (the gateway process died, the socket was cut) as an answer with status 0. */
export function transportFailure(err: unknown): Answer {
  return { status: 0, code: `transport: ${err instanceof Error ? err.message : String(err)}`, replayed: false, contentType: null, body: '' };
}

export function shuffled<T>(xs: readonly T[]): T[] {
  const a = [...xs];
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

/** Pairs (earlier, later) in `seq` where the later one is lower. */
export function decreasingPairs(seq: readonly number[]): [number, number][] {
  const out: [number, number][] = [];
  for (let i = 1; i < seq.length; i++) if (seq[i]! < seq[i - 1]!) out.push([seq[i - 1]!, seq[i]!]);
  return out;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
