// Run by dns-failure.test.ts inside a network namespace of its own (unshare
// -rn, loopback only), where every DNS lookup fails on this machine without
// a packet leaving it. Prints one JSON line: what workerd's fetch (through
// Miniflare, the workerd of wrangler dev) and Node's fetch threw. Without
// Miniflare's outbound proxy worker (as in vitest.workers.config.mts): the
// Worker's fetch goes to the network itself, as on a deployment.
import { Miniflare } from 'miniflare';

const HOST = 'http://fencegate-dns-probe.invalid/x';
const script = `export default { async fetch() {
  try {
    const r = await fetch(${JSON.stringify(HOST)}, { method: 'POST', body: '{}' });
    return Response.json({ outcome: 'response', status: r.status });
  } catch (e) {
    const props = Object.fromEntries(Object.getOwnPropertyNames(e).filter((k) => k !== 'stack' && k !== 'message').map((k) => [k, e[k]]));
    return Response.json({ outcome: 'threw', ctor: e.constructor.name, name: e.name, message: e.message, props, cause: e.cause === undefined ? null : String(e.cause) });
  }
} }`;

const mf = new Miniflare({ modules: true, script, compatibilityDate: '2026-04-01', stripCfConnectingIp: false });
let workerd;
try {
  workerd = await (await mf.dispatchFetch('http://localhost/')).json();
} finally {
  await mf.dispose();
}
let node;
try {
  const r = await fetch(HOST, { method: 'POST', body: '{}' });
  node = { outcome: 'response', status: r.status };
} catch (e) {
  node = { outcome: 'threw', ctor: e.constructor.name, message: e.message, causeCode: e.cause?.code ?? null, causeMessage: e.cause?.message ?? null };
}
console.log(JSON.stringify({ workerd, node }));
