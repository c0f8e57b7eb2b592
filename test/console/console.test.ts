import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { bearer, hsAuth, token } from '../auth/tokens.js';
import { launchBrowser, skipReason, type Browser } from './browser.js';

// The operator console (docs/auth-audit.md) with caller auth on, end to end in
// headless Chromium: nothing is asked of the API before sign-in (so nothing
// is written to the audit log by opening the page), then sign in with a
// token, filter rejections, an entity's fence history, resolve an
// outcome_unknown record, and see it in the operator-action log.

// Browser globals, only ever used inside page.evaluate / waitForFunction callbacks.
declare const document: any;
declare const window: any;
declare const sessionStorage: any;
declare const localStorage: any;
type HTMLTableRowElement = any;
type HTMLElement = any;
const sleepMs = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.skipIf(skipReason !== null)('console in headless Chromium, with caller auth', () => {
  let up: FakeUpstream;
  let gw: TestGateway;
  let browser: Browser;
  const XSS = '<img src=x onerror="window.__xss=1">';
  const rowCount = async () => (await gw.sqlite.listRejections({ limit: 1000 })).items.length;

  beforeAll(async () => {
    up = await startUpstream();
    gw = await startTestGateway({ routes: [paymentsRoute(up.url)], config: { auth: hsAuth() } });
    const worker = bearer(await token({ sub: 'billing' }));
    const send = (fence: number, entity: string, key: string) => command(gw.url, '/payments/charges', { fence, entity, key, headers: worker });
    for (const [f, k] of [
      [1, 'a'],
      [3, 'b'],
      [7, 'c'],
    ] as const)
      expect((await send(f, 'tool-job:1', k)).status).toBe(201);
    await expectProblem(await send(2, 'tool-job:1', 'late-1'), 409, 'stale-fence');
    await expectProblem(await send(5, 'tool-job:1', 'late-2'), 409, 'stale-fence');
    expect((await send(4, 'tool-job:2', 'd')).status).toBe(201);
    await expectProblem(await send(1, 'tool-job:2', 'late-3'), 409, 'stale-fence');
    // An entity chosen by a hostile caller: the console must show it as text.
    await gw.sqlite.recordRejection({
      reason: 'stale-fence',
      entity: XSS,
      presentedFence: 1n,
      currentFence: 2n,
      idempotencyKey: XSS,
      audit: { requestId: 'r', clientRequestId: null, caller: 'mallory', method: 'POST', path: '/payments/x', payloadSha256: 'ab'.repeat(32) },
    });
    // An outcome_unknown record: the upstream resets the connection after reading the request.
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await send(8, 'tool-job:1', 'pay-42'), 504, 'upstream-timeout');
    up.behave(null);
    browser = await launchBrowser();
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await gw?.close();
    await up?.close();
  });

  it('opening the page before sign-in calls no API and writes no audit row; the page told to call anyway writes three', { timeout: 60_000 }, async () => {
    const open = async (rewrite: boolean) => {
      const { page, problems } = await browser.page();
      const requests: string[] = [];
      page.on('request', (r: any) => requests.push(new URL(r.url()).pathname));
      // Negative control: the same page, told that the API needs no token (the page as it was before the mode hint).
      if (rewrite) {
        await page.route(`${gw.url}/_fencegate/`, async (route: any) => {
          const res = await route.fetch();
          await route.fulfill({ response: res, body: (await res.text()).replace('<body data-auth="auth">', '<body data-auth="open">') });
        });
      }
      const before = await rowCount();
      const res = await page.goto(`${gw.url}/_fencegate/`);
      expect(res.status()).toBe(200);
      await page.waitForSelector('body[data-loaded="true"]');
      await page.waitForLoadState('networkidle');
      const who = await page.textContent('#whoami');
      let said = '';
      if (!rewrite) {
        // Buttons before sign-in ask for it instead of calling the API.
        await page.fill('#ent-input', 'tool-job:1');
        for (const button of ['#rej-search', '#rej-csv', '#rej-ndjson', '#ent-go', '#unk-refresh', '#act-refresh']) await page.click(button);
        said = (await page.textContent('#status')) ?? '';
        await page.waitForLoadState('networkidle');
      }
      await page.close();
      return { requests, written: (await rowCount()) - before, who, said, problems };
    };

    const quiet = await open(false);
    expect(quiet.who).toBe('not signed in');
    expect(quiet.said).toBe('sign in with a token first');
    expect(quiet.requests).toEqual(['/_fencegate/']);
    expect(quiet.written).toBe(0);
    expect(quiet.problems).toEqual([]);

    const noisy = await open(true);
    expect(noisy.requests.filter((p) => p.includes('/v1/')).sort()).toEqual([
      '/_fencegate/v1/idempotency',
      '/_fencegate/v1/operator-actions',
      '/_fencegate/v1/rejections',
    ]);
    // The three audit rows are written after the page went idle; a stalled disk may take seconds.
    await expect.poll(async () => (await gw.sqlite.listRejections({ limit: 1000, reason: 'unauthorized' })).items.length, { timeout: 10_000 }).toBe(3);
  });

  it('sign-in checks the token with one request: a refused token is said so, leaves the operator signed out and writes one audit row', {
    timeout: 60_000,
  }, async () => {
    const reasons = async () =>
      (await gw.sqlite.listRejections({ limit: 1000 })).items.filter((r) => r.reason === 'unauthorized' || r.reason === 'forbidden').map((r) => r.reason);
    const { page, problems } = await browser.page();
    const requests: string[] = [];
    page.on('request', (r: any) => new URL(r.url()).pathname.includes('/v1/') && requests.push(new URL(r.url()).pathname));
    await page.goto(`${gw.url}/_fencegate/`);
    await page.waitForSelector('body[data-loaded="true"]');
    const signIn = async (t: string) => {
      requests.length = 0;
      const before = await reasons();
      await page.fill('#token', t);
      await page.click('#sign-in');
      await page.waitForFunction(() => /^token refused: /.test(document.getElementById('status')!.textContent ?? ''));
      await page.waitForLoadState('networkidle');
      // The row is written after the answer; a stalled disk may take a moment.
      await expect.poll(async () => (await reasons()).length, { timeout: 10_000 }).toBe(before.length + 1);
      await sleepMs(300);
      const after = await reasons();
      return {
        said: await page.textContent('#status'),
        who: await page.textContent('#whoami'),
        stored: await page.evaluate(() => sessionStorage.length),
        requests: [...requests],
        written: after.slice(0, after.length - before.length),
      };
    };
    // Not a token at all.
    const garbage = await signIn('garbage');
    expect(garbage.said).toMatch(/^token refused: Authentication required: ./);
    expect(garbage).toMatchObject({ who: 'not signed in', stored: 0, requests: ['/_fencegate/v1/operator-actions'], written: ['unauthorized'] });
    // Readable, but expired: refused the same way (it was once "signed in as ..." beside a 401).
    const expired = await signIn(await token({ sub: 'ops-old', scope: 'fencegate:audit', expIn: -600 }));
    expect(expired.said).toMatch(/^token refused: Authentication required: ./);
    expect(expired).toMatchObject({ who: 'not signed in', stored: 0, requests: ['/_fencegate/v1/operator-actions'], written: ['unauthorized'] });
    // Valid, without the audit scope: forbidden, and signed out too.
    const worker = await signIn(await token({ sub: 'billing' }));
    expect(worker.said).toMatch(/^token refused: Not allowed: ./);
    expect(worker).toMatchObject({ who: 'not signed in', stored: 0, requests: ['/_fencegate/v1/operator-actions'], written: ['forbidden'] });
    // Buttons still ask for a sign-in.
    await page.click('#rej-search');
    expect(await page.textContent('#status')).toBe('sign in with a token first');
    // A good token: signed in after the one check, then the views load.
    requests.length = 0;
    await page.fill('#token', await token({ sub: 'auditor-eve', scope: 'fencegate:audit' }));
    await page.click('#sign-in');
    await page.waitForFunction(() => document.getElementById('whoami')!.textContent === 'signed in as auditor-eve (fencegate:audit)');
    await page.waitForLoadState('networkidle');
    expect(requests[0]).toBe('/_fencegate/v1/operator-actions');
    expect([...new Set(requests)].sort()).toEqual(['/_fencegate/v1/idempotency', '/_fencegate/v1/operator-actions', '/_fencegate/v1/rejections']);
    expect(problems).toEqual([]);

    // Negative control: a garbage token taken as it was (stored without the check) writes a row for each view.
    const before = (await reasons()).length;
    await page.click('#sign-out');
    await page.evaluate(() => sessionStorage.setItem('fencegate.token', 'garbage'));
    await page.reload();
    await page.waitForSelector('body[data-loaded="true"]');
    expect(await page.textContent('#whoami')).toBe('signed in (token not readable here)');
    await expect.poll(async () => (await reasons()).length - before, { timeout: 10_000 }).toBe(3);
    await page.close();
  });

  it('`<adminPrefix>` sends the browser on to `<adminPrefix>/`, where the console is', { timeout: 30_000 }, async () => {
    const res = await fetch(`${gw.url}/_fencegate`, { redirect: 'manual' });
    expect(res.status).toBe(308);
    expect(res.headers.get('location')).toBe('/_fencegate/');
    const { page } = await browser.page();
    expect((await page.goto(`${gw.url}/_fencegate`)).status()).toBe(200);
    expect(page.url()).toBe(`${gw.url}/_fencegate/`);
    await page.waitForSelector('body[data-ready="true"]');
    await page.close();
    // Other paths under the prefix are still the admin API's 404.
    expect((await fetch(`${gw.url}/_fencegate/nothing/`)).status).toBe(404);
    expect((await fetch(`${gw.url}/_fencegate/`, { method: 'POST' })).status).toBe(404);
  });

  it('signs in, filters rejections, shows fence history, resolves an outcome_unknown record and lists the action', { timeout: 120_000 }, async () => {
    const { page, problems } = await browser.page();
    const res = await page.goto(`${gw.url}/_fencegate/console`);
    expect(res.status()).toBe(200);
    expect(res.headers()['content-security-policy']).toMatch(/script-src 'sha256-/);
    await page.waitForSelector('body[data-ready="true"]');
    expect(await page.textContent('#whoami')).toBe('not signed in');
    const unauthorizedBefore = (await gw.sqlite.listRejections({ limit: 1000, reason: 'unauthorized' })).items.length;

    // A token with the audit scope only: reads work, resolving will be refused.
    await page.fill('#token', await token({ sub: 'auditor-bob', scope: 'fencegate:audit' }));
    await page.click('#sign-in');
    await page.selectOption('#rej-reason', 'stale-fence');
    await page.click('#rej-search');
    await page.waitForFunction(() => document.querySelectorAll('#rej-table tbody tr').length === 4);
    expect(await page.textContent('#whoami')).toBe('signed in as auditor-bob (fencegate:audit)');
    // The hostile entity is text, not markup.
    expect(await page.evaluate(() => (window as any).__xss)).toBeUndefined();
    expect(await page.locator('#rej-table tbody tr', { hasText: XSS }).count()).toBe(1);
    expect(await page.locator('#rej-table img').count()).toBe(0);

    // Filter: entity and reason (both taken by the API).
    await page.fill('#rej-entity', 'tool-job:1');
    await page.click('#rej-search');
    await page.waitForFunction(() => document.querySelectorAll('#rej-table tbody tr').length === 2);
    const rows = await page.$$eval('#rej-table tbody tr', (trs: HTMLTableRowElement[]) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
    expect(rows.map((r: string[]) => [r[2], r[3], r[4], r[5], r[6], r[7], r[8]])).toEqual([
      ['stale-fence', 'tool-job:1', '5', '7', 'late-2', 'billing', 'POST /payments/charges'],
      ['stale-fence', 'tool-job:1', '2', '7', 'late-1', 'billing', 'POST /payments/charges'],
    ]);

    // An entity: its current fence, its history as a timeline and a table.
    await page.fill('#ent-input', 'tool-job:1');
    await page.click('#ent-go');
    await page.waitForSelector('#ent-info:not([hidden])');
    expect(await page.textContent('#ent-fence')).toBe('8');
    expect(await page.textContent('#ent-inflight')).toBe('no');
    const history = await page.$$eval('#ent-history tbody tr td:first-child', (tds: HTMLElement[]) => tds.map((td) => td.textContent));
    expect(history).toEqual(['8', '7', '3', '1']);
    expect(await page.$$eval('#ent-timeline circle', (cs: HTMLElement[]) => cs.map((c) => c.getAttribute('data-fence')).sort())).toEqual(['1', '3', '7', '8']);

    // The record waiting for an operator; the audit scope cannot resolve it.
    await page.waitForSelector('#unk-table button.resolve[data-key="pay-42"]');
    await page.click('#unk-table button.resolve[data-key="pay-42"]');
    await page.selectOption('#res-outcome', 'released');
    await page.click('#res-submit');
    await page.click('#res-confirm-yes');
    await page.waitForFunction(() => /^403/.test(document.getElementById('status')!.textContent ?? ''));
    // Refused: back to the form, the question closed.
    expect(await page.isVisible('#res-confirm')).toBe(false);
    expect(await page.isVisible('#resolve-form')).toBe(true);

    // Sign in again as an operator with the admin scope and settle it as completed.
    await page.fill('#token', await token({ sub: 'ops-alice', scope: 'fencegate:admin fencegate:audit' }));
    await page.click('#sign-in');
    await page.waitForFunction(() => document.getElementById('whoami')!.textContent === 'signed in as ops-alice (fencegate:admin fencegate:audit)');
    await page.waitForSelector('#unk-table button.resolve[data-key="pay-42"]');
    await page.click('#unk-table button.resolve[data-key="pay-42"]');
    await page.selectOption('#res-outcome', 'completed');
    await page.fill('#res-status', '201');
    await page.fill('#res-body', '{"id":"ch_42","status":"succeeded"}');
    await page.fill('#res-note', 'found ch_42 in the provider dashboard');
    const formShot = await browser.screenshot(page, 'auth-resolve-form');
    await page.click('#res-submit');
    await page.waitForSelector('#res-confirm:not([hidden])');
    const what = await page.$$eval('#res-what dd', (dds: HTMLElement[]) =>
      Object.fromEntries(dds.map((dd) => [dd.getAttribute('data-field'), dd.textContent])),
    );
    expect(what).toMatchObject({ key: 'pay-42', scope: 'payments / billing', status: '201' });
    expect(what.outcome).toMatch(/^completed: /);
    await page.click('#res-confirm-yes');
    await page.waitForFunction(() => /^resolved pay-42 as completed by ops-alice$/.test(document.getElementById('status')!.textContent ?? ''));
    await page.waitForSelector('#unk-empty:not([hidden])');
    // The operator-action log shows it at once.
    const action = await page.$$eval('#act-table tbody tr:first-child td', (tds: HTMLElement[]) => tds.map((td) => td.textContent));
    expect(action.slice(1, 8)).toEqual(['resolve-completed', 'pay-42', 'tool-job:1', '8', '201', 'ops-alice', 'found ch_42 in the provider dashboard']);
    const doneShot = await browser.screenshot(page, 'auth-resolved');

    // The token lives in sessionStorage only; a reload keeps the session.
    expect(await page.evaluate(() => Object.keys(sessionStorage))).toEqual(['fencegate.token']);
    expect(await page.evaluate(() => Object.keys(localStorage))).toEqual([]);
    await page.reload();
    await page.waitForSelector('body[data-ready="true"]');
    expect(await page.textContent('#whoami')).toBe('signed in as ops-alice (fencegate:admin fencegate:audit)');
    await page.click('#sign-out');
    expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
    expect(problems).toEqual([]);
    // Signed in, the page's calls carried valid tokens: no unauthorized row came of them.
    expect((await gw.sqlite.listRejections({ limit: 1000, reason: 'unauthorized' })).items.length).toBe(unauthorizedBefore);

    // What the operator did holds outside the browser: the retry replays the confirmed answer.
    const retry = await command(gw.url, '/payments/charges', {
      fence: 8,
      entity: 'tool-job:1',
      key: 'pay-42',
      headers: bearer(await token({ sub: 'billing' })),
    });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(await retry.text()).toBe('{"id":"ch_42","status":"succeeded"}');
    expect(up.effects).toBe(5);
    const actions = (await (
      await fetch(`${gw.url}/_fencegate/v1/operator-actions`, { headers: bearer(await token({ scope: 'fencegate:audit' })) })
    ).json()) as any;
    expect(actions.items).toMatchObject([
      { action: 'resolve-completed', key: 'pay-42', operator: 'ops-alice', note: 'found ch_42 in the provider dashboard', status: 201 },
    ]);
    expect(existsSync(formShot) && existsSync(doneShot)).toBe(true);
  });
});
