/**
 * Child Node processes that run the lease module's TypeScript sources, and
 * talk to the test over JSON lines (stdout) and commands (stdin).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { TS_EXEC_ARGV, helperPath } from './node.js';

export interface Child {
  process: ChildProcess;
  /** The next JSON message from the child that satisfies `predicate`. */
  next<T = Record<string, unknown>>(predicate?: (m: any) => boolean): Promise<T>;
  send(line: string): void;
  /** Resolves with the exit code or signal. */
  exited: Promise<number | NodeJS.Signals | null>;
  kill(signal?: NodeJS.Signals): Promise<number | NodeJS.Signals | null>;
}

const children = new Set<ChildProcess>();

/** Kills every child still running; call it in afterAll so that no process leaks. */
export async function killAllChildren(): Promise<void> {
  await Promise.all(
    [...children].map(
      (c) =>
        new Promise<void>((resolve) => {
          if (c.exitCode !== null || c.signalCode !== null) return resolve();
          c.once('exit', () => resolve());
          c.kill('SIGKILL');
        }),
    ),
  );
}

/** Starts `node --import <ts loader> test/lease/helpers/<script> ...args`. */
export function spawnChild(script: string, args: string[]): Child {
  const proc = spawn(process.execPath, [...TS_EXEC_ARGV, helperPath(script), ...args], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  children.add(proc);
  const messages: Record<string, unknown>[] = [];
  const waiters: { predicate: (m: any) => boolean; resolve: (m: any) => void }[] = [];
  let stderr = '';
  proc.stderr!.on('data', (chunk) => (stderr += chunk));
  createInterface({ input: proc.stdout! }).on('line', (line) => {
    let message: Record<string, unknown>;
    try {
      message = JSON.parse(line);
    } catch {
      return; // not ours
    }
    const i = waiters.findIndex((w) => w.predicate(message));
    if (i >= 0) waiters.splice(i, 1)[0]!.resolve(message);
    else messages.push(message);
  });
  const exited = new Promise<number | NodeJS.Signals | null>((resolve) =>
    proc.once('exit', (code, signal) => {
      children.delete(proc);
      resolve(signal ?? code);
    }),
  );
  return {
    process: proc,
    next(predicate = () => true) {
      const i = messages.findIndex((m) => predicate(m as never));
      if (i >= 0) return Promise.resolve(messages.splice(i, 1)[0] as never);
      return new Promise((resolve, reject) => {
        waiters.push({ predicate: predicate as never, resolve });
        void exited.then((how) => reject(new Error(`child ${script} exited (${how}) before the message; stderr:\n${stderr}`)));
      });
    },
    send(line) {
      proc.stdin!.write(`${line}\n`);
    },
    exited,
    async kill(signal = 'SIGKILL') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}
