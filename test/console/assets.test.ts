import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Script } from 'node:vm';
import { afterAll, describe, expect, it } from 'vitest';
import { GENERATED, CONSOLE_DIR, SCRIPTS, readSources, render } from '../../scripts/bundle-console.mjs';
import { CONSOLE_HTML, CONSOLE_PAGES, consoleResponse } from '../../src/http/console/page.js';
import { tempDir } from '../helpers/temp.js';

// The console's real files (console.html, .css, the scripts) and the module the build
// bundles them into. The page itself is driven in Chromium by console.test.ts.

const tmp = tempDir('fencegate-console-assets-');
afterAll(() => tmp.cleanup());

/** What a reviewer of the console's script must never see: HTML built from strings, code from strings. */
function lintScript(js: string): string[] {
  const problems: string[] = [];
  if (!/^\(function \(\) \{\n {2}'use strict';/.test(js)) problems.push("not wrapped in (function () { 'use strict'; ... })");
  for (const [re, what] of [
    [/\.(inner|outer)HTML\b/, 'innerHTML/outerHTML'],
    [/\binsertAdjacentHTML\b/, 'insertAdjacentHTML'],
    [/\bdocument\.write(ln)?\b/, 'document.write'],
    [/\beval\s*\(/, 'eval'],
    [/\bnew\s+Function\b/, 'new Function'],
    [/\bset(Timeout|Interval)\s*\(\s*['"]/, 'a timer given a string'],
    [/\blocalStorage\b/, 'localStorage (the token lives in sessionStorage only)'],
  ] as const) {
    if (re.test(js)) problems.push(what);
  }
  return problems;
}

/** The page template: the only script and style are the bundled ones, no inline handlers, nothing loaded from elsewhere. */
function lintTemplate(html: string): string[] {
  const problems: string[] = [];
  for (const marker of ['__STYLE__', '__SCRIPT__', '__REASONS__', '__AUTH__']) {
    if (html.split(marker).length !== 2) problems.push(`${marker} not exactly once`);
  }
  if ((html.match(/<script\b/gi) ?? []).length !== 1 || !html.includes('<script>__SCRIPT__</script>'))
    problems.push('a script other than <script>__SCRIPT__</script>');
  if ((html.match(/<style\b/gi) ?? []).length !== 1 || !html.includes('<style>__STYLE__</style>')) problems.push('a style other than <style>__STYLE__</style>');
  if (/\son[a-z]+\s*=/i.test(html)) problems.push('an inline event handler');
  if (/\bstyle\s*=/i.test(html)) problems.push('a style attribute');
  if (/javascript:/i.test(html)) problems.push('a javascript: URL');
  if (/\b(src|href|action)\s*=\s*["']?(https?:)?\/\//i.test(html)) problems.push('a resource from another origin');
  return problems;
}

describe('console assets', () => {
  it('assets.generated.ts is what scripts/bundle-console.mjs makes of the files (run `npm run build` when this fails)', () => {
    const sources = readSources();
    expect(readFileSync(GENERATED, 'utf8')).toBe(render(sources));
    // Negative control: a one-character change to any file is seen.
    for (const k of ['html', 'css', 'js'] as const) expect(render({ ...sources, [k]: `${sources[k]} ` })).not.toBe(readFileSync(GENERATED, 'utf8'));
  });

  it('the `--check` mode of the bundler agrees', () => {
    const r = spawnSync(process.execPath, [join(CONSOLE_DIR, '..', '..', '..', 'scripts', 'bundle-console.mjs'), '--check'], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it('every script passes `node --check` and compiles as a classic browser script', () => {
    expect(SCRIPTS[0]).toBe('console.js');
    for (const name of SCRIPTS) {
      const file = join(CONSOLE_DIR, name);
      const r = spawnSync(process.execPath, ['--check', file], { encoding: 'utf8' });
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
      expect(() => new Script(readFileSync(file, 'utf8'), { filename: file })).not.toThrow();
      // Each its own strict IIFE (the bundle is checked as a whole by the lint below).
      expect(readFileSync(file, 'utf8')).toMatch(/^\(function \(\) \{\n {2}'use strict';[\s\S]*\}\)\(\);\n$/);
    }
    const file = join(CONSOLE_DIR, 'console.js');
    // Negative control: a syntax error is caught by both.
    const broken = join(tmp.dir, 'broken.js');
    writeFileSync(broken, readFileSync(file, 'utf8').replace('function token()', 'function token('));
    const bad = spawnSync(process.execPath, ['--check', broken], { encoding: 'utf8' });
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/SyntaxError/);
    expect(() => new Script(readFileSync(broken, 'utf8'))).toThrow(SyntaxError);
  });

  it('console.js and console.html pass the console lint', () => {
    const { html, js } = readSources();
    expect(lintScript(js)).toEqual([]);
    expect(lintTemplate(html)).toEqual([]);
    // Negative controls: each rule fires.
    expect(lintScript(js.replace('td.textContent = text', 'td.innerHTML = text'))).toEqual(['innerHTML/outerHTML']);
    expect(lintScript(js.replace("'use strict';", ''))).toHaveLength(1);
    expect(lintTemplate(html.replace('<header>', '<header onclick="x()">'))).toEqual(['an inline event handler']);
    expect(lintTemplate(html.replace('</body>', '<script src="https://cdn.example/x.js"></script></body>'))).toEqual([
      'a script other than <script>__SCRIPT__</script>',
      'a resource from another origin',
    ]);
  });

  it('the served page holds the files verbatim, and the CSP hashes are those of its inline script and style', async () => {
    const { css, js } = readSources();
    const res = await consoleResponse();
    const page = await res.text();
    expect(page).toBe(CONSOLE_HTML);
    const script = page.match(/<script>([\s\S]*)<\/script>/)![1]!;
    const style = page.match(/<style>([\s\S]*)<\/style>/)![1]!;
    expect(script).toBe(`\n${js}`);
    expect(style).toBe(`\n${css}`);
    const sha = (t: string) => createHash('sha256').update(t).digest('base64');
    const policy = res.headers.get('content-security-policy')!;
    expect(policy).toContain(`script-src 'sha256-${sha(script)}'`);
    expect(policy).toContain(`style-src 'sha256-${sha(style)}'`);
    // Negative control: the file's bytes alone (without the leading newline) hash to something else.
    expect(policy).not.toContain(sha(js));
    expect(page).not.toMatch(/__(STYLE|SCRIPT|REASONS|AUTH)__/);
  });

  it('the pages for the three admin modes differ only in <body data-auth>, so one CSP covers them all', async () => {
    expect(CONSOLE_HTML).toBe(CONSOLE_PAGES.open);
    for (const mode of ['auth', 'open', 'off'] as const) {
      const res = await consoleResponse(mode);
      const page = await res.text();
      expect(page).toContain(`<body data-auth="${mode}">`);
      expect(page.replace(`<body data-auth="${mode}">`, '<body>')).toBe(CONSOLE_PAGES.open.replace('<body data-auth="open">', '<body>'));
      expect(res.headers.get('content-security-policy')).toBe((await consoleResponse()).headers.get('content-security-policy'));
    }
  });
});
