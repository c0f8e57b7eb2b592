import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { ROOT } from '../helpers/child.js';

// Every TypeScript/JavaScript block (```ts, ```typescript, ```js,
// ```javascript, ```mjs) in README.md and docs/*.md is type-checked here, all
// in one TypeScript program, against the built package the way a user's
// project sees it: `fencegate`, `fencegate/lease`, `fencegate/bullmq`, … are
// resolved through package.json `exports` (a package can import itself by
// name), so the types are dist/'s (`npm test` builds first). Other packages
// (zod, bullmq, ioredis, pg, …) resolve from node_modules as in a user's
// project. JS blocks are checked too (checkJs).
//
// A block is compiled as it stands, as its own ES module. The HTML comments
// directly above a block (blank lines between them allowed) may say:
//
//   <!-- snippet: continues -->
//       the block goes on from the previous TS/JS block of the same file
//       (blocks of other languages in between do not count): both are
//       compiled as one module, in order.
//   <!-- snippet: given
//   declare const pool: import('pg').Pool;
//   -->
//       the names the prose takes as given (a pool, the job being run, …):
//       TypeScript declarations, compiled too (in a module of their own, whose
//       names the block imports), so they must be right as well. A JS block
//       can take values only (`declare const`, `declare function`).
//   <!-- snippet: skip <reason> -->
//       the block is not compiled; the reason is required, and the test
//       reports every skipped block with it (there are none today).
//
// JSON blocks are not code, and most are wire examples; a json block that
// shows gateway configuration says so, and then goes through the gateway's
// own parser (parseConfig, as `fencegate serve` reads its file):
//
//   <!-- snippet: config -->        a config, or some of its top-level members
//                                   (a plain route is added when it has none)
//   <!-- snippet: config route -->  one entry of `routes`
//
// Anything else after `snippet:`, or a directive with no block right below
// it, fails the test, so a typo cannot skip a block silently. A failure names
// the markdown file, the line in it and the compiler's (or parser's) message.

const LANGS: Record<string, 'ts' | 'js' | 'mjs'> = { ts: 'ts', typescript: 'ts', js: 'js', javascript: 'js', mjs: 'mjs' };

interface Block {
  file: string; // relative to the repository
  line: number; // 1-based line of the first code line in the markdown file
  lang: 'ts' | 'js' | 'mjs' | 'json';
  code: string[];
  /** json blocks: checked only with a `config` directive. */
  config?: 'whole' | 'route';
  continues: boolean;
  given?: { line: number; code: string[] };
  skip?: string;
}

/** The TS/JS blocks of one markdown text, with their directives; problems with the directives themselves go to `problems`. */
function extractBlocks(file: string, text: string, problems: string[]): Block[] {
  const lines = text.split('\n');
  const blocks: Block[] = [];
  // The directives seen since the last non-comment, non-blank line.
  let pending: { continues: boolean; given?: Block['given']; skip?: string; config?: Block['config'] } = { continues: false };
  const anyPending = () => pending.continues || pending.given !== undefined || pending.skip !== undefined || pending.config !== undefined;
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!;
    const fence = /^(\s*)(`{3,}|~{3,})\s*([\w-]*)/.exec(raw);
    if (fence) {
      const [, indent, marker, info] = fence as unknown as [string, string, string, string];
      const body: string[] = [];
      let j = i + 1;
      const close = new RegExp(`^\\s*${marker[0] === '`' ? '`' : '~'}{${marker.length},}\\s*$`);
      for (; j < lines.length && !close.test(lines[j]!); j++) body.push(lines[j]!.startsWith(indent) ? lines[j]!.slice(indent.length) : lines[j]!);
      const lang = LANGS[info.toLowerCase()];
      if (lang && pending.config) problems.push(`${file}:${i + 1}: \`snippet: config\` above a \`${info}\` block (it is for json blocks)`);
      if (lang)
        blocks.push({
          file,
          line: i + 2,
          lang,
          code: body,
          continues: pending.continues,
          ...(pending.given ? { given: pending.given } : {}),
          ...(pending.skip !== undefined ? { skip: pending.skip } : {}),
        });
      else if (info.toLowerCase() === 'json' && pending.config && !pending.continues && !pending.given && pending.skip === undefined)
        blocks.push({ file, line: i + 2, lang: 'json', code: body, continues: false, config: pending.config });
      else if (anyPending()) problems.push(`${file}:${i + 1}: a snippet directive that does not apply to this \`${info || 'plain'}\` block`);
      pending = { continues: false };
      i = j;
      continue;
    }
    const directive = /^\s*<!--\s*snippet:\s*(.*)$/.exec(raw);
    if (directive) {
      // The comment may span lines (a `given` prelude): up to the line holding `-->`.
      const parts = [directive[1]!];
      let j = i;
      while (!parts[parts.length - 1]!.includes('-->') && j + 1 < lines.length) parts.push(lines[++j]!);
      const last = parts.length - 1;
      parts[last] = parts[last]!.slice(0, parts[last]!.indexOf('-->'));
      const head = parts[0]!.trim();
      if (head === 'continues' && parts.length === 1) pending.continues = true;
      else if (head === 'given') pending.given = { line: i + 2, code: parts.slice(1) };
      else if (head === 'config' && parts.length === 1) pending.config = 'whole';
      else if (head === 'config route' && parts.length === 1) pending.config = 'route';
      else if (/^skip\b/.test(head) && parts.length === 1) {
        const reason = head.slice(4).trim();
        if (!reason) problems.push(`${file}:${i + 1}: \`snippet: skip\` needs a reason`);
        pending.skip = reason || '(no reason)';
      } else problems.push(`${file}:${i + 1}: unknown snippet directive "${parts.join(' ').trim()}" (continues, given, skip <reason>, config, config route)`);
      i = j;
      continue;
    }
    if (raw.trim() !== '') {
      // A directive applies to the block right below it, not to one further on.
      if (anyPending()) problems.push(`${file}:${i + 1}: a snippet directive with no code block right below it`);
      pending = { continues: false };
    }
  }
  return blocks;
}

interface Piece {
  from: number; // first line of the piece in the generated file (0-based)
  count: number;
  file: string;
  mdLine: number; // markdown line of the piece's first line
}

interface CheckResult {
  compiled: number; // TS/JS blocks compiled
  configs: number; // json blocks checked as configuration
  skipped: string[]; // `<file>:<line>: <reason>`
  problems: string[];
}

// The smallest route, for a `config` block that shows top-level settings only
// (a config needs at least one route).
const PLAIN_ROUTE = { name: 'snippet', match: { path: '/snippet/*' }, upstream: 'http://127.0.0.1:9000' };

/** A `config` json block through the gateway's own parser: the problem, or undefined. */
function checkConfig(b: Block): string | undefined {
  let json: unknown;
  try {
    json = JSON.parse(b.code.join('\n'));
  } catch (err) {
    return `not valid JSON: ${(err as Error).message}`;
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) return 'a config block holds one JSON object';
  const config = b.config === 'route' ? { routes: [json] } : 'routes' in json ? json : { ...json, routes: [PLAIN_ROUTE] };
  try {
    parseConfig(config);
    return undefined;
  } catch (err) {
    return err instanceof ConfigError ? err.message.replace(/\n\s*/g, '; ') : String(err);
  }
}

/** Type-checks the TS/JS blocks of the given markdown texts in one program. */
function checkMarkdown(sources: { file: string; text: string }[]): CheckResult {
  const problems: string[] = [];
  const skipped: string[] = [];
  // Inside the repository, so that `fencegate` resolves to this package by name.
  const dir = mkdtempSync(join(ROOT, 'test', 'docs', '.snippets-'));
  try {
    const maps = new Map<string, Piece[]>();
    const roots: string[] = [];
    let compiled = 0;
    let configs = 0;
    let n = 0;
    for (const { file, text } of sources) {
      let current: { path: string; lines: string[]; pieces: Piece[] } | undefined;
      const flush = () => {
        if (!current) return;
        // `export {}`: a block with no import or export is a module all the same.
        writeFileSync(current.path, current.lines.join('\n') + '\nexport {};\n');
        maps.set(current.path, current.pieces);
        roots.push(current.path);
        current = undefined;
      };
      for (const b of extractBlocks(file, text, problems)) {
        if (b.lang === 'json') {
          configs++;
          const problem = checkConfig(b);
          if (problem) problems.push(`${file}:${b.line}: ${problem}`);
          continue;
        }
        if (b.skip !== undefined) {
          skipped.push(`${file}:${b.line}: ${b.skip}`);
          continue;
        }
        compiled++;
        if (b.continues && !current) problems.push(`${file}:${b.line}: \`snippet: continues\` but no TS/JS block before it in this file`);
        if (!(b.continues && current)) {
          flush();
          current = { path: join(dir, `${file.replace(/[^\w]+/g, '_')}_L${b.line}_${n++}.${b.lang}`), lines: [], pieces: [] };
        }
        if (b.given) {
          // The prelude's declarations, exported from a module of their own
          // and imported by the block under the same names (an import is
          // hoisted, so a continued block may bring its own).
          const givenPath = join(dir, `given_${n++}.ts`);
          const src = ts.createSourceFile(givenPath, b.given.code.join('\n'), ts.ScriptTarget.ES2022, true);
          const values: string[] = [];
          const types: string[] = [];
          const at: number[] = [];
          for (const s of src.statements) {
            if (ts.isImportDeclaration(s)) continue;
            at.push(s.getStart(src));
            if (ts.isVariableStatement(s)) for (const d of s.declarationList.declarations) values.push(d.name.getText(src));
            else if (ts.isInterfaceDeclaration(s) || ts.isTypeAliasDeclaration(s)) types.push(s.name.text);
            else if ((ts.isFunctionDeclaration(s) || ts.isClassDeclaration(s) || ts.isEnumDeclaration(s)) && s.name) values.push(s.name.text);
            else problems.push(`${file}:${b.given.line}: a \`given\` holds declarations only (declare const, function, type, interface)`);
          }
          let given = src.text;
          for (const pos of at.reverse()) given = `${given.slice(0, pos)}export ${given.slice(pos)}`;
          writeFileSync(givenPath, given + '\n');
          maps.set(givenPath, [{ from: 0, count: b.given.code.length, file, mdLine: b.given.line }]);
          roots.push(givenPath);
          if (b.lang !== 'ts' && types.length > 0)
            problems.push(`${file}:${b.given.line}: a JS block cannot import the types its \`given\` declares (${types.join(', ')})`);
          const names = [...values, ...(b.lang === 'ts' ? types.map((t) => `type ${t}`) : [])];
          current!.lines.push(`import { ${names.join(', ')} } from './${givenPath.slice(dir.length + 1, -3)}.js';`);
        }
        current!.pieces.push({ from: current!.lines.length, count: b.code.length, file, mdLine: b.line });
        current!.lines.push(...b.code);
      }
      flush();
    }

    const program = ts.createProgram(roots, {
      // The repository's own settings (tsconfig.json), which a careful user's
      // project has too; JS blocks are checked as well.
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      lib: ['lib.es2023.d.ts'],
      types: ['node'],
      strict: true,
      noUncheckedIndexedAccess: true,
      esModuleInterop: true,
      skipLibCheck: true,
      resolveJsonModule: true,
      allowJs: true,
      checkJs: true,
      noEmit: true,
    });
    const rootSet = new Set(roots);
    for (const d of ts.getPreEmitDiagnostics(program)) {
      const message = ts.flattenDiagnosticMessageText(d.messageText, '\n  ');
      if (!d.file || !rootSet.has(d.file.fileName)) {
        problems.push(`${d.file ? relative(ROOT, d.file.fileName) : '(program)'}: TS${d.code}: ${message}`);
        continue;
      }
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start ?? 0);
      const piece = maps.get(d.file.fileName)!.find((p) => line >= p.from && line < p.from + p.count);
      if (piece) problems.push(`${piece.file}:${piece.mdLine + line - piece.from}:${character + 1}: TS${d.code}: ${message}`);
      else problems.push(`${relative(ROOT, d.file.fileName)}:${line + 1}: TS${d.code}: ${message}`);
    }
    return { compiled, configs, skipped, problems };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function docs(): { file: string; text: string }[] {
  const files = [
    'README.md',
    ...readdirSync(join(ROOT, 'docs'))
      .filter((f) => f.endsWith('.md'))
      .sort()
      .map((f) => `docs/${f}`),
  ];
  return files.map((file) => ({ file, text: readFileSync(join(ROOT, file), 'utf8') }));
}

describe('code snippets in README.md and docs/*.md', () => {
  it('every TS/JS block type-checks against the built package', () => {
    // Without dist/ every `fencegate/*` import fails to resolve: say why once.
    expect(existsSync(join(ROOT, 'dist', 'index.d.ts')), 'dist/ is not built: run `npm run build` first (`npm test` does)').toBe(true);
    const r = checkMarkdown(docs());
    if (r.skipped.length > 0) console.log(`snippets not compiled (${r.skipped.length}):\n${r.skipped.join('\n')}`);
    expect(r.problems.join('\n')).toBe('');
    // The extractor found the blocks at all (a broken fence pattern would find none and pass).
    // 14: examples/worker.ts is shown once now (docs/lease.md), no longer in the README too.
    expect(r.compiled).toBeGreaterThanOrEqual(14);
    expect(r.configs).toBeGreaterThanOrEqual(7);
  }, 60_000);

  it('control: a broken block, a bad config, a directive typo, a stray directive and a skip without reason are each reported at their markdown line', () => {
    const md = [
      '# x', // 1
      '', // 2
      '<!-- snippet: given', // 3
      "declare const job: import('fencegate/bullmq').BullJobLike;", // 4
      '-->', // 5
      '```ts', // 6
      "import { fencedProcessor } from 'fencegate/bullmq';", // 7
      'void fencedProcessor;', // 8
      'const data: unknown = job.data;', // 9: BullJobLike has no `data`
      '```', // 10
      '', // 11
      '<!-- snippet: continues -->', // 12
      '```ts', // 13
      'const n: number = data;', // 14: unknown is not a number
      '```', // 15
      '<!-- snippet: contineus -->', // 16
      '```js', // 17
      'export const ok = 1;', // 18
      '```', // 19
      '<!-- snippet: skip -->', // 20
      '```ts', // 21
      'this is not TypeScript', // 22
      '```', // 23
      '<!-- snippet: config route -->', // 24
      '```json', // 25
      '{ "name": "p", "match": { "path": "/p/*" }, "upstream": "http://127.0.0.1:9000", "timeoutMS": 5 }', // 26: timeoutMs
      '```', // 27
      '<!-- snippet: config -->', // 28
      'a paragraph, so the directive is above no block', // 29
      '```json', // 30
      '{ "not": "checked" }', // 31
      '```', // 32
    ].join('\n');
    const r = checkMarkdown([{ file: 'control.md', text: md }]);
    expect(r.compiled).toBe(3);
    expect(r.skipped).toEqual(['control.md:22: (no reason)']);
    expect(r.configs).toBe(1);
    expect(r.problems).toHaveLength(6);
    expect(r.problems).toContainEqual(expect.stringMatching(/^control\.md:9:\d+: TS2339: Property 'data' does not exist on type 'BullJobLike'/));
    expect(r.problems).toContainEqual(expect.stringMatching(/^control\.md:14:\d+: TS2322: Type 'unknown' is not assignable to type 'number'/));
    expect(r.problems).toContainEqual(expect.stringMatching(/^control\.md:16: unknown snippet directive "contineus/));
    expect(r.problems).toContainEqual('control.md:20: `snippet: skip` needs a reason');
    expect(r.problems).toContainEqual(
      expect.stringMatching(/^control\.md:26: invalid configuration:; routes\[0\]: unknown key "timeoutMS" \(did you mean "timeoutMs"\?\)/),
    );
    expect(r.problems).toContainEqual('control.md:29: a snippet directive with no code block right below it');
  }, 60_000);
});
