import { sha256Hex } from '../../core/fingerprint.js';
import type { Refusal } from '../../protocol/problem.js';
import { readBody } from '../body.js';
import type { Codec, Read } from './codec.js';
import type { Exchange } from './exchange.js';

// Stage 4 of the decision order (DESIGN §3.4): the body, whole and within
// the route's limit (it is part of the fingerprint), then what the codec
// makes of it: the command, a message to pass undecided, or a refusal.

const EMPTY = new Uint8Array(0);

export async function readCommand<S>(x: Exchange, codec: Codec<S>, state: S): Promise<{ body: Uint8Array; read: Read<S> }> {
  const route = x.route!;
  const read = await readBody(x.req, route.maxBodyBytes, x.req.incoming);
  if (!read.ok) {
    const refusal: Refusal =
      'aborted' in read
        ? { code: 'invalid-request', detail: 'the request body ended before its end (the client went away)' }
        : { code: 'payload-too-large', detail: `the body exceeds this route's limit of ${route.maxBodyBytes} bytes` };
    return { body: EMPTY, read: { kind: 'refused', refusal, state } };
  }
  // The body's hash is the audit trail's (and a plain route's fingerprint's), so only a command's: a message passed undecided is never hashed.
  const answer = codec.read(x, state, read.body, () => (x.payloadSha256 = sha256Hex(read.body)));
  return { body: read.body, read: answer };
}

/** A fence needs an entity to be checked against (DESIGN §3.3): null when the command has what it needs. */
export function missingEntity<S>(
  x: Exchange,
  codec: Codec<S>,
  command: { fence: bigint | null; signedFence: string | null; entity: string | null },
): Refusal | null {
  if (command.entity !== null || (command.fence === null && command.signedFence === null && x.route!.fence !== 'required')) return null;
  return { code: 'missing-entity', detail: `a fence needs an entity (${codec.entitySource(x)})` };
}
