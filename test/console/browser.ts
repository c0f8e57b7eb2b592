import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT } from '../helpers/child.js';

// Headless Chromium (Debian's `chromium` package, driven by playwright-core
// with executablePath) for the console's browser tests. Screenshots go to
// test-results/console/ (gitignored), kept as artifacts.

const CHROMIUM = process.env.FENCEGATE_CHROMIUM ?? '/usr/bin/chromium';
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];
export const SCREENSHOTS = join(ROOT, 'test-results', 'console');

// Loaded by name so that the suite still compiles where it is not installed.
const PW = 'playwright-core';
const playwright: any = await import(PW).catch(() => null);

/** Why the browser tests cannot run here, or null. */
export const skipReason: string | null = !existsSync(CHROMIUM)
  ? `${CHROMIUM} is missing (apt-get install -y chromium)`
  : playwright === null
    ? 'playwright-core is not installed (npm install)'
    : null;
if (skipReason !== null) console.warn(`[console test] SKIPPED: ${skipReason}`);

export interface Browser {
  context: any;
  /** A fresh tab whose script errors (other than the expected 401/403 answers) are collected in `problems`. */
  page(): Promise<{ page: any; problems: string[] }>;
  screenshot(page: any, name: string): Promise<string>;
  close(): Promise<void>;
}

/** A persistent Chromium profile in a temporary directory, 1400 × 1000 px. */
export async function launchBrowser(): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), 'fencegate-chromium-'));
  const context = await playwright.chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: FLAGS,
    viewport: { width: 1400, height: 1000 },
    acceptDownloads: true,
  });
  return {
    context,
    async page() {
      const page = await context.newPage();
      const problems: string[] = [];
      page.on('console', (m: any) => m.type() === 'error' && !/401|403/.test(m.text()) && problems.push(m.text()));
      page.on('pageerror', (e: Error) => problems.push(e.message));
      return { page, problems };
    },
    async screenshot(page, name) {
      mkdirSync(SCREENSHOTS, { recursive: true });
      const path = join(SCREENSHOTS, `${name}.png`);
      await page.screenshot({ path, fullPage: true });
      return path;
    },
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
