import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JS example without types
import { startDemoUpstream } from '../../examples/demo-upstream.js';

// `npm start` (examples/start.js) says in one line that the demo upstream's
// port is taken; that needs startDemoUpstream to reject, not to throw an
// unhandled 'error' event with a stack trace.
describe('examples/demo-upstream.js', () => {
  it('rejects with EADDRINUSE when its port is taken; listens when it is free', async () => {
    const holder = createServer();
    await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r));
    const { port } = holder.address() as AddressInfo;
    await expect(startDemoUpstream({ port })).rejects.toMatchObject({ code: 'EADDRINUSE' });
    await new Promise<void>((r) => holder.close(() => r()));
    // Control: the same port, free now.
    const server = await startDemoUpstream({ port });
    await new Promise<void>((r) => server.close(() => r()));
  });
});
