#!/usr/bin/env node
// An upstream that checks fence order, in a process of its own (so that the
// load generator's busy event loop cannot delay its reads, which would look
// like a request landing late). Forked with IPC by bench/paused-gateways.mjs:
// it sends {port} when listening and {figures} when asked with 'report'.
//
// A violation: a fence lower than one already received for the same entity
// (G1). An overlap: two requests for one entity in flight at once (G3).
import { createServer } from 'node:http';

const maxFence = new Map();
const inflight = new Map();
const figures = { forwarded: 0, violations: 0, overlaps: 0, violationSamples: [] };
const server = createServer((req, res) => {
  const entity = req.headers['x-fence-entity'] ?? '';
  const fence = BigInt(req.headers['x-execution-fence'] ?? '0');
  const top = maxFence.get(entity) ?? -1n;
  figures.forwarded++;
  if (fence < top) {
    figures.violations++;
    if (figures.violationSamples.length < 10)
      figures.violationSamples.push({ entity, fence: String(fence), after: String(top), requestId: req.headers['x-request-id'] });
  } else maxFence.set(entity, fence);
  const now = (inflight.get(entity) ?? 0) + 1;
  inflight.set(entity, now);
  if (now > 1) figures.overlaps++;
  req.resume();
  req.on('end', () =>
    setTimeout(() => {
      inflight.set(entity, inflight.get(entity) - 1);
      res.writeHead(201, { 'content-type': 'application/json' }).end('{"ok":true}');
    }, 20),
  );
});
server.listen(0, '127.0.0.1', () => process.send({ port: server.address().port }));
process.on('message', (m) => {
  if (m === 'report') process.send({ figures });
});
process.on('disconnect', () => process.exit(0));
