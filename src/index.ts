/**
 * fencegate: a fencing-aware side-effect gateway. This entry point has no
 * database driver in it: stores come from `fencegate/sqlite`,
 * `fencegate/postgres` and `fencegate/d1`.
 */
export { createGateway, type Gateway, type GatewayOptions } from './http/gateway.js';
export { parseConfig, parseConfigText, ConfigError } from './config/load.js';
export { ConfigSchema, type Config, type ConfigInput, type RouteConfig } from './config/schema.js';
export type { Forwarder, UpstreamRequest, UpstreamResult } from './http/forward.js';
export { createJsonLogger, silentLogger, type Logger } from './http/logger.js';
export { ERROR_CODES, type ErrorCode } from './protocol/codes.js';
export { parseFence, parseIdempotencyKey, parseEntity, MAX_FENCE } from './protocol/headers.js';
export { fingerprint } from './core/fingerprint.js';
export type * from './store/types.js';
