/**
 * The store as the proxy sees it, with its admit and finish calls timed and
 * their ends counted (fencegate_store_duration_seconds, _store_errors_total,
 * _late_finishes_total). A wrapper, so that no store backend has to know
 * about metrics; every other method is the store's own.
 */
import { overrideStore } from '../store/override.js';
import type { GatewayStore } from '../store/types.js';
import type { Metrics } from './metrics.js';

/**
 * @example
 * const timed = timeStore(store, metrics); // hand `timed` to the proxy; close `store` as before
 */
export function timeStore(store: GatewayStore, metrics: Pick<Metrics, 'storeCall'>): GatewayStore {
  const admit: GatewayStore['admit'] = async (input) => {
    const t = performance.now();
    try {
      const a = await store.admit(input);
      metrics.storeCall('admit', performance.now() - t, 'ok');
      return a;
    } catch (err) {
      metrics.storeCall('admit', performance.now() - t, 'error');
      throw err;
    }
  };
  const finish: GatewayStore['finish'] = async (input) => {
    const t = performance.now();
    try {
      const r = await store.finish(input);
      metrics.storeCall('finish', performance.now() - t, r.recorded ? 'ok' : 'discarded');
      return r;
    } catch (err) {
      metrics.storeCall('finish', performance.now() - t, 'error');
      throw err;
    }
  };
  return overrideStore(store, { admit, finish });
}
