import type { GatewayStore } from './types.js';

/**
 * `store` with some of its methods replaced (a wrapper that times calls, one
 * that keeps a shutdown's finishes): every other member is the store's own.
 * Stores are classes (methods on the prototype, private fields), so their
 * methods are bound to the store itself, once each.
 */
export function overrideStore(store: GatewayStore, overrides: Partial<GatewayStore>): GatewayStore {
  const bound = new Map<PropertyKey, unknown>();
  return new Proxy(store, {
    get(target, prop) {
      if (Object.hasOwn(overrides, prop)) return overrides[prop as keyof GatewayStore];
      const v = Reflect.get(target, prop, target);
      if (typeof v !== 'function') return v;
      let f = bound.get(prop);
      if (f === undefined) bound.set(prop, (f = (v as (...a: unknown[]) => unknown).bind(target)));
      return f;
    },
  });
}
