/**
 * The replication check's rules (src/store/postgres/replication-check.ts,
 * docs/deploy-postgres.md "Replication and failover") on the readings that
 * test/replicas/postgres-replication-check.test.ts cannot make with one
 * standby: a `potential` standby beside a synchronous one, `quorum`
 * standbys, and `remote_write`.
 */
import { describe, expect, it } from 'vitest';
import { assessReplication, type ReplicationRow } from '../../src/store/postgres/replication-check.js';

const row = (over: Partial<ReplicationRow>): ReplicationRow => ({
  synchronous_commit: 'on',
  synchronous_standby_names: '',
  in_recovery: false,
  standbys: [],
  ...over,
});

describe('the replication rules', () => {
  it('FIRST 1 (a, b): b is potential, and promoting it can lose acknowledged decisions', () => {
    const r = assessReplication(
      row({
        synchronous_standby_names: 'FIRST 1 (a, b)',
        standbys: [
          { name: 'a', syncState: 'sync' },
          { name: 'b', syncState: 'potential' },
        ],
      }),
    );
    expect(r.state).toBe('at-risk');
    expect(r.reason).toMatch(/not every standby is synchronous: b \(potential\)/);
  });

  it('ANY 1 (a, b): quorum standbys count as synchronous (the control)', () => {
    const r = assessReplication(
      row({
        synchronous_standby_names: 'ANY 1 (a, b)',
        standbys: [
          { name: 'a', syncState: 'quorum' },
          { name: 'b', syncState: 'quorum' },
        ],
      }),
    );
    expect(r.state).toBe('safe');
  });

  it('remote_write with a synchronous standby is safe; off is not', () => {
    const standbys = [{ name: 'a', syncState: 'sync' }];
    expect(assessReplication(row({ synchronous_commit: 'remote_write', synchronous_standby_names: 'a', standbys })).state).toBe('safe');
    expect(assessReplication(row({ synchronous_commit: 'off', synchronous_standby_names: 'a', standbys })).state).toBe('at-risk');
  });

  it('standby names with no standby: safe, but every commit waits; with synchronous_commit local nothing waits', () => {
    expect(assessReplication(row({ synchronous_standby_names: 'a' }))).toMatchObject({ state: 'safe', commitsWait: true });
    expect(assessReplication(row({ synchronous_standby_names: 'a', synchronous_commit: 'local' }))).toMatchObject({ state: 'safe', commitsWait: false });
  });
});
