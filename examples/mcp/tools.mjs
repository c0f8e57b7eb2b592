// The demo's allow-list: the tools a model may dispatch, each with the
// limits its jobs run under. The dispatcher (demo-mcp.mjs) and the workers
// (mcp/worker.mjs) read the same table, so a plan can never pick them.
import { z } from 'zod';

export const TOOLS = {
  create_ticket: {
    schema: z.object({ title: z.string().min(1).max(200) }),
    leaseMs: 1_500,
    maxRunMs: 60_000,
    maxAttempts: 3,
  },
};

// The workers' heartbeat settings (runWorker options): the dispatcher passes
// them too, so a lease no worker can hold is refused at dispatch.
export const HEARTBEAT = { heartbeatMs: 250, maxMissedHeartbeats: 2, jitterMs: 100 };
