/**
 * The operator console inside workerd: the page, its style and its script are
 * files under src/http/console, bundled into a module at build time
 * (scripts/bundle-console.mjs) because a Worker has no file system. This
 * checks that the Worker serves the whole page with the CSP of its inline
 * blocks.
 */
import { createExecutionContext, waitOnExecutionContext } from 'cloudflare:test';
import { env } from 'cloudflare:workers';
import { describe, expect, inject, it } from 'vitest';
import worker, { type WorkerEnv } from '../../src/entry/worker.js';
import { CONSOLE_HTML } from '../../src/http/console/page.js';

const upstreamUrl = inject('upstreamUrl');

describe('the console on Workers', () => {
  it('GET /_fencegate/console serves the bundled page, script and style included, with their hashes in the CSP', async () => {
    const config = JSON.stringify({
      store: { d1: 'DB' },
      routes: [{ name: 'payments', match: { path: '/payments/*', methods: ['POST'] }, upstream: upstreamUrl }],
    });
    const e: WorkerEnv = { ...(env as unknown as WorkerEnv), FENCEGATE_CONFIG: config, FENCEGATE_LOG_LEVEL: 'error', FENCEGATE_ADMIN: 'on' };
    const ctx = createExecutionContext();
    const res = await worker.fetch(new Request('https://gateway.example/_fencegate/console'), e, ctx);
    const page = await res.text();
    await waitOnExecutionContext(ctx);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(page).toBe(CONSOLE_HTML);
    expect(page).toContain("<script>\n(function () {\n  'use strict';");
    expect(page).toContain('<style>\n*{box-sizing:border-box}');
    expect(page).toContain('<option>stale-fence</option>');
    expect(res.headers.get('content-security-policy')).toMatch(/script-src 'sha256-[A-Za-z0-9+/]+={0,2}'; style-src 'sha256-[A-Za-z0-9+/]+={0,2}'/);
  });
});
