import { execFileSync, execSync, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, isAbsolute, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT } from '../helpers/child.js';
import { paymentsRoute, command } from '../helpers/gateway.js';
import { tempDir } from '../helpers/temp.js';
import { startUpstream } from '../helpers/upstream.js';
import { execForm, parseCopy, parseDockerfile, parseEnv, type Stage } from './dockerfile.js';
import { freePort, killAll, start } from './proc.js';

// The Dockerfile, checked as far as a machine without a Docker engine can:
// its structure always; with FENCEGATE_TEST_DOCKER_STAGES=1 (slow: two
// `npm ci`), its stages' commands run in a copy of the repository, then the
// run stage's CMD and HEALTHCHECK against a free port (docs/deploy.md
// "What was verified").

const stages = parseDockerfile(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'));
const stage = (name: string): Stage => stages.find((s) => s.name === name) ?? expect.fail(`no stage ${name}`);
const steps = (s: Stage, op: string) => s.steps.filter((i) => i.op === op);
const last = (s: Stage, op: string) => steps(s, op).at(-1)?.args ?? expect.fail(`stage ${s.name} has no ${op}`);

const tmp = tempDir();
// Removing the stages' two node_modules trees takes longer than the default hook timeout.
afterAll(async () => {
  await killAll();
  tmp.cleanup();
}, 5 * 60_000);

describe('the Dockerfile', () => {
  it('builds with the dev dependencies, installs the production ones alone in a clean directory, runs from a slim image', () => {
    expect(stages.map((s) => s.name)).toEqual(['build', 'deps', 'run']);
    expect(steps(stage('build'), 'RUN').map((r) => r.args)).toEqual(expect.arrayContaining([expect.stringMatching(/^npm ci\b/), 'npm run build']));
    const deps = stage('deps');
    expect(steps(deps, 'COPY').map((c) => c.args)).toEqual(['package.json package-lock.json ./']);
    expect(steps(deps, 'RUN')[0]!.args).toMatch(/^npm ci --omit=dev --ignore-scripts\b/);
    expect(stage('run').image).toMatch(/^node:20\.20-\w+-slim$/);
    for (const s of stages) expect(s.image, s.name).toMatch(/^node:20\.20\b/);
  });

  it('runs as a non-root user, serves from FENCEGATE_CONFIG and PORT, and probes its health with node, not curl', () => {
    const run = stage('run');
    expect(last(run, 'USER')).not.toMatch(/^(root|0)$/);
    const env = Object.assign({}, ...steps(run, 'ENV').map((e) => parseEnv(e.args)));
    expect(env).toMatchObject({ NODE_ENV: 'production', FENCEGATE_CONFIG: expect.stringMatching(/^\//), PORT: '8080' });
    expect(last(run, 'EXPOSE')).toBe(env.PORT);
    expect(execForm(last(run, 'CMD')).argv).toEqual(['node', 'dist/entry/cli.js', 'serve']);
    const health = execForm(last(run, 'HEALTHCHECK'));
    expect(health.argv[0]).toBe('node');
    expect(health.argv.join(' ')).toMatch(/\/_fencegate\/health/);
    // No instruction fetches with curl or wget (the slim image has neither).
    for (const s of stages) for (const step of s.steps) expect(step.args, `${s.name} ${step.op}`).not.toMatch(/\b(curl|wget)\b/);
    // What the run stage copies exists once the build stage has run (dist/ here, after npm run build).
    for (const c of steps(run, 'COPY').map((x) => parseCopy(x.args))) {
      if (c.from === 'build') for (const src of c.sources) expect(existsSync(join(ROOT, src.replace(/^\/app\//, ''))), src).toBe(true);
    }
  });

  it('.dockerignore keeps the installed and built trees and local databases out of the context', () => {
    const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
      .split('\n')
      .filter((l) => l && !l.startsWith('#'));
    expect(ignored).toEqual(expect.arrayContaining(['node_modules', 'dist', '.git', '*.db']));
  });
});

/** The build context: the repository's files that git knows and .dockerignore keeps. */
function context(dir: string): void {
  const ignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
    .split('\n')
    .filter((l) => l && !l.startsWith('#'));
  const matches = (path: string) => ignore.some((p) => (p.startsWith('*') ? path.endsWith(p.slice(1)) : path === p || path.startsWith(`${p}/`)));
  const files = execFileSync('git', ['ls-files', '-co', '--exclude-standard'], { cwd: ROOT, encoding: 'utf8' })
    .split('\n')
    .filter((f) => f && !matches(f) && existsSync(join(ROOT, f)));
  for (const f of files) {
    mkdirSync(dirname(join(dir, f)), { recursive: true });
    cpSync(join(ROOT, f), join(dir, f));
  }
}

/**
 * Runs a stage's COPY and RUN steps in `roots[stage]` (its "/"). The run
 * stage's RUN (mkdir and chown of the image's data directories) needs root
 * and the image's `node` user, so it is recorded, not run.
 */
function runStage(s: Stage, roots: Record<string, string>, ctx: string): { env: Record<string, string>; workdir: string } {
  const root = (roots[s.name] = join(tmp.dir, `stage-${s.name}`));
  mkdirSync(root, { recursive: true });
  let workdir = '/';
  const env: Record<string, string> = {};
  const at = (base: string, p: string) => join(base, isAbsolute(p) ? p : join(workdir, p));
  for (const step of s.steps) {
    if (step.op === 'WORKDIR') mkdirSync(at(root, (workdir = step.args)), { recursive: true });
    else if (step.op === 'ENV') Object.assign(env, parseEnv(step.args));
    else if (step.op === 'COPY') {
      const c = parseCopy(step.args);
      for (const src of c.sources) {
        const from = c.from === null ? join(ctx, src) : join(roots[c.from] ?? expect.fail(`COPY --from=${c.from} before that stage`), src);
        const to =
          c.dest.endsWith('/') || c.sources.length > 1 || src === '.' ? join(at(root, c.dest), src === '.' ? '' : src.split('/').pop()!) : at(root, c.dest);
        mkdirSync(dirname(to), { recursive: true });
        cpSync(from, to, { recursive: true });
      }
    } else if (step.op === 'RUN' && s.name !== 'run') {
      execSync(step.args, {
        cwd: at(root, '.'),
        env: { ...process.env, ...env, NODE_ENV: env.NODE_ENV ?? '' },
        stdio: ['ignore', 'pipe', 'pipe'],
        timeout: 15 * 60_000,
      });
    }
  }
  return { env, workdir };
}

describe.runIf(process.env.FENCEGATE_TEST_DOCKER_STAGES === '1')('its stages, run outside Docker', () => {
  it(
    'build, deps and run: the CMD serves with production dependencies only, the HEALTHCHECK passes, and fails once it stopped',
    async () => {
      const ctx = join(tmp.dir, 'context');
      context(ctx);
      const roots: Record<string, string> = {};
      runStage(stage('build'), roots, ctx);
      runStage(stage('deps'), roots, ctx);
      const image = runStage(stage('run'), roots, ctx);
      const app = join(roots.run!, image.workdir);
      // Production dependencies only.
      for (const dep of ['hono', 'better-sqlite3', 'pg', 'zod', 'undici']) expect(existsSync(join(app, 'node_modules', dep)), dep).toBe(true);
      for (const dev of ['typescript', 'vitest', 'wrangler', 'playwright-core']) expect(existsSync(join(app, 'node_modules', dev)), dev).toBe(false);

      const up = await startUpstream();
      const config = join(tmp.dir, 'fencegate.json');
      writeFileSync(config, JSON.stringify({ store: { sqlite: join(tmp.dir, 'image.db') }, routes: [paymentsRoute(up.url)] }));
      // What `docker run -e FENCEGATE_CONFIG=… -e PORT=…` would set over the image's ENV.
      const env = { ...image.env, FENCEGATE_CONFIG: config, PORT: String(await freePort()) };
      const cmd = execForm(last(stage('run'), 'CMD')).argv;
      const child = start(cmd.slice(1), { command: process.execPath, cwd: app, env });
      const { url } = await child.waitFor((l) => l.msg === 'listening', 'listening', 60_000);
      expect(url).toBe(`http://127.0.0.1:${env.PORT}`);
      expect((await command(url, '/payments/charges', { fence: 1, entity: 'e', key: 'k' })).status).toBe(201);

      const health = execForm(last(stage('run'), 'HEALTHCHECK')).argv;
      const check = () => spawnSync(process.execPath, health.slice(1), { cwd: app, env: { ...process.env, ...env }, timeout: 10_000 }).status;
      expect(check()).toBe(0);
      child.proc.kill('SIGTERM');
      expect(await child.exited).toBe(0);
      expect(check()).toBe(1);
      await up.close();
    },
    30 * 60_000,
  );
});
