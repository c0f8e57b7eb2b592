const REQUEST_ID = /^[A-Za-z0-9._:@-]{1,128}$/;

/**
 * The gateway's own id for a request: always a fresh UUID, whatever the
 * caller sent, so that no caller chooses the id its rows (rejections,
 * operator actions) are filed under. The caller's `X-Request-Id` is kept
 * beside it, see `clientRequestIdOf`. (`req` is kept for the call sites.)
 */
export function requestIdOf(_req: Request): string {
  return crypto.randomUUID();
}

/** The caller's `X-Request-Id` when it is a safe token (as the proxy reads it), else null. */
export function clientRequestIdOf(req: Request): string | null {
  const given = req.headers.get('x-request-id');
  return given !== null && REQUEST_ID.test(given) ? given : null;
}
