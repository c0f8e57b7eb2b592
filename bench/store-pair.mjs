// The workload of bench/store-pairs.mjs (SQLite) and bench/postgres-pairs.mjs:
// per request one admission and one finish through a gateway store's public
// interface (new key, rising fence, one of 1000 entities, serial mode, a
// 34-byte answer stored).

const body = new Uint8Array(34).fill(65);

/** `run(total)` makes `total` admit-then-finish pairs on `store`, `concurrency` at a time. */
export function pairRunner(store, concurrency) {
  let seq = 0;
  async function one() {
    const k = ++seq;
    const entity = `bench:${k % 1000}`;
    const ownerToken = `owner-${k}-0000-0000-0000-000000000000`;
    const audit = { caller: null, method: 'POST', path: '/payments/charges', payloadSha256: 'ab'.repeat(32), requestId: `req-${k}` };
    const input = {
      scope: 'payments',
      key: `key-${k}`,
      entity,
      fence: BigInt(k),
      fingerprint: 'f'.repeat(64),
      mode: 'serial',
      ownerToken,
      lockMs: 30_000,
      retentionMs: 86_400_000,
      onUnknown: 'reject',
      audit,
    };
    const admission = await store.admit(input);
    if (admission.outcome !== 'forward') throw new Error(`unexpected ${admission.outcome}`);
    await store.finish({
      scope: 'payments',
      key: input.key,
      entity,
      ownerToken,
      outcome: 'completed',
      response: { status: 201, headers: [['content-type', 'application/json']], body },
      retentionMs: 86_400_000,
      audit,
    });
  }
  return async function run(total) {
    let left = total;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (left-- > 0) await one();
      }),
    );
  };
}
