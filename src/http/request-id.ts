const REQUEST_ID = /^[A-Za-z0-9._:@-]{1,128}$/;

/** The caller's `X-Request-Id` when it is a safe token, else a fresh UUID (as the proxy does). */
export function requestIdOf(req: Request): string {
  const given = req.headers.get('x-request-id');
  return given !== null && REQUEST_ID.test(given) ? given : crypto.randomUUID();
}
