/**
 * The one child-process harness of the test suite: gateways, CLI runs, lease
 * workers, fault-test upstreams. Every child is `node <args>` from the
 * repository root, speaks JSON lines on stdout (and takes commands on stdin
 * when asked), and can be paused (SIGSTOP), resumed (SIGCONT) and killed.
 * Every process started here is tracked, so `killAll()` in afterAll leaves
 * none behind, also when a test failed half-way.
 *
 * Entry points: `spawnProc` (the general one), `spawnNode` / `runNode` /
 * `startGatewayChild` (the compiled CLI in dist/), `spawnChild` (a lease
 * helper script run from its TypeScript source).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { existsSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { TS_EXEC_ARGV, helperPath } from '../lease/helpers/node.js';

/** The repository root. */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const CLI = join(ROOT, 'dist', 'entry', 'cli.js');
export const GATEWAY_CHILD = join(ROOT, 'test', 'helpers', 'gateway-child.mjs');
/** Node flags that let a child run this repository's TypeScript sources (see test/lease/helpers/ts-hooks.mjs). */
export const TS_ARGS = TS_EXEC_ARGV;

export type Message = Record<string, any>;
export type Exit = { code: number | null; signal: NodeJS.Signals | null };

export interface Proc {
  name: string;
  proc: ChildProcess;
  pid: number;
  /** Parsed JSON lines still kept (all of them, or the last `keepLines`). */
  readonly lines: Message[];
  /** Everything written to stdout (only with `keepStdout`; '' otherwise). */
  stdout(): string;
  stderr(): string;
  /** Resolves with the first kept or future line that satisfies `predicate`; rejects when the child exits first or after `timeoutMs`. */
  waitFor(predicate: (m: Message) => boolean, what: string, timeoutMs?: number): Promise<Message>;
  /** The same with the old name and a 20 s default. */
  waitForLine(predicate: (m: Message) => boolean, what?: string, timeoutMs?: number): Promise<Message>;
  /**
   * Takes the next line that satisfies `predicate` off a queue: each line is
   * handed out once, so asking twice for `ready` waits for a second one.
   * No timeout of its own (the test's applies); rejects when the child exits first.
   */
  next<T = Message>(predicate?: (m: any) => boolean): Promise<T>;
  /** Writes one line to the child's stdin (spawned with `stdin: true`). */
  send(line: string): void;
  /** SIGSTOP: the whole process freezes (every thread, every timer). */
  pause(): void;
  /** SIGCONT. */
  resume(): void;
  readonly paused: boolean;
  readonly alive: boolean;
  /** SIGKILL (a paused process too) and wait for the exit. */
  kill(): Promise<void>;
  exited: Promise<Exit>;
}

export interface SpawnOptions {
  env?: Record<string, string>;
  /** Keep stdin open for commands. */
  stdin?: boolean;
  /** How many parsed lines to keep for `waitFor` and `next` (older ones are dropped). Default 2 000. */
  keepLines?: number;
  /** Keep the whole stdout as text for `stdout()`. */
  keepStdout?: boolean;
  /** Keep only the last half of stderr once it passes this many characters. Default 20 000. */
  maxStderr?: number;
  /** Called for every parsed line (e.g. to count events without keeping them). */
  onLine?: (m: Message) => void;
}

const running = new Set<Proc>();

// A test process that dies on an uncaught error must not leave its children
// running: 'exit' handlers run synchronously, so SIGKILL them from there.
process.once('exit', () => {
  for (const p of running) p.proc.kill('SIGKILL');
});

/** `node <args>` from the repository root. */
export function spawnProc(name: string, args: string[], options: SpawnOptions = {}): Proc {
  const proc = spawn(process.execPath, args, {
    cwd: ROOT,
    // `fencegate serve` runs one process per core by default: a test's gateway is one process (a pid to pause) unless it asks for `--workers`.
    env: { FENCEGATE_WORKERS: '1', ...process.env, ...options.env },
    stdio: [options.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
  });
  const keep = options.keepLines ?? 2_000;
  const maxStderr = options.maxStderr ?? 20_000;
  const lines: Message[] = [];
  // Lines not yet taken by `next`, and the `next` calls still waiting.
  const queue: Message[] = [];
  const takers: { predicate: (m: any) => boolean; resolve: (m: any) => void }[] = [];
  const events = new EventEmitter();
  events.setMaxListeners(0);
  let out = '';
  let err = '';
  let paused = false;
  let alive = true;
  proc.stderr!.setEncoding('utf8').on('data', (c: string) => {
    err += c;
    if (err.length > maxStderr) err = err.slice(-Math.floor(maxStderr / 2));
  });
  proc.stdout!.setEncoding('utf8');
  if (options.keepStdout) proc.stdout!.on('data', (c: string) => (out += c));
  createInterface({ input: proc.stdout! }).on('line', (line) => {
    if (!line.startsWith('{')) return;
    let m: Message;
    try {
      m = JSON.parse(line);
    } catch {
      return; // not a log line
    }
    lines.push(m);
    if (lines.length > keep) lines.splice(0, lines.length - keep);
    const i = takers.findIndex((t) => t.predicate(m));
    if (i >= 0) takers.splice(i, 1)[0]!.resolve(m);
    else {
      queue.push(m);
      if (queue.length > keep) queue.splice(0, queue.length - keep);
    }
    options.onLine?.(m);
    events.emit('line', m);
  });
  proc.stdin?.on('error', () => {});
  const exited = new Promise<Exit>((resolve) => {
    proc.once('exit', (code, signal) => {
      alive = false;
      running.delete(p);
      events.emit('exit');
      resolve({ code, signal });
    });
  });
  const tail = () => `stderr: ${err.slice(-3000)}${options.keepStdout ? `; stdout: ${out.slice(-2000)}` : ''}`;
  const waitFor = (predicate: (m: Message) => boolean, what: string, timeoutMs: number) => {
    const seen = lines.find(predicate);
    if (seen) return Promise.resolve(seen);
    return new Promise<Message>((resolve, reject) => {
      const onLine = (m: Message) => {
        if (!predicate(m)) return;
        done();
        resolve(m);
      };
      const onExit = () => {
        done();
        reject(new Error(`${name} exited before ${what}; ${tail()}`));
      };
      const timer = setTimeout(() => {
        done();
        reject(new Error(`${name}: timed out waiting for ${what}; ${tail()}`));
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        events.off('line', onLine);
        events.off('exit', onExit);
      };
      events.on('line', onLine);
      events.on('exit', onExit);
      if (!alive) onExit();
    });
  };
  const p: Proc = {
    name,
    proc,
    pid: proc.pid!,
    lines,
    stdout: () => out,
    stderr: () => err,
    waitFor: (predicate, what, timeoutMs = 30_000) => waitFor(predicate, what, timeoutMs),
    waitForLine: (predicate, what = 'log line', timeoutMs = 20_000) => waitFor(predicate, what, timeoutMs),
    next(predicate = () => true) {
      const i = queue.findIndex((m) => predicate(m));
      if (i >= 0) return Promise.resolve(queue.splice(i, 1)[0] as never);
      return new Promise((resolve, reject) => {
        takers.push({ predicate, resolve });
        void exited.then((how) => reject(new Error(`${name} exited (${how.signal ?? how.code}) before the message; stderr:\n${err}`)));
      });
    },
    send(line) {
      if (alive) proc.stdin?.write(`${line}\n`);
    },
    pause() {
      if (alive && !paused) {
        proc.kill('SIGSTOP');
        paused = true;
      }
    },
    resume() {
      if (alive && paused) {
        proc.kill('SIGCONT');
        paused = false;
      }
    },
    get paused() {
      return paused;
    },
    get alive() {
      return alive;
    },
    async kill() {
      if (alive) proc.kill('SIGKILL');
      await exited;
    },
    exited,
  };
  running.add(p);
  return p;
}

/** Kills every process started here that still runs (by pid), and waits for them. */
export async function killAll(): Promise<void> {
  await Promise.all([...running].map((p) => p.kill()));
}

/** Pids of the processes still tracked (for leak checks). */
export function livePids(): number[] {
  return [...running].map((p) => p.pid);
}

/**
 * Spawns `node <args>` for the compiled CLI, keeping all of stdout. The
 * compiled `dist/` must be current (`npm test` builds first; by hand:
 * `npm run build`).
 */
export function spawnNode(args: string[], env: Record<string, string> = {}): Proc {
  if (!existsSync(CLI)) throw new Error('dist/ is missing: run `npm run build` before the child-process tests');
  return spawnProc('child', args, { env, keepStdout: true, keepLines: Infinity, maxStderr: Infinity });
}

/** Runs to completion: exit code and output. */
export async function runNode(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawnNode(args, env);
  const { code } = await child.exited;
  return { code, stdout: child.stdout(), stderr: child.stderr() };
}

/** Starts a gateway child and waits until it listens; returns its URL. */
export async function startGatewayChild(args: string[], env: Record<string, string> = {}): Promise<Proc & { url: string }> {
  const child = spawnNode(args, env);
  const line = await child.waitForLine((l) => l.msg === 'listening', 'listening');
  return Object.assign(child, { url: line.url as string });
}

/** The lease tests' view of a child: the exit as one value, the signal if any, else the code. */
export interface LeaseChild {
  process: ChildProcess;
  next: Proc['next'];
  send: Proc['send'];
  exited: Promise<number | NodeJS.Signals | null>;
  kill(signal?: NodeJS.Signals): Promise<number | NodeJS.Signals | null>;
}

/** Starts `node --import <ts loader> test/lease/helpers/<script> ...args`, stdin open for commands. */
export function spawnChild(script: string, args: string[]): LeaseChild {
  const p = spawnProc(script, [...TS_ARGS, helperPath(script), ...args], { stdin: true, keepLines: Infinity, maxStderr: Infinity });
  const exited = p.exited.then(({ code, signal }) => signal ?? code);
  return {
    process: p.proc,
    next: p.next,
    send: p.send,
    exited,
    async kill(signal = 'SIGKILL') {
      if (p.alive) p.proc.kill(signal);
      return exited;
    },
  };
}

export function writeJson(path: string, value: unknown): string {
  writeFileSync(path, JSON.stringify(value, null, 2));
  return path;
}
