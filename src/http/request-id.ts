import type { HeaderReader } from './inbound.js';

const REQUEST_ID = /^[A-Za-z0-9._:@-]{1,128}$/;

/** What the request ids are read from: a web `Request` or the proxy's `Inbound`. */
type WithHeaders = { headers: Pick<HeaderReader, 'get'> };

/**
 * A request's two ids, the one place they are made: the gateway's own id,
 * always a fresh UUID whatever the caller sent, so that no caller chooses
 * the id its rows (rejections, operator actions) are filed under; and the
 * caller's `X-Request-Id`, kept beside it (audit.clientRequestId) when it is
 * a safe token, else null.
 */
export function requestIds(req: WithHeaders): { requestId: string; clientRequestId: string | null } {
  return { requestId: newRequestId(), clientRequestId: clientRequestIdOf(req) };
}

/** The gateway's own id for a request: a fresh UUID, never taken from the request (see `requestIds`). */
export function newRequestId(): string {
  return crypto.randomUUID();
}

/** The caller's `X-Request-Id` when it is a safe token, else null (see `requestIds`). */
export function clientRequestIdOf(req: WithHeaders): string | null {
  const given = req.headers.get('x-request-id');
  return given !== null && REQUEST_ID.test(given) ? given : null;
}
