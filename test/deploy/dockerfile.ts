/**
 * A reader for the repository's Dockerfile: the instructions this project
 * uses (FROM … AS, WORKDIR, COPY [--from], RUN, ENV, USER, EXPOSE, VOLUME,
 * STOPSIGNAL, HEALTHCHECK, CMD), line continuations and comments. Enough to
 * check the file and to run its stages' commands outside Docker
 * (./dockerfile.test.ts); not a general Dockerfile parser.
 */
export interface Instruction {
  op: string;
  args: string;
}

export interface Stage {
  image: string;
  name: string;
  steps: Instruction[];
}

export function parseDockerfile(text: string): Stage[] {
  const logical: string[] = [];
  let pending = '';
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (pending === '' && /^\s*(#|$)/.test(line)) continue;
    if (line.endsWith('\\')) {
      pending += `${line.slice(0, -1)} `;
      continue;
    }
    logical.push((pending + line).trim());
    pending = '';
  }
  const stages: Stage[] = [];
  for (const line of logical) {
    const m = /^(\w+)\s+(.*)$/.exec(line);
    if (m === null) throw new Error(`not an instruction: ${line}`);
    const op = m[1]!.toUpperCase();
    const args = m[2]!.replace(/\s+/g, ' ');
    if (op === 'FROM') {
      const f = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      if (f === null) throw new Error(`FROM: ${args}`);
      stages.push({ image: f[1]!, name: f[2] ?? String(stages.length), steps: [] });
      continue;
    }
    if (stages.length === 0) throw new Error(`${op} before FROM`);
    stages.at(-1)!.steps.push({ op, args });
  }
  return stages;
}

/** `KEY=value KEY2="v 2"` (the ENV form this file uses). */
export function parseEnv(args: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const m of args.matchAll(/(\w+)=("([^"]*)"|\S*)/g)) out[m[1]!] = m[3] ?? m[2]!;
  return out;
}

/** COPY's flags, sources and destination. */
export function parseCopy(args: string): { from: string | null; sources: string[]; dest: string } {
  const words = args.split(' ');
  let from: string | null = null;
  while (words[0]?.startsWith('--')) {
    const flag = words.shift()!;
    if (flag.startsWith('--from=')) from = flag.slice('--from='.length);
    else throw new Error(`COPY flag ${flag} is not supported here`);
  }
  const dest = words.pop()!;
  return { from, sources: words, dest };
}

/** The exec (JSON array) form of CMD or of HEALTHCHECK's CMD, with HEALTHCHECK's options. */
export function execForm(args: string): { options: Record<string, string>; argv: string[] } {
  const options: Record<string, string> = {};
  let rest = args;
  for (let m = /^--([\w-]+)=(\S+)\s+/.exec(rest); m !== null; m = /^--([\w-]+)=(\S+)\s+/.exec(rest)) {
    options[m[1]!] = m[2]!;
    rest = rest.slice(m[0].length);
  }
  rest = rest.replace(/^CMD\s+/, '');
  const argv = JSON.parse(rest) as unknown;
  if (!Array.isArray(argv) || !argv.every((a) => typeof a === 'string')) throw new Error(`not the exec form: ${rest}`);
  return { options, argv };
}
