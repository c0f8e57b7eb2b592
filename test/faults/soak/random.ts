/**
 * A seeded PRNG (mulberry32: 32-bit state, good enough to spread faults, and
 * the same sequence for the same seed on every machine), so that a soak's
 * fault schedule can be replayed from the seed it printed.
 */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An integer in [min, max] from a draw r in [0, 1). */
export function between(r: number, min: number, max: number): number {
  return Math.floor(min + r * (max - min + 1));
}
