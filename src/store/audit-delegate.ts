import type { AuditStore } from './types.js';

/**
 * The base of a store whose audit methods (fence history, records for
 * operators, their resolution, gauges: DESIGN §4.1) live in its audit half,
 * a separate `AuditStore` the store builds in its constructor. Each method
 * reads `audit` when called, so the subclass may set it after `super()`.
 */
export abstract class AuditDelegate implements AuditStore {
  protected abstract readonly audit: AuditStore;

  getFenceHistory: AuditStore['getFenceHistory'] = (entity, page) => this.audit.getFenceHistory(entity, page);
  listRecords: AuditStore['listRecords'] = (query) => this.audit.listRecords(query);
  resolveRecord: AuditStore['resolveRecord'] = (input) => this.audit.resolveRecord(input);
  listOperatorActions: AuditStore['listOperatorActions'] = (page) => this.audit.listOperatorActions(page);
  auditStats: AuditStore['auditStats'] = () => this.audit.auditStats();
}
