// Module hooks that let plain Node (a heartbeat thread, a child process) run
// this repository's TypeScript sources in tests: `./x.js` resolves to `./x.ts`
// when only the latter exists (NodeNext import style), and `.ts` files are
// transpiled with the project's own `typescript` (no type check), cached on
// disk by content hash so that each new thread or process starts quickly.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { threadId } from 'node:worker_threads';

const CACHE = join(tmpdir(), 'fencegate-lease-ts-cache');
let ts;

export async function resolve(specifier, context, next) {
  // A thread's or process's entry point arrives as an absolute path.
  const local = specifier.startsWith('.') || specifier.startsWith('file:') || specifier.startsWith('/');
  if (specifier.endsWith('.js') && local) {
    const url = specifier.startsWith('/') ? pathToFileURL(specifier) : new URL(specifier, context.parentURL);
    if (url.protocol === 'file:' && !existsSync(fileURLToPath(url))) {
      const tsUrl = new URL(url.href.slice(0, -3) + '.ts');
      if (existsSync(fileURLToPath(tsUrl))) return { url: tsUrl.href, format: 'module', shortCircuit: true };
    }
  }
  return next(specifier, context);
}

export async function load(url, context, next) {
  if (!url.startsWith('file:') || !url.endsWith('.ts')) return next(url, context);
  const path = fileURLToPath(url);
  const source = readFileSync(path, 'utf8');
  const cached = join(CACHE, createHash('sha256').update(path).update('\0').update(source).digest('hex') + '.js');
  if (existsSync(cached)) return { format: 'module', source: readFileSync(cached, 'utf8'), shortCircuit: true };
  ts ??= (await import('typescript')).default;
  const out = ts.transpileModule(source, {
    fileName: path,
    compilerOptions: {
      module: ts.ModuleKind.ESNext,
      target: ts.ScriptTarget.ES2022,
      inlineSourceMap: true,
      inlineSources: true,
    },
  });
  mkdirSync(CACHE, { recursive: true });
  // Write, then rename: several processes may start at once, and none may
  // read a half-written file.
  const tmp = `${cached}.${process.pid}.${threadId}.tmp`;
  writeFileSync(tmp, out.outputText);
  renameSync(tmp, cached);
  return { format: 'module', source: out.outputText, shortCircuit: true };
}
