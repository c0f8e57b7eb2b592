import { EventEmitter } from 'node:events';
import type { Admission, AdmitInput, GatewayStore } from '../../src/store/types.js';
import { delegate } from './delegate.js';

/**
 * Wrappers around a real store, for tests only. The gateway has no switch to
 * turn its checks off, and must not get one: a negative control wraps the
 * store it is given instead (CONTRIBUTING.md convention 7).
 */

/** Negative control: the store never sees the fence, so no fence is ever checked. */
export function withoutFenceCheck(inner: GatewayStore): GatewayStore {
  return delegate(inner, { admit: (i) => inner.admit({ ...i, fence: null }) });
}

/** Negative control: the store never sees the idempotency key, so nothing is deduplicated. */
export function withoutIdempotency(inner: GatewayStore): GatewayStore {
  return delegate(inner, {
    admit: (i) => inner.admit({ ...i, key: null }),
    finish: (i) => inner.finish({ ...i, key: null }),
  });
}

/**
 * Negative control for the release of a lost admission (DESIGN §8.2): the
 * store is always told `onUnknown: reject`, so a record the lost admission
 * took over from `outcome_unknown` is deleted instead of going back to
 * `outcome_unknown`: the earlier attempt's unknown outcome is forgotten and
 * the key's next request is forwarded as new.
 */
export function releaseForgettingTakeovers(inner: GatewayStore): GatewayStore {
  return delegate(inner, { releaseUnsent: (i) => inner.releaseUnsent!({ ...i, onUnknown: 'reject' }) });
}

/** Negative control: the release never sees the entity, so the lost admission's serial slot stays taken until it expires. */
export function releaseKeepingSlot(inner: GatewayStore): GatewayStore {
  return delegate(inner, { releaseUnsent: (i) => inner.releaseUnsent!({ ...i, entity: null }) });
}

export interface AdmissionSpy {
  store: GatewayStore;
  /** Every admission decision, in order. */
  admissions: { input: AdmitInput; admission: Admission }[];
  /** Resolves once an admission matching `predicate` has been decided. */
  waitForAdmission(predicate: (input: AdmitInput, admission: Admission) => boolean, timeoutMs?: number): Promise<void>;
}

/**
 * Observes admissions without changing them, so a test can wait for "the
 * second request is now waiting on the first" instead of sleeping.
 */
export function spyOnAdmissions(inner: GatewayStore): AdmissionSpy {
  const events = new EventEmitter();
  events.setMaxListeners(0);
  const admissions: AdmissionSpy['admissions'] = [];
  const store = delegate(inner, {
    async admit(input) {
      const admission = await inner.admit(input);
      admissions.push({ input, admission });
      events.emit('admission');
      return admission;
    },
  });
  return {
    store,
    admissions,
    waitForAdmission(predicate, timeoutMs = 20_000) {
      const seen = () => admissions.some((a) => predicate(a.input, a.admission));
      return new Promise((resolve, reject) => {
        if (seen()) return resolve();
        const check = () => {
          if (!seen()) return;
          clearTimeout(timer);
          events.off('admission', check);
          resolve();
        };
        const timer = setTimeout(() => {
          events.off('admission', check);
          reject(new Error(`no matching admission among ${admissions.map((a) => a.admission.outcome).join(', ')}`));
        }, timeoutMs);
        events.on('admission', check);
      });
    },
  };
}

export interface HeldAdmissions {
  store: GatewayStore;
  /** Resolves once a matching admission has committed (its answer is held). */
  committed: Promise<Admission>;
  /** Hands the held answer to the gateway. */
  release(): void;
}

/**
 * A database reply held in the network: the first admission matching
 * `predicate` commits in the real store, then its answer reaches the gateway
 * only when the test calls `release()`. The gateway is, for that request,
 * paused between its admission and its forward (DESIGN §3.5, §3.6).
 */
export function holdAdmission(inner: GatewayStore, predicate: (input: AdmitInput) => boolean): HeldAdmissions {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  let committed!: (a: Admission) => void;
  const done = new Promise<Admission>((r) => (committed = r));
  let taken = false;
  const store = delegate(inner, {
    async admit(input) {
      const admission = await inner.admit(input);
      if (taken || !predicate(input)) return admission;
      taken = true;
      committed(admission);
      await gate;
      return admission;
    },
  });
  return { store, committed: done, release };
}

/**
 * Negative control (DESIGN §3.12): a reconciler's release loses its
 * `notBefore`, so an upstream's "not found" releases the record at once,
 * while the attempt may still be in flight or still landing.
 */
export function withoutReconcileWait(inner: GatewayStore): GatewayStore {
  return delegate(inner, {
    resolveRecord: (i) => inner.resolveRecord(i.resolution.outcome === 'released' ? { ...i, resolution: { outcome: 'released' } } : i),
  });
}
