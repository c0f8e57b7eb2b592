/**
 * Negative control of connect-errors.test.ts: with the shared rule switched
 * to "never connected" for every error, a reset after the request arrived
 * escapes fencedFetch and fencedMcp as a plain error, which a caller may
 * retry under a new step, so the same check fails.
 */
import { afterAll, beforeAll, expect, test, vi } from 'vitest';
import { OutcomeUnknownError } from '../../src/lease/errors.js';
import { createFencedFetch } from '../../src/lease/fenced-fetch.js';
import { startFaultUpstreams, type FaultUpstreams } from '../workers/fault-upstream.js';
import { fenceContext } from './helpers/fence-context.js';
import { fencedMcp } from '../../src/lease/mcp.js';

vi.mock('../../src/protocol/connect-errors.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../src/protocol/connect-errors.js')>();
  return { ...real, neverConnected: () => true };
});

let faults: FaultUpstreams;
let resetUrl: string;
beforeAll(async () => {
  faults = await startFaultUpstreams();
  resetUrl = `${faults.urls.http}/rst-after`; // the request read, then RST
});
afterAll(async () => {
  await faults.close();
});

const { ctx } = fenceContext({ kind: 'ticket', jobKey: 'tool-job:connect-errors-control:1', fenceKey: 'tool-job:connect-errors-control:1' });

test('with every error taken as never-connected, the reset is no longer outcome unknown', async () => {
  const viaFetch = await createFencedFetch(ctx)(resetUrl, { method: 'POST', body: '{}', step: 'charge' }).catch((e: unknown) => e);
  expect(viaFetch).toBeInstanceOf(Error);
  expect(viaFetch).not.toBeInstanceOf(OutcomeUnknownError);

  const reset = await fetch(resetUrl, { method: 'POST', body: '{}' }).then(
    () => null,
    (e: unknown) => e,
  );
  const viaMcp = await fencedMcp({ callTool: () => Promise.reject(reset) }, ctx)
    .callTool({ name: 'create_ticket', arguments: {} })
    .catch((e: unknown) => e);
  expect(viaMcp).toBeInstanceOf(Error);
  expect(viaMcp).not.toBeInstanceOf(OutcomeUnknownError);
});
