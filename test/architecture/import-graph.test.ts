// Layering of src/, held by the import graph: `fencegate/lease` and the queue
// adapters run inside workers and must not carry gateway code; the wire
// protocol and the pure core sit below everything, and the plumbing both
// sides share (src/db, src/observe) below both; and no runtime import cycle,
// whose evaluation order would hand a module an uninitialised binding.
// An `import('…')` with a literal counts as a runtime edge: when it runs it
// loads that file. Reads src/ and nothing else.
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  formatCycles,
  formatEdges,
  graphFromSources,
  importCycles,
  layerViolations,
  readSources,
  runtimeClosure,
  runtimeCycles,
  under,
  type LayerRule,
} from './import-graph.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const graph = graphFromSources(readSources(root, 'src'));

const gateway = ['src/http', 'src/config', 'src/store', 'src/entry'];

const workerSide: LayerRule = { from: ['src/lease', 'src/queue'], forbidden: gateway, includeTypeOnly: true };
const core: LayerRule = { from: ['src/core'], allowed: ['src/core'], includeTypeOnly: true };
const protocol: LayerRule = { from: ['src/protocol'], allowed: ['src/core', 'src/protocol'], includeTypeOnly: true };
// The plumbing both sides share (database openers and migrators, the tracing
// loader) stays below both: importing the lease module or the gateway from
// there would bring back the edges the rules above forbid.
const shared: LayerRule = {
  from: ['src/db', 'src/observe'],
  allowed: ['src/core', 'src/protocol', 'src/db', 'src/observe'],
  includeTypeOnly: true,
};
// Folders where even a type-only cycle is refused: two modules that import
// each other's types are one module split in two, and the next value
// imported along that edge makes it a runtime cycle.
const acyclic = ['src/core', 'src/protocol', 'src/db', 'src/observe', 'src/lease', 'src/queue', 'src/store', 'src/config', 'src/http', 'src/entry'];

const leaseEntry = 'src/lease/index.ts';
const leaseClosure = runtimeClosure(graph, leaseEntry);

describe('import graph of src/', () => {
  it(`reads the sources and resolves every relative import (${graph.files.length} files)`, () => {
    expect(graph.files).toContain(leaseEntry);
    const lines = graph.unresolved.map(({ from, specifier }) => `  ${from}: '${specifier}'`).join('\n');
    expect(graph.unresolved, `relative imports that name no file under src/:\n${lines}`).toEqual([]);
  });

  it('src/lease and src/queue import nothing from src/http, src/config, src/store, src/entry (type-only included)', () => {
    const found = layerViolations(graph, workerSide);
    expect(found, `worker-side modules importing gateway code:\n${formatEdges(found)}`).toEqual([]);
  });

  it('src/core imports only src/core; src/protocol imports only src/core and src/protocol (type-only included)', () => {
    const found = [...layerViolations(graph, core), ...layerViolations(graph, protocol)];
    expect(found, `imports that reach above the core/protocol layer:\n${formatEdges(found)}`).toEqual([]);
  });

  it('src/db and src/observe import only src/core, src/protocol, src/db and src/observe (type-only included)', () => {
    const found = layerViolations(graph, shared);
    expect(found, `shared plumbing importing a layer above it:\n${formatEdges(found)}`).toEqual([]);
  });

  it('has no runtime import cycle (type-only imports are erased and do not count)', () => {
    const cycles = runtimeCycles(graph);
    expect(cycles, `runtime import cycles:\n${formatCycles(cycles)}`).toEqual([]);
  });

  it(`has no import cycle, type-only included, through ${acyclic.join(', ')}`, () => {
    const cycles = importCycles(graph, { includeTypeOnly: true }).filter((cycle) => cycle.some((file) => acyclic.some((folder) => under(file, folder))));
    expect(cycles, `import cycles (give the types they share a file of their own):\n${formatCycles(cycles)}`).toEqual([]);
  });

  it(`${leaseEntry} loads ${leaseClosure.length} files at run time, none of them gateway code`, () => {
    console.info(`runtime closure of ${leaseEntry}: ${leaseClosure.length} files`);
    const gatewayFiles = leaseClosure.filter((file) => gateway.some((folder) => under(file, folder)));
    expect(gatewayFiles, `gateway files in the runtime closure of ${leaseEntry}:\n  ${gatewayFiles.join('\n  ')}`).toEqual([]);
  });
});

// Negative control (CONTRIBUTING.md convention 7): the same checker, on a
// graph that has each violation, must report each one, and must not report
// what is allowed.
describe('import graph checker, negative control', () => {
  const sources = new Map<string, string>([
    // lease → http, runtime
    ['src/lease/worker.ts', `import { startRequestSpan } from '../http/tracing.js';\nexport const w = startRequestSpan;\n`],
    [
      'src/http/tracing.ts',
      // An import in a comment or a string is no edge.
      `// import { x } from '../lease/worker.js';\nexport const s = "import '../lease/worker.js'";\nexport const startRequestSpan = () => s;\n`,
    ],
    // protocol → config, type-only: still a violation of the layer rule
    ['src/protocol/keys.ts', `import type { Key } from '../config/keys.js';\nexport type K = Key;\n`],
    ['src/config/keys.ts', `export interface Key { id: string }\n`],
    // queue → store through a dynamic import, core → protocol through an export
    ['src/queue/source.ts', `export async function open() { return import('../store/pool.js'); }\n`],
    ['src/store/pool.ts', `export const pool = 1;\n`],
    ['src/core/re-export.ts', `export { codes } from '../protocol/codes.js';\n`],
    ['src/protocol/codes.ts', `export const codes = [];\n`],
    // a runtime cycle of three, through a side-effect import
    ['src/db/a.ts', `import { b } from './b.js';\nexport const a = () => b;\n`],
    ['src/db/b.ts', `import './c.js';\nexport const b = 1;\n`],
    ['src/db/c.ts', `export * from './a.js';\n`],
    // a cycle that tsc erases: one side imports only types
    ['src/lease/types.ts', `import { type Options, type Defaults } from './options.js';\nexport interface T { o: Options; d: Defaults }\n`],
    [
      'src/lease/options.ts',
      `import { T } from './types.js';\nexport interface Options { t?: T }\nexport type Defaults = { n: number };\nexport const defaults = 1;\n`,
    ],
    // type-only through export type and import('…') types: also erased
    ['src/lease/a.ts', `export type { T } from './b.js';\nexport const a = 1;\n`],
    ['src/lease/b.ts', `export type T = typeof import('./a.js').a;\n`],
    // a mixed import keeps its runtime edge
    ['src/lease/mixed.ts', `import { type T, defaults } from './options.js';\nexport const m: T | number = defaults;\n`],
  ]);
  const synthetic = graphFromSources(sources);

  it('reports the lease → http edge and the queue → store dynamic import', () => {
    const found = layerViolations(synthetic, workerSide).map((edge) => `${edge.from} → ${edge.to}`);
    expect(found).toEqual(['src/lease/worker.ts → src/http/tracing.ts', 'src/queue/source.ts → src/store/pool.ts']);
  });

  it('reports the type-only protocol → config edge and the core → protocol re-export', () => {
    expect(layerViolations(synthetic, protocol).map((edge) => [edge.from, edge.to, edge.typeOnly])).toEqual([
      ['src/protocol/keys.ts', 'src/config/keys.ts', true],
    ]);
    expect(layerViolations(synthetic, core).map((edge) => [edge.from, edge.to])).toEqual([['src/core/re-export.ts', 'src/protocol/codes.ts']]);
  });

  it('reports the runtime cycle and not the type-only ones', () => {
    expect(runtimeCycles(synthetic)).toEqual([['src/db/a.ts', 'src/db/b.ts', 'src/db/c.ts', 'src/db/a.ts']]);
  });

  it('reports the type-only cycles too when asked to', () => {
    expect(importCycles(synthetic, { includeTypeOnly: true })).toEqual([
      ['src/db/a.ts', 'src/db/b.ts', 'src/db/c.ts', 'src/db/a.ts'],
      ['src/lease/a.ts', 'src/lease/b.ts', 'src/lease/a.ts'],
      ['src/lease/options.ts', 'src/lease/types.ts', 'src/lease/options.ts'],
    ]);
  });

  it('reports a shared module importing the lease module', () => {
    const up = graphFromSources(
      new Map([
        ['src/db/open.ts', `import type { Lease } from '../lease/types.js';\nexport type L = Lease;\n`],
        ['src/lease/types.ts', `export interface Lease { id: number }\n`],
      ]),
    );
    expect(layerViolations(up, shared).map((edge) => `${edge.from} → ${edge.to}`)).toEqual(['src/db/open.ts → src/lease/types.ts']);
  });

  it('reads no edge from comments or strings, and tells type-only edges from runtime ones', () => {
    const edge = (from: string, to: string) => synthetic.edges.find((e) => e.from === from && e.to === to);
    expect(synthetic.edges.filter((e) => e.from === 'src/http/tracing.ts')).toEqual([]);
    expect(edge('src/lease/types.ts', 'src/lease/options.ts')?.typeOnly).toBe(true);
    expect(edge('src/lease/options.ts', 'src/lease/types.ts')?.typeOnly).toBe(false);
    expect(edge('src/lease/a.ts', 'src/lease/b.ts')?.typeOnly).toBe(true);
    expect(edge('src/lease/b.ts', 'src/lease/a.ts')?.typeOnly).toBe(true);
    expect(edge('src/lease/mixed.ts', 'src/lease/options.ts')?.typeOnly).toBe(false);
    expect(edge('src/db/b.ts', 'src/db/c.ts')?.typeOnly).toBe(false);
  });

  it('follows runtime edges only for the closure', () => {
    expect(runtimeClosure(synthetic, 'src/lease/worker.ts')).toEqual(['src/http/tracing.ts', 'src/lease/worker.ts']);
    expect(runtimeClosure(synthetic, 'src/lease/types.ts')).toEqual(['src/lease/types.ts']);
  });

  it('names a relative import that resolves to no file', () => {
    const broken = graphFromSources(new Map([['src/lease/x.ts', `import { y } from './missing.js';\n`]]));
    expect(broken.unresolved).toEqual([{ from: 'src/lease/x.ts', specifier: './missing.js' }]);
  });
});
