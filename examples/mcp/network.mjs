// The demo's "network" between W1 and the gateway: a TCP relay that can
// hold new connections' bytes (a request stuck on the wire) and deliver
// them later. It notes each answer's HTTP status and X-Fencegate-Refusal.
import { connect, createServer } from 'node:net';

export function holdingPath(targetPort) {
  const held = [];
  const open = new Set();
  let holding = false;
  const server = createServer((client) => {
    client.on('error', () => {});
    const link = { client, upstream: null, chunks: [], answer: null, refusal: null, head: '' };
    open.add(link);
    const forward = () => {
      link.upstream = connect(targetPort, '127.0.0.1');
      link.upstream.on('error', () => {});
      link.upstream.on('data', (d) => {
        if (link.answer === null) {
          link.head += d.toString('latin1');
          const end = link.head.indexOf('\r\n\r\n');
          if (end >= 0) {
            const head = link.head.slice(0, end);
            link.refusal = /^x-fencegate-refusal:\s*(\S+)/im.exec(head)?.[1] ?? null;
            link.answer = /^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? '?';
          }
        }
        if (!client.destroyed) client.write(d);
      });
      link.upstream.on('close', () => client.destroy());
      for (const c of link.chunks.splice(0)) link.upstream.write(c);
    };
    link.release = forward;
    if (holding) held.push(link);
    else forward();
    client.on('data', (d) => (link.upstream ? link.upstream.write(d) : link.chunks.push(d)));
    client.on('close', () => (open.delete(link), link.upstream?.destroy()));
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () =>
      resolve({
        port: server.address().port,
        hold: () => (holding = true),
        /** Held connections that carry a request. */
        requests: () => held.filter((l) => l.chunks.length > 0),
        /** Delivers the held requests, late; returns them. */
        release() {
          holding = false;
          const carrying = held.filter((l) => l.chunks.length > 0);
          for (const l of held) if (l.chunks.length === 0) l.client.destroy();
          for (const l of carrying) l.release();
          return carrying;
        },
        close() {
          for (const l of open) l.client.destroy(), l.upstream?.destroy();
          return new Promise((r) => server.close(r));
        },
      }),
    ),
  );
}
