import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/**
 * Child processes for fault tests: the gateway, workers, the upstream. Each
 * speaks JSON lines on stdout (and takes commands on stdin when asked), and
 * can be paused (SIGSTOP), resumed (SIGCONT) and killed (SIGKILL). Every
 * process started here is tracked, so `killAll()` in afterAll leaves none
 * behind, also when a test failed half-way.
 */

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
/** Node flags that let a child run this repository's TypeScript sources (see test/lease/helpers/ts-hooks.mjs). */
export const TS_ARGS = ['--import', join(ROOT, 'test', 'lease', 'helpers', 'ts-register.mjs')];

export type Message = Record<string, any>;

export interface Proc {
  name: string;
  proc: ChildProcess;
  pid: number;
  /** Parsed JSON lines still kept (the last `keepLines`). */
  readonly lines: Message[];
  stderr(): string;
  /** Resolves with the first kept or future line that satisfies `predicate`. */
  waitFor(predicate: (m: Message) => boolean, what: string, timeoutMs?: number): Promise<Message>;
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
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export interface SpawnOptions {
  env?: Record<string, string>;
  /** Keep stdin open for commands. */
  stdin?: boolean;
  /** How many parsed lines to keep for `waitFor` (older ones are dropped). Default 2 000. */
  keepLines?: number;
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
    env: { ...process.env, ...options.env },
    stdio: [options.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
  });
  const keep = options.keepLines ?? 2_000;
  const lines: Message[] = [];
  const events = new EventEmitter();
  events.setMaxListeners(0);
  let err = '';
  let paused = false;
  let alive = true;
  proc.stderr!.setEncoding('utf8').on('data', (c: string) => {
    err += c;
    if (err.length > 20_000) err = err.slice(-10_000);
  });
  createInterface({ input: proc.stdout! }).on('line', (line) => {
    if (!line.startsWith('{')) return;
    let m: Message;
    try {
      m = JSON.parse(line);
    } catch {
      return;
    }
    lines.push(m);
    if (lines.length > keep) lines.splice(0, lines.length - keep);
    options.onLine?.(m);
    events.emit('line', m);
  });
  proc.stdin?.on('error', () => {});
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    proc.once('exit', (code, signal) => {
      alive = false;
      running.delete(p);
      events.emit('exit');
      resolve({ code, signal });
    });
  });
  const p: Proc = {
    name,
    proc,
    pid: proc.pid!,
    lines,
    stderr: () => err,
    waitFor(predicate, what, timeoutMs = 30_000) {
      const seen = lines.find(predicate);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const onLine = (m: Message) => {
          if (!predicate(m)) return;
          done();
          resolve(m);
        };
        const onExit = () => {
          done();
          reject(new Error(`${name} exited before ${what}; stderr: ${err.slice(-3000)}`));
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`${name}: timed out waiting for ${what}; stderr: ${err.slice(-3000)}`));
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

/** Kills every process started here that still runs, and waits for them. */
export async function killAll(): Promise<void> {
  await Promise.all([...running].map((p) => p.kill()));
}

/** Pids of the processes still tracked (for leak checks). */
export function livePids(): number[] {
  return [...running].map((p) => p.pid);
}
