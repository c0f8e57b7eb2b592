import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { ROOT } from '../helpers/child.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';

// The operator console (docs/auth-audit.md) end to end in headless Chromium (Debian's
// `chromium` package, driven by playwright-core with executablePath): sign in
// with a token, filter rejections, an entity's fence history, resolve an
// outcome_unknown record. A screenshot is kept under test-results/.

// Browser globals, only ever used inside page.evaluate / waitForFunction callbacks.
declare const document: any;
declare const window: any;
declare const sessionStorage: any;
declare const localStorage: any;
type HTMLTableRowElement = any;
type HTMLElement = any;

const CHROMIUM = process.env.FENCEGATE_CHROMIUM ?? '/usr/bin/chromium';
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'];
const SCREENSHOTS = join(ROOT, 'test-results');

// Loaded by name so that the suite still compiles where it is not installed.
const PW = 'playwright-core';
const playwright: any = await import(PW).catch(() => null);
const skip = !existsSync(CHROMIUM)
  ? `${CHROMIUM} is missing (apt-get install -y chromium)`
  : playwright === null
    ? 'playwright-core is not installed (npm install)'
    : null;
if (skip !== null) console.warn(`[console test] SKIPPED: ${skip}`);

describe.skipIf(skip !== null)('console in headless Chromium', () => {
  let up: FakeUpstream;
  let gw: TestGateway;
  let context: any;
  let profile: string;
  const XSS = '<img src=x onerror="window.__xss=1">';

  beforeAll(async () => {
    up = await startUpstream();
    gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: hsAuth() } });
    const worker = bearer(await token({ sub: 'billing' }));
    const send = (fence: number, entity: string, key: string) => command(gw.url, '/payments/charges', { fence, entity, key, headers: worker });
    for (const [f, k] of [[1, 'a'], [3, 'b'], [7, 'c']] as const) expect((await send(f, 'tool-job:1', k)).status).toBe(201);
    await expectProblem(await send(2, 'tool-job:1', 'late-1'), 409, 'stale-fence');
    await expectProblem(await send(5, 'tool-job:1', 'late-2'), 409, 'stale-fence');
    expect((await send(4, 'tool-job:2', 'd')).status).toBe(201);
    await expectProblem(await send(1, 'tool-job:2', 'late-3'), 409, 'stale-fence');
    // An entity chosen by a hostile caller: the console must show it as text.
    await gw.sqlite.recordRejection({ reason: 'stale-fence', entity: XSS, presentedFence: 1n, currentFence: 2n, idempotencyKey: XSS, audit: { requestId: 'r', clientRequestId: null, caller: 'mallory', method: 'POST', path: '/payments/x', payloadSha256: 'ab'.repeat(32) } });
    // An outcome_unknown record: the upstream resets the connection after reading the request.
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await send(8, 'tool-job:1', 'pay-42'), 504, 'upstream-timeout');
    up.behave(null);

    profile = mkdtempSync(join(tmpdir(), 'fencegate-chromium-'));
    context = await playwright.chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1400, height: 1000 } });
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    if (profile) rmSync(profile, { recursive: true, force: true });
    await gw?.close();
    await up?.close();
  });

  it('signs in, filters rejections, shows fence history, and resolves an outcome_unknown record', { timeout: 120_000 }, async () => {
    const page = context.pages()[0] ?? (await context.newPage());
    const problems: string[] = [];
    page.on('console', (m: any) => m.type() === 'error' && !/401|403/.test(m.text()) && problems.push(m.text()));
    page.on('pageerror', (e: Error) => problems.push(e.message));

    const res = await page.goto(`${gw.url}/_fencegate/console`);
    expect(res.status()).toBe(200);
    expect(res.headers()['content-security-policy']).toMatch(/script-src 'sha256-/);
    await page.waitForSelector('body[data-ready="true"]');
    expect(await page.textContent('#whoami')).toBe('not signed in');

    // A token with the audit scope only: reads work, resolving will be refused.
    await page.fill('#token', await token({ sub: 'auditor-bob', scope: 'fencegate:audit' }));
    await page.click('#sign-in');
    await page.waitForFunction(() => document.querySelectorAll('#rej-table tbody tr').length === 4);
    expect(await page.textContent('#whoami')).toBe('signed in as auditor-bob (fencegate:audit)');
    // The hostile entity is text, not markup.
    expect(await page.evaluate(() => (window as any).__xss)).toBeUndefined();
    expect(await page.locator('#rej-table tbody tr', { hasText: XSS }).count()).toBe(1);
    expect(await page.locator('#rej-table img').count()).toBe(0);

    // Filter: entity and reason.
    await page.fill('#rej-entity', 'tool-job:1');
    await page.selectOption('#rej-reason', 'stale-fence');
    await page.click('#rej-search');
    await page.waitForFunction(() => document.querySelectorAll('#rej-table tbody tr').length === 2);
    const rows = await page.$$eval('#rej-table tbody tr', (trs: HTMLTableRowElement[]) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    expect(rows.map((r: string[]) => [r[2], r[3], r[4], r[5], r[6], r[7]])).toEqual([
      ['stale-fence', 'tool-job:1', '5', '7', 'late-2', 'billing'],
      ['stale-fence', 'tool-job:1', '2', '7', 'late-1', 'billing'],
    ]);

    // An entity and its fence history.
    await page.fill('#ent-input', 'tool-job:1');
    await page.click('#ent-go');
    await page.waitForSelector('#ent-info:not([hidden])');
    expect(await page.textContent('#ent-fence')).toBe('8');
    const history = await page.$$eval('#ent-history tbody tr td:first-child', (tds: HTMLElement[]) => tds.map((td) => td.textContent));
    expect(history).toEqual(['8', '7', '3', '1']);

    // The record waiting for an operator; the audit scope cannot resolve it.
    await page.waitForSelector('#unk-table button.resolve[data-key="pay-42"]');
    await page.click('#unk-table button.resolve[data-key="pay-42"]');
    await page.selectOption('#res-outcome', 'released');
    await page.click('#res-submit');
    await page.waitForFunction(() => /^403/.test(document.getElementById('status')!.textContent ?? ''));

    // Sign in again as an operator with the admin scope and settle it as completed.
    await page.fill('#token', await token({ sub: 'ops-alice', scope: 'fencegate:admin' }));
    await page.click('#sign-in');
    await page.waitForFunction(() => document.getElementById('whoami')!.textContent === 'signed in as ops-alice (fencegate:admin)');
    await page.waitForSelector('#unk-table button.resolve[data-key="pay-42"]');
    await page.click('#unk-table button.resolve[data-key="pay-42"]');
    await page.selectOption('#res-outcome', 'completed');
    await page.fill('#res-status', '201');
    await page.fill('#res-body', '{"id":"ch_42","status":"succeeded"}');
    await page.fill('#res-note', 'found ch_42 in the provider dashboard');
    mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(SCREENSHOTS, 'console-resolve-form.png'), fullPage: true });
    await page.click('#res-submit');
    await page.waitForFunction(() => /^resolved pay-42 as completed by ops-alice$/.test(document.getElementById('status')!.textContent ?? ''));
    await page.waitForSelector('#unk-empty:not([hidden])');
    await page.screenshot({ path: join(SCREENSHOTS, 'console.png'), fullPage: true });

    // The token lives in sessionStorage only; a reload keeps the session.
    expect(await page.evaluate(() => Object.keys(sessionStorage))).toEqual(['fencegate.token']);
    expect(await page.evaluate(() => Object.keys(localStorage))).toEqual([]);
    await page.reload();
    await page.waitForSelector('body[data-ready="true"]');
    expect(await page.textContent('#whoami')).toBe('signed in as ops-alice (fencegate:admin)');
    await page.click('#sign-out');
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
    expect(problems).toEqual([]);

    // What the operator did holds outside the browser: the retry replays the confirmed answer.
    const retry = await command(gw.url, '/payments/charges', { fence: 8, entity: 'tool-job:1', key: 'pay-42', headers: bearer(await token({ sub: 'billing' })) });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(await retry.text()).toBe('{"id":"ch_42","status":"succeeded"}');
    expect(up.effects).toBe(5);
    const actions = (await (await fetch(`${gw.url}/_fencegate/v1/operator-actions`, { headers: bearer(await token({ scope: 'fencegate:audit' })) })).json()) as any;
    expect(actions.items).toMatchObject([{ action: 'resolve-completed', key: 'pay-42', operator: 'ops-alice', note: 'found ch_42 in the provider dashboard', status: 201 }]);
    expect(existsSync(join(SCREENSHOTS, 'console.png'))).toBe(true);
  });
});
