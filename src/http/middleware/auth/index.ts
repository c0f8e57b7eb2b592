import type { Caller } from './verify.js';

export { checkBearer, jwtAuth, shortHash, type AuthRefusal, type BearerCheck, type JwtAuthOptions } from './middleware.js';
export {
  createTokenVerifier,
  hasScope,
  scopesOf,
  SCOPES,
  type Caller,
  type Scope,
  type TokenCheck,
  type TokenVerifier,
  type TokenVerifierOptions,
} from './verify.js';

declare module 'hono' {
  interface ContextVariableMap {
    /** Set by `jwtAuth` once the bearer token is verified and holds the scope. */
    caller?: Caller;
  }
}
