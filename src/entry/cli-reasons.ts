import type { RejectionReason } from '../store/types.js';

// Every reason of the rejection log, for `fencegate audit --reason` and its
// help. A Record, so that a reason added to store/types.ts fails to compile
// here until the CLI knows it too.
const REASONS: Record<RejectionReason, true> = {
  'stale-fence': true,
  'idempotency-key-reused': true,
  'outcome-unknown': true,
  'invalid-fence-signature': true,
  'fence-expired': true,
  unauthorized: true,
  forbidden: true,
  'late-finish': true,
  'invalid-fence': true,
  'missing-fence': true,
  'invalid-entity': true,
  'missing-entity': true,
  'invalid-idempotency-key': true,
  'missing-idempotency-key': true,
  'tool-denied': true,
};

export const REJECTION_REASONS = Object.keys(REASONS) as RejectionReason[];

/** The reasons as help text lines, each at most `width` characters after `indent`. */
export function reasonLines(indent: string, width = 58): string {
  const lines: string[] = [];
  let line = '';
  for (const r of REJECTION_REASONS) {
    const next = line === '' ? r : `${line}, ${r}`;
    if (next.length > width) {
      lines.push(`${line},`);
      line = r;
    } else line = next;
  }
  lines.push(line);
  return lines.join(`\n${indent}`);
}
