import type { Refusal } from '../../protocol/problem.js';
import type { SignedFenceCheck } from '../signed-fence.js';
import type { Command } from './codec.js';
import { auditOf, type Exchange } from './exchange.js';

// Stage 5 (DESIGN §7): with `fence.signed`, the fence is a JWS minted for
// this very entity and not yet expired, checked once the entity is known
// (after the body for a body entity). Its refusals are written to the
// rejection log by the check itself (../signed-fence.ts).

export async function verifyFence(x: Exchange, command: Command, check: SignedFenceCheck | undefined): Promise<Refusal | null> {
  if (command.signedFence === null || check === undefined) return null;
  const checked = await check(command.signedFence, command.entity!, { audit: auditOf(x), idempotencyKey: command.key });
  if (!checked.ok) return checked.refusal;
  command.fence = checked.fence;
  x.trace.fence = checked.fence.toString();
  return null;
}
