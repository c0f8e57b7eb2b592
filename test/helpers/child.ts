import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const CLI = join(ROOT, 'dist', 'entry', 'cli.js');
export const GATEWAY_CHILD = join(ROOT, 'test', 'helpers', 'gateway-child.mjs');

/** Log lines and exit of a child process, with waits on both. */
export interface Child {
  proc: ChildProcess;
  pid: number;
  /** Every stdout line that parsed as JSON. */
  lines: Record<string, any>[];
  stdout(): string;
  stderr(): string;
  /** Resolves with the first JSON line matching `predicate` (already seen or future). */
  waitForLine(predicate: (line: Record<string, any>) => boolean, what?: string, timeoutMs?: number): Promise<Record<string, any>>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const running = new Set<Child>();

/**
 * Spawns `node <args>` from the repository root. The compiled `dist/` must
 * be current (`npm test` builds first; by hand: `npm run build`).
 */
export function spawnNode(args: string[], env: Record<string, string> = {}): Child {
  if (!existsSync(CLI)) throw new Error('dist/ is missing: run `npm run build` before the child-process tests');
  const proc = spawn(process.execPath, args, {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  let partial = '';
  const lines: Record<string, any>[] = [];
  const listeners = new Set<() => void>();
  proc.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    out += chunk;
    partial += chunk;
    const parts = partial.split('\n');
    partial = parts.pop()!;
    for (const p of parts) {
      try {
        lines.push(JSON.parse(p));
      } catch {
        // not a log line
      }
    }
    for (const l of [...listeners]) l();
  });
  proc.stderr!.setEncoding('utf8').on('data', (chunk: string) => (err += chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    proc.on('exit', (code, signal) => {
      running.delete(child);
      for (const l of [...listeners]) l();
      resolve({ code, signal });
    });
  });
  let hasExited = false;
  void exited.then(() => (hasExited = true));
  const child: Child = {
    proc,
    pid: proc.pid!,
    lines,
    stdout: () => out,
    stderr: () => err,
    exited,
    waitForLine(predicate, what = 'log line', timeoutMs = 20_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const found = lines.find(predicate);
          if (found !== undefined) {
            done();
            resolve(found);
          } else if (hasExited || proc.exitCode !== null) {
            done();
            reject(new Error(`child exited before ${what}; stderr: ${err}; stdout: ${out.slice(-2000)}`));
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`timed out waiting for ${what}; stderr: ${err}; stdout: ${out.slice(-2000)}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          listeners.delete(check);
        };
        listeners.add(check);
        check();
      });
    },
  };
  running.add(child);
  return child;
}

/** Runs to completion: exit code and output. */
export async function runNode(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawnNode(args, env);
  const { code } = await child.exited;
  return { code, stdout: child.stdout(), stderr: child.stderr() };
}

/** Starts a gateway child and waits until it listens; returns its URL. */
export async function startGatewayChild(args: string[], env: Record<string, string> = {}): Promise<Child & { url: string }> {
  const child = spawnNode(args, env);
  const line = await child.waitForLine((l) => l.msg === 'listening', 'listening');
  return Object.assign(child, { url: line.url as string });
}

/** Kills every child this test file started and is still running (by pid), and waits for them. */
export async function killChildren(): Promise<void> {
  const all = [...running];
  for (const c of all) c.proc.kill('SIGKILL');
  await Promise.all(all.map((c) => c.exited));
}

export function writeJson(path: string, value: unknown): string {
  writeFileSync(path, JSON.stringify(value, null, 2));
  return path;
}
