import type { AdmitInput } from '../../../src/store/types.js';

let n = 0;
/** A fresh admission (new key, entity and owner each call), with overrides: for the store-level tests. */
export function admitInput(over: Partial<AdmitInput> = {}): AdmitInput {
  n++;
  return {
    scope: 'r',
    key: `k-${n}`,
    entity: `e-${n}`,
    fence: 1n,
    fingerprint: 'f',
    mode: 'serial',
    ownerToken: `o-${n}`,
    lockMs: 10_000,
    retentionMs: 60_000,
    onUnknown: 'reject',
    audit: { requestId: `r-${n}`, clientRequestId: null, caller: null, method: 'POST', path: '/x', payloadSha256: '0' },
    ...over,
  };
}
