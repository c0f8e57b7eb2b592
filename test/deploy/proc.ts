/**
 * The deploy tests' child processes: the compiled CLI (dist/) run from a
 * directory of the test's choosing (the store's relative path, a copy of the
 * repository), its JSON log lines parsed. Every child is killed in afterAll
 * through `killAll`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ROOT } from '../helpers/child.js';

export const CLI = join(ROOT, 'dist', 'entry', 'cli.js');

export interface Child {
  proc: ChildProcess;
  lines: Record<string, any>[];
  stderr(): string;
  waitFor(predicate: (l: Record<string, any>) => boolean, what: string, timeoutMs?: number): Promise<Record<string, any>>;
  exited: Promise<number | null>;
}

const children = new Set<ChildProcess>();

export function start(args: string[], options: { cwd?: string; env?: Record<string, string | undefined>; command?: string } = {}): Child {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries({ FENCEGATE_WORKERS: '1', ...process.env, FENCEGATE_CONFIG: undefined, PORT: undefined, ...options.env }))
    if (v !== undefined) env[k] = v;
  const proc = spawn(options.command ?? process.execPath, options.command ? args : [CLI, ...args], {
    cwd: options.cwd ?? ROOT,
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(proc);
  const lines: Record<string, any>[] = [];
  const waiters = new Set<() => void>();
  let err = '';
  proc.stderr!.setEncoding('utf8').on('data', (c: string) => (err += c));
  createInterface({ input: proc.stdout! }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line));
    } catch {
      lines.push({ text: line });
    }
    for (const w of waiters) w();
  });
  const exited = new Promise<number | null>((resolve) =>
    proc.once('exit', (code) => {
      children.delete(proc);
      for (const w of waiters) w();
      resolve(code);
    }),
  );
  const waitFor = (predicate: (l: Record<string, any>) => boolean, what: string, timeoutMs = 20_000) =>
    new Promise<Record<string, any>>((resolve, reject) => {
      const timer = setTimeout(() => done(new Error(`timed out waiting for ${what}; stderr: ${err}; lines: ${JSON.stringify(lines)}`)), timeoutMs);
      const done = (e: Error | null, line?: Record<string, any>) => {
        clearTimeout(timer);
        waiters.delete(check);
        if (e) reject(e);
        else resolve(line!);
      };
      const check = () => {
        const line = lines.find(predicate);
        if (line) return done(null, line);
        if (proc.exitCode !== null || proc.signalCode !== null)
          done(new Error(`exited (${proc.exitCode ?? proc.signalCode}) before ${what}; stderr: ${err}; lines: ${JSON.stringify(lines)}`));
      };
      waiters.add(check);
      check();
    });
  return { proc, lines, stderr: () => err, waitFor, exited };
}

export async function run(
  args: string[],
  options: Parameters<typeof start>[1] & { keepStdout?: boolean } = {},
): Promise<{ code: number | null; stderr: string; stdout: string; lines: Record<string, any>[] }> {
  const c = start(args, options);
  let stdout = '';
  if (options.keepStdout) c.proc.stdout!.on('data', (d: Buffer) => (stdout += d.toString('utf8')));
  const code = await c.exited;
  return { code, stderr: c.stderr(), stdout, lines: c.lines };
}

export async function killAll(): Promise<void> {
  await Promise.all(
    [...children].map(
      (p) =>
        new Promise<void>((resolve) => {
          p.once('exit', () => resolve());
          p.kill('SIGKILL');
        }),
    ),
  );
}

/** A port nothing listens on right now. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
