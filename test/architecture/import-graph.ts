// The import graph of src/ and the checks the layering test holds it to.
// Parsing goes through the TypeScript compiler (not regexes) so an import
// written in a comment or a string is never read as an edge, and so
// `import type` / `import { type A }` can be told from imports that survive
// compilation: tsc erases type-only imports, so they are no runtime edge.
import { readdirSync, readFileSync } from 'node:fs';
import { join, posix, relative, sep } from 'node:path';
import ts from 'typescript';

export interface ImportEdge {
  /** Importing file, relative to the root with `/` separators (`src/lease/index.ts`). */
  from: string;
  /** Imported file, same form; a package specifier as written (`pg`, `node:fs`). */
  to: string;
  specifier: string;
  /** True when tsc erases the import (every binding a type, or an `import type`). */
  typeOnly: boolean;
  /** True when `to` is a file of the graph (a relative specifier that resolved). */
  local: boolean;
}

export interface ImportGraph {
  files: string[];
  /** One edge per (from, to): runtime when any import of `to` in `from` is runtime. */
  edges: ImportEdge[];
  /** Relative specifiers that name no file of the graph. */
  unresolved: { from: string; specifier: string }[];
}

interface RawImport {
  specifier: string;
  typeOnly: boolean;
}

/** The imports of one source text, as written. */
export function importsOf(fileName: string, text: string): RawImport[] {
  const source = ts.createSourceFile(fileName, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const found: RawImport[] = [];
  const literal = (node: ts.Node | undefined): string | undefined => (node !== undefined && ts.isStringLiteralLike(node) ? node.text : undefined);

  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node)) {
      const specifier = literal(node.moduleSpecifier);
      if (specifier !== undefined) found.push({ specifier, typeOnly: importIsTypeOnly(node.importClause) });
    } else if (ts.isExportDeclaration(node)) {
      const specifier = literal(node.moduleSpecifier);
      if (specifier !== undefined) found.push({ specifier, typeOnly: exportIsTypeOnly(node) });
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      const specifier = literal(node.moduleReference.expression);
      if (specifier !== undefined) found.push({ specifier, typeOnly: node.isTypeOnly });
    } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      // import('…') with a literal: a runtime edge, loaded later but loaded.
      const specifier = literal(node.arguments[0]);
      if (specifier !== undefined) found.push({ specifier, typeOnly: false });
    } else if (ts.isImportTypeNode(node)) {
      // `import('…').T` in a type position: erased, but still a dependency on that module's types.
      const argument = node.argument;
      const specifier = ts.isLiteralTypeNode(argument) ? literal(argument.literal) : undefined;
      if (specifier !== undefined) found.push({ specifier, typeOnly: true });
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

function importIsTypeOnly(clause: ts.ImportClause | undefined): boolean {
  if (clause === undefined) return false; // import '…' runs the module
  if (clause.isTypeOnly) return true;
  if (clause.name !== undefined) return false; // a default binding is a value
  const bindings = clause.namedBindings;
  if (bindings === undefined || ts.isNamespaceImport(bindings)) return false;
  // `import { type A, type B }`: erased only when every binding is a type.
  return bindings.elements.length > 0 && bindings.elements.every((element) => element.isTypeOnly);
}

function exportIsTypeOnly(node: ts.ExportDeclaration): boolean {
  if (node.isTypeOnly) return true;
  const clause = node.exportClause;
  if (clause === undefined || !ts.isNamedExports(clause)) return false; // export * (as ns) from
  return clause.elements.length > 0 && clause.elements.every((element) => element.isTypeOnly);
}

/** Resolves a relative specifier the way NodeNext does for these sources: `.js` names the `.ts` file. */
function resolve(from: string, specifier: string, files: Set<string>): string | undefined {
  const base = posix.normalize(posix.join(posix.dirname(from), specifier));
  const candidates = [base, base.replace(/\.js$/, '.ts'), base.replace(/\.mjs$/, '.mts'), base.replace(/\.cjs$/, '.cts'), `${base}.ts`, `${base}/index.ts`];
  return candidates.find((candidate) => files.has(candidate));
}

/** Builds the graph from source texts keyed by path (relative, `/` separators). */
export function graphFromSources(sources: ReadonlyMap<string, string>): ImportGraph {
  const files = [...sources.keys()].sort();
  const known = new Set(files);
  const byPair = new Map<string, ImportEdge>();
  const unresolved: ImportGraph['unresolved'] = [];
  for (const from of files) {
    for (const { specifier, typeOnly } of importsOf(from, sources.get(from) ?? '')) {
      const relativeSpecifier = specifier.startsWith('./') || specifier.startsWith('../');
      const target = relativeSpecifier ? resolve(from, specifier, known) : specifier;
      if (target === undefined) {
        unresolved.push({ from, specifier });
        continue;
      }
      const key = `${from}\0${target}`;
      const existing = byPair.get(key);
      if (existing === undefined) {
        byPair.set(key, { from, to: target, specifier, typeOnly, local: relativeSpecifier });
      } else if (!typeOnly) {
        existing.typeOnly = false;
      }
    }
  }
  return { files, edges: [...byPair.values()], unresolved };
}

/** Reads every `.ts` file under `root/dir` (declaration files excluded). */
export function readSources(root: string, dir = 'src'): Map<string, string> {
  const sources = new Map<string, string>();
  const walk = (absolute: string): void => {
    for (const entry of readdirSync(absolute, { withFileTypes: true })) {
      const path = join(absolute, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.isFile() && /\.(c|m)?ts$/.test(entry.name) && !/\.d\.(c|m)?ts$/.test(entry.name)) {
        sources.set(relative(root, path).split(sep).join('/'), readFileSync(path, 'utf8'));
      }
    }
  };
  walk(join(root, dir));
  return sources;
}

export function under(file: string, folder: string): boolean {
  return file.startsWith(folder.endsWith('/') ? folder : `${folder}/`);
}

export interface LayerRule {
  /** Folders whose files the rule constrains. */
  from: string[];
  /** Local files they may not import (checked only when `allowed` is absent). */
  forbidden?: string[];
  /** When set, the only folders whose local files they may import. */
  allowed?: string[];
  /** Type-only imports count too: the rule is about what a module may know, not just what it loads. */
  includeTypeOnly: boolean;
}

/** Local edges that break the rule, sorted. */
export function layerViolations(graph: ImportGraph, rule: LayerRule): ImportEdge[] {
  return graph.edges
    .filter((edge) => edge.local && (rule.includeTypeOnly || !edge.typeOnly))
    .filter((edge) => rule.from.some((folder) => under(edge.from, folder)))
    .filter((edge) =>
      rule.allowed !== undefined ? !rule.allowed.some((folder) => under(edge.to, folder)) : (rule.forbidden ?? []).some((folder) => under(edge.to, folder)),
    )
    .sort((a, b) => (a.from + a.to).localeCompare(b.from + b.to));
}

function adjacency(graph: ImportGraph, includeTypeOnly: boolean): Map<string, string[]> {
  const next = new Map<string, string[]>(graph.files.map((file) => [file, []]));
  for (const edge of graph.edges) {
    if (edge.local && (includeTypeOnly || !edge.typeOnly)) next.get(edge.from)?.push(edge.to);
  }
  for (const targets of next.values()) targets.sort();
  return next;
}

/**
 * Runtime cycles: Tarjan's strongly connected components over runtime edges,
 * each component with more than one file (or a file importing itself)
 * reported as one cycle through it, listed from its smallest file.
 */
export function runtimeCycles(graph: ImportGraph): string[][] {
  return importCycles(graph, { includeTypeOnly: false });
}

/** The same over every edge, type-only ones too when `includeTypeOnly`. */
export function importCycles(graph: ImportGraph, options: { includeTypeOnly: boolean }): string[][] {
  const next = adjacency(graph, options.includeTypeOnly);
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const components: string[][] = [];
  let counter = 0;

  // Iterative, so a deep import chain cannot overflow the call stack.
  for (const root of graph.files) {
    if (index.has(root)) continue;
    const work: { node: string; child: number }[] = [{ node: root, child: 0 }];
    index.set(root, counter);
    low.set(root, counter);
    counter += 1;
    stack.push(root);
    onStack.add(root);
    while (work.length > 0) {
      const frame = work[work.length - 1]!;
      const targets = next.get(frame.node) ?? [];
      if (frame.child < targets.length) {
        const target = targets[frame.child]!;
        frame.child += 1;
        if (!index.has(target)) {
          index.set(target, counter);
          low.set(target, counter);
          counter += 1;
          stack.push(target);
          onStack.add(target);
          work.push({ node: target, child: 0 });
        } else if (onStack.has(target)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(target)!));
        }
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent !== undefined) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!));
      if (low.get(frame.node) === index.get(frame.node)) {
        const component: string[] = [];
        let member: string;
        do {
          member = stack.pop()!;
          onStack.delete(member);
          component.push(member);
        } while (member !== frame.node);
        const selfLoop = component.length === 1 && (next.get(member) ?? []).includes(member);
        if (component.length > 1 || selfLoop) components.push(component.sort());
      }
    }
  }
  return components.map((component) => cycleThrough(component, next)).sort((a, b) => a[0]!.localeCompare(b[0]!));
}

/** A shortest cycle from the component's first file back to itself, staying inside the component. */
function cycleThrough(component: string[], next: Map<string, string[]>): string[] {
  const inside = new Set(component);
  const start = component[0]!;
  const previous = new Map<string, string>();
  const queue = [start];
  for (let i = 0; i < queue.length; i += 1) {
    const node = queue[i]!;
    for (const target of next.get(node) ?? []) {
      if (!inside.has(target)) continue;
      if (target === start) {
        const path = [node];
        while (path[0] !== start) path.unshift(previous.get(path[0]!)!);
        const rest = component.filter((file) => !path.includes(file));
        // The other members of a larger component are named too, so none is hidden.
        return rest.length === 0 ? [...path, start] : [...path, start, `(same component: ${rest.join(', ')})`];
      }
      if (!previous.has(target) && target !== start) {
        previous.set(target, node);
        queue.push(target);
      }
    }
  }
  return component;
}

/** Every local file `entry` loads at run time, itself included, sorted. */
export function runtimeClosure(graph: ImportGraph, entry: string): string[] {
  const next = adjacency(graph, false);
  const seen = new Set([entry]);
  const queue = [entry];
  for (let i = 0; i < queue.length; i += 1) {
    for (const target of next.get(queue[i]!) ?? []) {
      if (!seen.has(target)) {
        seen.add(target);
        queue.push(target);
      }
    }
  }
  return [...seen].sort();
}

export function formatEdges(edges: ImportEdge[]): string {
  return edges.map((edge) => `  ${edge.from} → ${edge.to}${edge.typeOnly ? ' (type-only)' : ''}`).join('\n');
}

export function formatCycles(cycles: string[][]): string {
  return cycles.map((cycle) => `  ${cycle.join(' → ')}`).join('\n');
}
