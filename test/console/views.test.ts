import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { command, expectProblem, paymentsRoute, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { startUpstream, type FakeUpstream } from '../helpers/upstream.js';
import { launchBrowser, skipReason, type Browser } from './browser.js';

// The console's views in headless Chromium, on a loopback gateway without
// caller auth (no sign-in): the refusals chart, counts, search, export, the
// entity view with an in-flight request, and resolving a record.

// Browser globals, only ever used inside page.evaluate / waitForFunction callbacks.
declare const document: any;
declare const getComputedStyle: any;
type HTMLElement = any;

const HOUR = 3_600_000;

describe.skipIf(skipReason !== null)('console views in headless Chromium, loopback without auth', () => {
  let up: FakeUpstream;
  let gw: TestGateway;
  let browser: Browser;
  let page: any;
  let problems: string[];
  let all: any[];

  /** The rejection log as the audit API shows it, newest first. */
  const log = async (query = '') => (await gw.admin(`/v1/rejections?limit=1000${query}`)).body.items as any[];
  const shownIds = () => page.$$eval('#rej-table tbody tr', (trs: HTMLElement[]) => trs.map((tr) => Number(tr.getAttribute('data-id'))));
  const ids = (rows: any[]) => rows.map((r) => Number(r.id));
  const search = async (fields: Record<string, string>) => {
    for (const id of ['rej-entity', 'rej-caller', 'rej-key', 'rej-request', 'rej-route']) await page.fill(`#${id}`, fields[id] ?? '');
    await page.selectOption('#rej-reason', fields['rej-reason'] ?? '');
    await searchNow();
  };
  /** Clicks Search and waits for that load to finish. */
  const searchNow = async () => {
    const loads = Number(await page.getAttribute('#rej-count', 'data-loads'));
    await page.click('#rej-search');
    await page.waitForFunction((n: number) => Number(document.getElementById('rej-count').getAttribute('data-loads')) > n, loads);
  };

  beforeAll(async () => {
    up = await startUpstream();
    gw = await startTestGateway({
      routes: [paymentsRoute(up.url), paymentsRoute(up.url, { name: 'refunds', match: { path: '/refunds/*', methods: ['POST'] } })],
    });
    const send = (path: string, fence: number, entity: string, key: string, extra: Record<string, unknown> = {}) =>
      command(gw.url, path, { fence, entity, key, ...extra });
    expect((await send('/payments/charges', 5, 'job:1', 'k-1')).status).toBe(201);
    expect((await send('/refunds/r', 9, 'job:2', 'k-2')).status).toBe(201);
    await expectProblem(await send('/payments/charges', 4, 'job:1', 'late-a', { headers: { 'x-request-id': 'client-req-77' } }), 409, 'stale-fence');
    await expectProblem(await send('/payments/charges', 3, 'job:1', 'late-b'), 409, 'stale-fence');
    await expectProblem(await send('/refunds/r', 2, 'job:2', 'late-c'), 409, 'stale-fence');
    // The same key with another body: reused.
    await expectProblem(await send('/payments/charges', 5, 'job:1', 'k-1', { body: '{"amount":1}' }), 422, 'idempotency-key-reused');
    await expectProblem(await send('/refunds/r', 9, 'job:2', 'k-2', { body: '{"amount":1}' }), 422, 'idempotency-key-reused');
    await gw.sqlite.recordRejection({
      reason: 'fence-expired',
      entity: 'job:3',
      presentedFence: 1n,
      currentFence: null,
      idempotencyKey: 'k-old',
      detail: 'the fence expired some while before this request arrived at the gateway',
      audit: {
        requestId: 'req-expired-1',
        clientRequestId: null,
        caller: 'carol',
        method: 'POST',
        path: '/payments/charges/with/a/rather/long/path',
        payloadSha256: 'cd'.repeat(32),
      },
    });
    // Two rows from three hours ago: outside the 1 h window, inside 6 h.
    gw.sqlite.db.prepare('UPDATE rejections SET at = at - 3 * ? WHERE id IN (1, 4)').run(HOUR);
    all = await log();
    expect(all.length).toBe(6);
    // An outcome_unknown record for the resolve form.
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await send('/refunds/r', 10, 'job:2', 'pay-9'), 504, 'upstream-timeout');
    up.behave(null);

    browser = await launchBrowser();
    ({ page, problems } = await browser.page());
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await gw?.close();
    await up?.close();
  });

  it('works without sign-in and says why', { timeout: 60_000 }, async () => {
    const requests: string[] = [];
    page.on('request', (r: any) => requests.push(new URL(r.url()).pathname));
    await page.goto(`${gw.url}/_fencegate/`);
    await page.waitForSelector('body[data-loaded="true"]');
    expect(await page.textContent('#whoami')).toBe('no auth configured: loopback only');
    expect(await page.isVisible('#signin')).toBe(false);
    expect(requests.filter((p) => p.includes('/v1/')).sort()).toEqual([
      '/_fencegate/v1/idempotency',
      '/_fencegate/v1/operator-actions',
      '/_fencegate/v1/rejections',
    ]);
    // The default window (24 h) holds every row.
    expect((await shownIds()).sort()).toEqual(ids(all).sort());
    expect(problems).toEqual([]);
  });

  it('charts refusals by reason over the chosen window, with counts that match the log', { timeout: 60_000 }, async () => {
    const chartTotals = () =>
      page.$$eval('#chart svg rect[data-reason]', (rs: HTMLElement[]) => {
        const t: Record<string, number> = {};
        for (const r of rs) t[r.getAttribute('data-reason')] = (t[r.getAttribute('data-reason')] ?? 0) + Number(r.getAttribute('data-count'));
        return t;
      });
    const byReason = (rows: any[]) => rows.reduce((t: Record<string, number>, r) => ((t[r.reason] = (t[r.reason] ?? 0) + 1), t), {});
    const recent = await log('&since=1h');
    expect(recent.length).toBe(4);
    for (const [window, rows] of [
      ['1h', recent],
      ['6h', all],
    ] as const) {
      await page.selectOption('#rej-window', window);
      await searchNow();
      expect((await shownIds()).sort()).toEqual(ids(rows).sort());
      expect(await chartTotals()).toEqual(byReason(rows));
      const legend = await page.$$eval('#chart .legend [data-reason]', (s: HTMLElement[]) =>
        Object.fromEntries(s.map((e) => [e.getAttribute('data-reason'), Number(e.getAttribute('data-total'))])),
      );
      expect(legend).toEqual(byReason(rows));
      const counts = await page.$$eval('#count-reason tbody tr', (trs: HTMLElement[]) =>
        Object.fromEntries(trs.map((tr) => [tr.cells[0].textContent, Number(tr.cells[1].textContent)])),
      );
      expect(counts).toEqual(byReason(rows));
    }
    // 6 h: the two old rows sit in the first bars, the rest in the last.
    const bars = await page.$$eval('#chart svg rect[data-reason]', (rs: HTMLElement[]) => rs.map((r) => Number(r.getAttribute('x'))));
    expect(Math.min(...bars)).toBeLessThan(500);
    expect(Math.max(...bars)).toBeGreaterThan(900);
    const callers = await page.$$eval('#count-caller tbody tr', (trs: HTMLElement[]) => trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent]));
    expect(callers).toEqual([
      ['(anonymous)', '5'],
      ['carol', '1'],
    ]);
    const routes = await page.$$eval('#count-route tbody tr', (trs: HTMLElement[]) => trs.map((tr) => [tr.cells[0].textContent, tr.cells[1].textContent]));
    expect(routes).toEqual([
      ['POST /payments/charges', '3'],
      ['POST /refunds/r', '2'],
      ['POST /payments/charges/with/a/rather/long/path', '1'],
    ]);
    await browser.screenshot(page, 'open-chart-6h');
  });

  it('searches by entity, key, request id, route, caller and reason', { timeout: 60_000 }, async () => {
    const cases: [Record<string, string>, (r: any) => boolean][] = [
      [{ 'rej-entity': 'job:2' }, (r) => r.entity === 'job:2'],
      [{ 'rej-reason': 'idempotency-key-reused' }, (r) => r.reason === 'idempotency-key-reused'],
      [{ 'rej-caller': 'carol' }, (r) => r.caller === 'carol'],
      [{ 'rej-key': 'late-' }, (r) => (r.idempotency_key ?? '').includes('late-')],
      // The caller's X-Request-Id, and the gateway's own id of another row.
      [{ 'rej-request': 'client-req-77' }, (r) => r.client_request_id === 'client-req-77'],
      [
        { 'rej-request': all.find((r) => r.reason === 'idempotency-key-reused').request_id },
        (r) => r.request_id === all.find((x) => x.reason === 'idempotency-key-reused').request_id,
      ],
      [{ 'rej-route': '/refunds/' }, (r) => r.path.startsWith('/refunds/')],
      // Server-side and browser-side filters together.
      [{ 'rej-entity': 'job:1', 'rej-key': 'late-b' }, (r) => r.entity === 'job:1' && r.idempotency_key === 'late-b'],
    ];
    for (const [fields, keep] of cases) {
      await search(fields);
      const expected = ids(all.filter(keep));
      expect(expected.length, JSON.stringify(fields)).toBeGreaterThan(0);
      expect(expected.length, JSON.stringify(fields)).toBeLessThan(all.length);
      expect(await shownIds(), JSON.stringify(fields)).toEqual(expected);
    }
    // A row's details show every field in full, the payload digest and request id included.
    await search({ 'rej-caller': 'carol' });
    await page.click('#rej-table tbody tr');
    expect(await page.textContent('#rej-detail dd[data-field="payload_sha256"]')).toBe('cd'.repeat(32));
    expect(await page.textContent('#rej-detail dd[data-field="request_id"]')).toBe('req-expired-1');
    await browser.screenshot(page, 'open-search-detail');
  });

  it('exports the current filter as CSV and NDJSON (the download is the API export, narrowed by the browser-side filters)', { timeout: 60_000 }, async () => {
    const download = async (button: string) => {
      const [d] = await Promise.all([page.waitForEvent('download'), page.click(button)]);
      return { name: d.suggestedFilename() as string, text: readFileSync(await d.path(), 'utf8') };
    };
    // API-side filters only: the files are exactly the API's exports.
    await search({ 'rej-entity': 'job:1' });
    const csv = await download('#rej-csv');
    expect(csv.name).toMatch(/^fencegate-rejections-.*\.csv$/);
    expect(csv.text).toBe(await (await fetch(`${gw.url}/_fencegate/v1/rejections?since=6h&entity=job%3A1&format=csv`)).text());
    expect(csv.text.split('\r\n')[0]).toContain('payload_sha256,request_id');
    const nd = await download('#rej-ndjson');
    expect(
      nd.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).id),
    ).toEqual(all.filter((r) => r.entity === 'job:1').map((r) => r.id));
    // A browser-side filter (key) too: only the rows the table shows.
    await search({ 'rej-entity': 'job:1', 'rej-key': 'late-' });
    const shown = (await shownIds()).map(String);
    expect(shown.length).toBe(2);
    const nd2 = await download('#rej-ndjson');
    expect(
      nd2.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).id),
    ).toEqual(shown);
    const csv2 = (await download('#rej-csv')).text.split('\r\n');
    expect(csv2[0]).toBe(csv.text.split('\r\n')[0]);
    expect(csv2.slice(1, -1).map((l) => l.split(',')[0])).toEqual(shown);
    expect(csv2.at(-1)).toBe('');
  });

  it('keeps table cells on one line at 1400 px (no word broken mid-way)', { timeout: 30_000 }, async () => {
    await search({});
    const broken = await page.$$eval('#rej-table td, #rej-table th, #count-route td', (cells: HTMLElement[]) =>
      cells
        .filter((c) => {
          if (c.textContent === '') return false;
          const range = document.createRange();
          range.selectNodeContents(c);
          const lines = new Set([...range.getClientRects()].map((r: any) => Math.round(r.top)));
          return lines.size > 1;
        })
        .map((c) => c.textContent),
    );
    expect(broken).toEqual([]);
    // And the table fits the page: no column pushed out of sight.
    expect(await page.$eval('#rejections .scroll', (d: HTMLElement) => d.scrollWidth - d.clientWidth)).toBeLessThanOrEqual(0);
    // Negative control: the old rule (break-all) in a narrow cell does break the digest.
    const wraps = await page.evaluate(() => {
      const td = document.querySelector('#rej-table tbody tr td.mono');
      td.style.whiteSpace = 'normal';
      td.style.wordBreak = 'break-all';
      // A table cell's max-width does not bind; a block's width does.
      td.style.display = 'block';
      td.style.width = '6rem';
      const range = document.createRange();
      range.selectNodeContents(td);
      const lines = new Set([...range.getClientRects()].map((r: any) => Math.round(r.top))).size;
      td.removeAttribute('style');
      return lines;
    });
    expect(wraps).toBeGreaterThan(1);
  });

  it('fits the refusals table into 1280 px: no horizontal scrolling, long values cut with an ellipsis and whole on hover', { timeout: 30_000 }, async () => {
    await page.setViewportSize({ width: 1280, height: 800 });
    try {
      await search({});
      const overflow = () =>
        page.evaluate(() => {
          const table = document.getElementById('rej-table');
          const box = document.querySelector('#rejections .scroll');
          const right = box.getBoundingClientRect().right;
          return {
            page: document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth,
            box: box.scrollWidth - box.clientWidth,
            // Every column header, the last (detail) included, within the section.
            outside: [...table.tHead.rows[0].cells].filter((th: any) => th.getBoundingClientRect().right > right + 0.5).map((th: any) => th.textContent),
            // The three count tables each within their third of the width (a long route does not push into the next).
            counts: [...document.querySelectorAll('.counts table')]
              .filter((t: any, i: number, ts: any[]) => i + 1 < ts.length && t.getBoundingClientRect().right > ts[i + 1].getBoundingClientRect().left)
              .map((t: any) => t.id),
          };
        });
      expect(await overflow()).toEqual({ page: 0, box: 0, outside: [], counts: [] });
      // Cut cells end in an ellipsis and carry their whole text as a tooltip.
      const cut = await page.$$eval('#rej-table tbody td', (tds: HTMLElement[]) =>
        tds
          .filter((td) => td.scrollWidth > td.clientWidth)
          .map((td) => ({ ellipsis: getComputedStyle(td).textOverflow, whole: td.title.startsWith(td.textContent.replace(/…$/, '')), text: td.textContent })),
      );
      expect(cut.length).toBeGreaterThan(0);
      for (const c of cut as { ellipsis: string; whole: boolean; text: string }[]) expect(c, c.text).toMatchObject({ ellipsis: 'ellipsis', whole: true });
      // The detail of the long row is cut in the table and whole in the row's details.
      const longRow = all.find((r) => r.reason === 'fence-expired');
      expect(cut.map((c: { text: string }) => c.text)).toContain(longRow.detail);
      await page.click(`#rej-table tbody tr[data-id="${longRow.id}"]`);
      expect(await page.textContent('#rej-detail dd[data-field="detail"]')).toBe(longRow.detail);
      expect(await page.textContent('#rej-detail dd[data-field="path"]')).toBe(longRow.path);
      await browser.screenshot(page, 'open-refusals-1280');
      // Negative control: the table laid out by its content, as it was, needs scrolling at 1280 px.
      await page.evaluate(() => {
        for (const t of document.querySelectorAll('#rej-table, .counts table')) t.style.tableLayout = 'auto';
      });
      const auto = await overflow();
      await page.evaluate(() => {
        for (const t of document.querySelectorAll('#rej-table, .counts table')) t.removeAttribute('style');
      });
      expect(auto.box).toBeGreaterThan(0);
      expect(auto.outside.length).toBeGreaterThan(0);
      expect(auto.counts).toEqual(['count-route']);
    } finally {
      await page.setViewportSize({ width: 1400, height: 1000 });
    }
  });

  it("shows an entity's story: accepted at is when its fence was accepted, then its refusals and outcome-unknown records in time order", {
    timeout: 60_000,
  }, async () => {
    // The operator's case: a retry of the unknown request at job:2's current fence, refused after the fence was accepted.
    await expectProblem(await command(gw.url, '/refunds/r', { fence: 10, entity: 'job:2', key: 'pay-9' }), 409, 'outcome-unknown');
    for (const entity of ['job:1', 'job:2']) {
      const e = (await gw.admin(`/v1/entities/${encodeURIComponent(entity)}`)).body;
      const refusals = await log(`&entity=${encodeURIComponent(entity)}`);
      const unknown = ((await gw.admin('/v1/idempotency?state=outcome_unknown')).body.items as any[]).filter((r) => r.entity === entity);
      const commands = (await gw.admin(`/v1/commands?limit=1000&entity=${encodeURIComponent(entity)}`)).body.items as any[];
      await page.fill('#ent-input', entity);
      await page.click('#ent-go');
      await page.waitForFunction(
        (name: string) => document.getElementById('ent-name').textContent === name && !document.getElementById('ent-info').hidden,
        entity,
      );
      // The time the current fence was accepted (its history row), not the time of a refused retry at that fence.
      const accepted = e.history.find((h: any) => h.fence === e.fence).at;
      expect(await page.textContent('#ent-accepted')).toBe(accepted);
      const retried = refusals.filter((r) => r.presented_fence === e.fence && Date.parse(r.at) > Date.parse(accepted));
      expect(retried.map((r) => r.reason)).toEqual(entity === 'job:2' ? ['outcome-unknown'] : []);
      // The store agrees: a refused retry did not move accepted_at.
      expect(e.accepted_at).toBe(accepted);
      expect(await page.isVisible('#ent-last-row')).toBe(false);
      // Every command, fence, refusal and unknown record of the entity, oldest first.
      const expected = [
        ...commands.map((c: any) => ({ at: c.at, kind: 'command' })),
        ...e.history.map((h: any) => ({ at: h.at, kind: 'fence' })),
        ...refusals.map((r) => ({ at: r.at, kind: 'refusal' })),
        ...unknown.map((r) => ({ at: r.created_at, kind: 'unknown' })),
      ].sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
      const shown = await page.$$eval('#ent-story tbody tr', (trs: HTMLElement[]) =>
        trs.map((tr) => ({ at: tr.cells[0].textContent, kind: tr.getAttribute('data-kind') })),
      );
      expect(shown).toEqual(expected);
      expect(shown.filter((r: any) => r.kind === 'refusal')).toHaveLength(refusals.length);
      // Each refusal is marked on the timeline too.
      expect((await page.$$eval('#ent-timeline g[data-refusal]', (gs: HTMLElement[]) => gs.map((g) => g.getAttribute('data-refusal')))).sort()).toEqual(
        refusals.map((r) => r.id).sort(),
      );
    }
    // job:2's 504 is in its story, as the command it was, beside its unknown record.
    expect(await page.textContent('#ent-story tr[data-kind="command"][data-status="504"]')).toContain('outcome unknown: 504 upstream-timeout');
    // job:2's unknown record is in its story, with a way to resolve it.
    expect(await page.textContent('#ent-story tr[data-kind="unknown"]')).toContain('pay-9');
    await browser.screenshot(page, 'open-entity-story');
    await page.click('#ent-story button.resolve[data-key="pay-9"]');
    expect(await page.textContent('#res-key')).toBe('pay-9 (refunds)');
    await page.click('#res-cancel');
    expect(await page.isVisible('#resolve-form')).toBe(false);
    // An entity the gateway never accepted a fence for (a 404 from the API) still has its refusals.
    expect((await gw.admin('/v1/entities/job%3A3')).status).toBe(404);
    await page.fill('#ent-input', 'job:3');
    await page.click('#ent-go');
    await page.waitForFunction(() => document.getElementById('ent-name').textContent === 'job:3' && !document.getElementById('ent-info').hidden);
    expect(await page.textContent('#ent-fence')).toMatch(/^\(none: /);
    const story3 = await page.$$eval('#ent-story tbody tr', (trs: HTMLElement[]) => trs.map((tr) => [tr.getAttribute('data-kind'), tr.cells[1].textContent]));
    expect(story3).toEqual([['refusal', 'refused: fence-expired']]);
    // The browser logs the expected 404 of the entity as a failed resource; nothing else went wrong.
    expect(problems.splice(0)).toEqual([expect.stringMatching(/status of 404/)]);
  });

  it("the story is the entity's whole story: each command with the status its caller got (504 too) and what the reconciler settled", {
    timeout: 60_000,
  }, async () => {
    up.behave(() => ({ kind: 'reset' }));
    await expectProblem(await command(gw.url, '/payments/charges', { fence: 3, entity: 'job:4', key: 'lost-1' }), 504, 'upstream-timeout');
    up.behave(null);
    const resolved = await gw.sqlite.resolveRecord({
      scope: 'payments',
      key: 'lost-1',
      resolution: { outcome: 'released' },
      operator: 'reconciler',
      note: 'the status endpoint has no such charge',
      requestId: 'reconcile-1',
    });
    expect(resolved.ok).toBe(true);
    await page.fill('#ent-input', 'job:4');
    await page.click('#ent-go');
    await page.waitForFunction(() => document.getElementById('ent-name').textContent === 'job:4' && !document.getElementById('ent-info').hidden);
    const shown = await page.$$eval('#ent-story tbody tr', (trs: HTMLElement[]) =>
      trs.map((tr) => [tr.getAttribute('data-kind'), tr.getAttribute('data-status'), tr.cells[1].textContent, tr.cells[4].textContent]),
    );
    expect(shown).toEqual([
      ['fence', null, 'fence 3 accepted', ''],
      ['command', '504', 'outcome unknown: 504 upstream-timeout', 'payments'],
      ['reconciled', null, 'reconciled: released', 'reconciler'],
    ]);
  });

  it("accepted at: the current fence's history row even when the entity's accepted_at is later (negative control: the field as it was shown)", {
    timeout: 30_000,
  }, async () => {
    const e = (await gw.admin('/v1/entities/job%3A2')).body;
    const later = new Date(Date.parse(e.accepted_at) + 1234).toISOString();
    const url = `${gw.url}/_fencegate/v1/entities/job%3A2`;
    await page.route(url, async (route: any) => {
      const res = await route.fetch();
      await route.fulfill({ response: res, json: { ...(await res.json()), accepted_at: later } });
    });
    try {
      await page.fill('#ent-input', 'job:2');
      await page.click('#ent-go');
      await page.waitForFunction((t: string) => document.getElementById('ent-last').textContent === t, later);
      expect(await page.textContent('#ent-accepted')).toBe(e.history.find((h: any) => h.fence === e.fence).at);
      expect(await page.isVisible('#ent-last-row')).toBe(true);
      expect(await page.textContent('#ent-accepted')).not.toBe(later);
    } finally {
      await page.unroute(url);
    }
  });

  it('shows an entity: current fence, fence history as a timeline, and a request in flight', { timeout: 60_000 }, async () => {
    const gate = up.gate();
    up.behave(() => ({ kind: 'hold', gate: gate.promise }));
    const held = command(gw.url, '/payments/charges', { fence: 6, entity: 'job:1', key: 'k-held' });
    await up.waitFor(() => up.inflight === 1, 'the held request reaches the upstream');
    await page.fill('#ent-input', 'job:1');
    await page.click('#ent-go');
    await page.waitForSelector('#ent-info:not([hidden])');
    expect(await page.textContent('#ent-fence')).toBe('6');
    expect(await page.textContent('#ent-inflight')).toMatch(/^yes, until \d{4}-\d\d-\d\dT/);
    expect(await page.$$eval('#ent-timeline circle', (cs: HTMLElement[]) => cs.map((c) => c.getAttribute('data-fence')))).toEqual(['5', '6']);
    await browser.screenshot(page, 'open-entity-inflight');
    gate.open();
    up.behave(null);
    expect((await held).status).toBe(201);
  });

  it("lists an outcome_unknown record with its age and the status query's last answer", { timeout: 60_000 }, async () => {
    const cells = () => page.$eval('#unk-table tbody tr[data-key="pay-9"]', (tr: HTMLElement) => [...tr.cells].map((c: HTMLElement) => c.textContent));
    await page.click('#unk-refresh');
    await page.waitForSelector('#unk-table tbody tr[data-key="pay-9"]');
    const before = await cells();
    expect(before[5]).toMatch(/^\d+[smhd]$/);
    expect(before[6]).toBe('');
    const [rec] = await gw.sqlite.getRecords('pay-9');
    await gw.sqlite.noteReconcile({ scope: rec!.scope, key: 'pay-9', createdAt: rec!.createdAt, result: 'not-yet-trusted' });
    await page.click('#unk-refresh');
    await page.waitForFunction(() => /not-yet-trusted/.test(document.querySelector('#unk-table tbody tr[data-key="pay-9"]')?.textContent ?? ''));
    const after = await cells();
    expect(after.slice(0, 1)).toEqual(['pay-9']);
    expect(after[6]).toMatch(/^not-yet-trusted, \d+[smhd] ago$/);
  });

  it('resolves an outcome_unknown record as released without sign-in (operator anonymous)', { timeout: 60_000 }, async () => {
    await page.click('#unk-refresh');
    await page.waitForSelector('#unk-table button.resolve[data-key="pay-9"]');
    await page.click('#unk-table button.resolve[data-key="pay-9"]');
    await page.selectOption('#res-outcome', 'released');
    expect(await page.isVisible('#res-response')).toBe(false);
    await page.fill('#res-note', 'no refund at the provider');
    const posts: string[] = [];
    const onRequest = (r: any) => r.method() === 'POST' && posts.push(new URL(r.url()).pathname);
    page.on('request', onRequest);
    // Resolve asks first: what will be done, confirm or cancel; nothing is sent yet.
    await page.click('#res-submit');
    await page.waitForSelector('#res-confirm:not([hidden])');
    const what = await page.$$eval('#res-what dd', (dds: HTMLElement[]) =>
      Object.fromEntries(dds.map((dd) => [dd.getAttribute('data-field'), dd.textContent])),
    );
    expect(what).toMatchObject({ key: 'pay-9', scope: 'refunds', status: '(none: nothing is stored)', note: 'no refund at the provider' });
    expect(what.outcome).toMatch(/^released: /);
    await browser.screenshot(page, 'open-resolve-confirm');
    await page.click('#res-confirm-no');
    expect(await page.isVisible('#res-confirm')).toBe(false);
    expect(await page.isVisible('#resolve-form')).toBe(true);
    await page.waitForLoadState('networkidle');
    expect(posts).toEqual([]);
    expect((await gw.sqlite.getRecords('pay-9')).map((r) => r.state)).toEqual(['outcome_unknown']);
    // Changed after the question: asked again, with the new outcome.
    await page.selectOption('#res-outcome', 'completed');
    await page.click('#res-submit');
    await page.waitForSelector('#res-confirm:not([hidden])');
    expect(await page.textContent('#res-what dd[data-field="status"]')).toBe('200');
    await page.selectOption('#res-outcome', 'released');
    expect(await page.isVisible('#res-confirm')).toBe(false);
    await page.click('#res-submit');
    await page.waitForSelector('#res-confirm:not([hidden])');
    expect(await page.textContent('#res-what dd[data-field="outcome"]')).toMatch(/^released: /);
    await page.click('#res-confirm-yes');
    await page.waitForFunction(() => document.getElementById('status').textContent === 'resolved pay-9 as released by anonymous');
    page.off('request', onRequest);
    expect(posts).toEqual(['/_fencegate/v1/idempotency/pay-9/resolve']);
    await page.waitForSelector('#unk-empty:not([hidden])');
    const action = await page.$$eval('#act-table tbody tr:first-child td', (tds: HTMLElement[]) => tds.map((td) => td.textContent));
    expect(action.slice(1, 3)).toEqual(['resolve-released', 'pay-9']);
    expect(action[6]).toBe('(anonymous)');
    expect((await gw.sqlite.getRecords('pay-9')).filter((r) => r.state === 'outcome_unknown')).toEqual([]);
    await browser.screenshot(page, 'open-resolved');
    expect(problems).toEqual([]);
  });
});
