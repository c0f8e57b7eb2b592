import type { GatewayStore } from '../../src/store/types.js';

/**
 * A store that passes every call to `inner`, but for `overrides`: the base of
 * the test-only wrappers that switch one check off (negative controls,
 * CONTRIBUTING.md convention 7). No Node import, so the workerd suites use it too.
 */
export function delegate(inner: GatewayStore, overrides: Partial<GatewayStore>): GatewayStore {
  return {
    kind: inner.kind,
    admit: (i) => inner.admit(i),
    finish: (i) => inner.finish(i),
    extendLock: (i) => inner.extendLock(i),
    getInterim: (i) => inner.getInterim(i),
    noteReconcile: (i) => inner.noteReconcile(i),
    recordRejection: (i) => inner.recordRejection(i),
    recordCommand: (i) => inner.recordCommand(i),
    listCommands: (q) => inner.listCommands(q),
    waitForChange: (t, ms, s) => inner.waitForChange(t, ms, s),
    listRejections: (q) => inner.listRejections(q),
    getEntity: (e) => inner.getEntity(e),
    getRecords: (k) => inner.getRecords(k),
    sweep: (o) => inner.sweep(o),
    getFenceHistory: (e, p) => inner.getFenceHistory(e, p),
    listRecords: (q) => inner.listRecords(q),
    resolveRecord: (i) => inner.resolveRecord(i),
    listOperatorActions: (p) => inner.listOperatorActions(p),
    auditStats: () => inner.auditStats(),
    close: () => inner.close(),
    ...overrides,
  };
}
