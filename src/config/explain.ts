import type { z } from 'zod';

/**
 * Turns zod's issues into lines an operator can act on, without changing the
 * schema (docs/configuration.md, at its top):
 *
 * - a key the schema does not know: `routes[0]: unknown key "timeoutMS" (did you mean "timeoutMs"?)`,
 *   the suggestion being the nearest key the schema has at that place;
 * - a union of objects told apart by one key (`store`, `entity`): `store: unknown kind "mysql"
 *   (expected one of "sqlite", "postgres", "d1")`, instead of zod's `Invalid input`;
 * - a field that is absent: `routes[0].upstream: required`, instead of the
 *   message meant for a wrong value (`must be an http:// URL`).
 *
 * Everything else keeps zod's message. The known keys are read from the
 * schema itself, so a field added to schema.ts is suggested without an edit here.
 */
export function explainIssues(issues: readonly z.core.$ZodIssue[], input: unknown, schema: z.ZodType): string[] {
  return issues.flatMap((issue) => {
    // A union of objects where the value's keys fit one option alone (no unknown key there): that option's own complaints, with their fields.
    const branch = issue.code === 'invalid_union' ? fittingBranch(issue, valueAt(input, issue.path as PropertyKey[]).value) : null;
    if (branch !== null) return explainIssues(branch.map((i) => ({ ...i, path: [...issue.path, ...i.path] })) as z.core.$ZodIssue[], input, schema);
    return [`${fieldPath(issue.path) || '(root)'}: ${explainIssue(issue, input, schema)}`];
  });
}

/** The one option of a failed union that knows every key of the object `value` (the others refuse one as unknown), or null. */
function fittingBranch(issue: z.core.$ZodIssueInvalidUnion, value: unknown): z.core.$ZodIssue[] | null {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return null;
  const fitting = issue.errors.filter((b) => b.length > 0 && !b.some((i) => i.code === 'unrecognized_keys' && i.path.length === 0));
  return fitting.length === 1 ? fitting[0]! : null;
}

function explainIssue(issue: z.core.$ZodIssue, input: unknown, schema: z.ZodType): string {
  const path = issue.path as PropertyKey[];
  if (issue.code === 'unrecognized_keys') return unknownKeys(issue.keys, knownKeys(schema, path));
  if (issue.code === 'invalid_type' && valueAt(input, path).present === false) return 'required';
  if (issue.code === 'invalid_union') return unionMessage(issue, valueAt(input, path).value, schema, path) ?? issue.message;
  return issue.message;
}

function unknownKeys(keys: readonly string[], known: string[]): string {
  return keys
    .map((k) => {
      const near = nearest(k, known);
      return `unknown key "${k}"${near === null ? '' : ` (did you mean "${near}"?)`}`;
    })
    .join('; ');
}

/**
 * A union whose every option is an object needing one key of its own (the
 * "kind"): say which kinds exist. Other unions (a string or a number, …) keep zod's text.
 */
function unionMessage(issue: z.core.$ZodIssueInvalidUnion, value: unknown, schema: z.ZodType, path: PropertyKey[]): string | null {
  if (issue.errors.length === 0) return null;
  const options = schemasAt(schema, path);
  const notObject = issue.errors.every((b) => b.length === 1 && b[0]!.code === 'invalid_type' && b[0]!.path.length === 0 && b[0]!.expected === 'object');
  if (notObject && options.every((o) => objectKeys(o).length > 0)) {
    // Each option's first key is its kind (`{ "sqlite": … }`, `{ "header": … }`).
    return `expected an object with one of ${options.map((o) => `"${objectKeys(o)[0]}"`).join(', ')}`;
  }
  const kinds: string[] = [];
  for (const branch of issue.errors) {
    const missing = branch.find(
      (i) => i.code === 'invalid_type' && i.path.length === 1 && typeof i.path[0] === 'string' && valueAt(value, i.path as PropertyKey[]).present === false,
    );
    if (missing === undefined) return null;
    kinds.push(String(missing.path[0]));
  }
  const list = kinds.map((k) => `"${k}"`).join(', ');
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return `expected an object with one of ${list}`;
  const given = Object.keys(value).filter((k) => !knownKeys(schema, path).includes(k));
  if (given.length === 0) return `needs one of ${list}`;
  return `unknown kind ${given.map((k) => `"${k}"`).join(', ')} (expected one of ${list})`;
}

/** The keys the schema accepts for the object at `path` (every option's, for a union). */
export function knownKeys(schema: z.ZodType, path: readonly PropertyKey[]): string[] {
  const out = new Set<string>();
  for (const s of schemasAt(schema, path)) for (const k of objectKeys(s)) out.add(k);
  return [...out];
}

type Def = {
  type: string;
  shape?: Record<string, z.ZodType>;
  element?: z.ZodType;
  options?: z.ZodType[];
  innerType?: z.ZodType;
  in?: z.ZodType;
  out?: z.ZodType;
  valueType?: z.ZodType;
};
const defOf = (s: z.ZodType): Def => (s as unknown as { _zod: { def: Def } })._zod.def;

/** The wrapped schema under defaults, optionals and pipes (`z.preprocess` is a pipe whose input is a transform). */
function unwrap(s: z.ZodType): z.ZodType[] {
  const def = defOf(s);
  if (def.innerType !== undefined && ['default', 'prefault', 'optional', 'nullable', 'readonly', 'catch', 'nonoptional'].includes(def.type))
    return unwrap(def.innerType);
  if (def.type === 'pipe') return unwrap(defOf(def.in!).type === 'transform' ? def.out! : def.in!);
  if (def.type === 'union') return def.options!.flatMap(unwrap);
  return [s];
}

function schemasAt(schema: z.ZodType, path: readonly PropertyKey[]): z.ZodType[] {
  let current = unwrap(schema);
  for (const seg of path) {
    const next: z.ZodType[] = [];
    for (const s of current) {
      const def = defOf(s);
      if (def.type === 'object' && typeof seg === 'string' && def.shape![seg] !== undefined) next.push(...unwrap(def.shape![seg]!));
      else if (def.type === 'array' && typeof seg === 'number') next.push(...unwrap(def.element!));
      else if (def.type === 'record') next.push(...unwrap(def.valueType!));
    }
    current = next;
  }
  return current;
}

function objectKeys(s: z.ZodType): string[] {
  const def = defOf(s);
  return def.type === 'object' ? Object.keys(def.shape!) : [];
}

/** The closest known key: same letters in another case, or a small edit distance. */
export function nearest(key: string, known: readonly string[]): string | null {
  let best: string | null = null;
  let bestDistance = Infinity;
  for (const k of known) {
    const d = k.toLowerCase() === key.toLowerCase() ? 0.5 : distance(key.toLowerCase(), k.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [k, d];
  }
  return bestDistance <= Math.max(2, Math.floor(key.length / 3)) ? best : null;
}

/** Levenshtein distance. */
function distance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length]!;
}

function valueAt(input: unknown, path: readonly PropertyKey[]): { present: boolean; value: unknown } {
  let v: unknown = input;
  for (const seg of path) {
    if (typeof v !== 'object' || v === null || !Object.hasOwn(v, seg)) return { present: false, value: undefined };
    v = (v as Record<PropertyKey, unknown>)[seg];
  }
  return { present: v !== undefined, value: v };
}

export function fieldPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else out += out ? `.${String(seg)}` : String(seg);
  }
  return out;
}
