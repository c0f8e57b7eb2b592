import { REJECTION_REASONS } from '../store/types.js';

// The rejection log's reasons for `fencegate audit --reason` and its help.
export { REJECTION_REASONS };

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
