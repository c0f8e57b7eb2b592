/**
 * OAuth 2.0 Protected Resource Metadata (RFC 9728), as MCP's authorization
 * spec (2025-06-18, 2025-11-25) asks a resource server to publish it: the
 * gateway's resource identifier (`auth.resource`), the authorization
 * servers that issue tokens for it, and how a token is sent. Pure: the
 * gateway serves the document (../http/gateway.ts) and names its URL in the
 * `resource_metadata` parameter of its 401 challenges (RFC 9728 §5.1).
 */

/** RFC 9728 §3: the well-known URI suffix. */
export const RESOURCE_METADATA_SUFFIX = '/.well-known/oauth-protected-resource';

/**
 * Where the metadata of `resource` is served (RFC 9728 §3.1): the
 * well-known suffix inserted between the host and the resource's path, so
 * `https://gw.example/mcp` has `/.well-known/oauth-protected-resource/mcp`
 * and `https://gw.example` the suffix alone. The path as URL parsing
 * writes it (the config refuses a query, a fragment and a trailing slash).
 */
export function resourceMetadataPath(resource: string): string {
  const path = new URL(resource).pathname;
  return path === '/' ? RESOURCE_METADATA_SUFFIX : `${RESOURCE_METADATA_SUFFIX}${path}`;
}

/** The metadata's absolute URL: the resource's own origin (configured, never read from a request's Host) and the path above. */
export function resourceMetadataUrl(resource: string): string {
  return `${new URL(resource).origin}${resourceMetadataPath(resource)}`;
}

/** The scopes a token for the proxied resource needs: the proxy's (the admin API's scopes are not this resource's). */
export const RESOURCE_SCOPES: readonly string[] = ['fencegate:proxy'];

/**
 * The metadata document (RFC 9728 §2). `resource` is the configured string
 * exactly: a client compares it with the URL it formed the metadata URL
 * from (§3.3) and sends it as the RFC 8707 `resource` parameter, and the
 * tokens it gets back carry it as `aud`, which the gateway checks.
 */
export function resourceMetadataDocument(options: {
  resource: string;
  authorizationServers: readonly string[];
  resourceName?: string | undefined;
}): Record<string, unknown> {
  return {
    resource: options.resource,
    authorization_servers: [...options.authorizationServers],
    scopes_supported: [...RESOURCE_SCOPES],
    // Only the Authorization header: the gateway never reads a token from a query (it would be logged) or a body (RFC 6750 §2).
    bearer_methods_supported: ['header'],
    ...(options.resourceName !== undefined ? { resource_name: options.resourceName } : {}),
  };
}
