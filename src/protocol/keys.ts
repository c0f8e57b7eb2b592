// Verification keys for the tokens the wire protocol checks: signed fences
// (docs/design.md §7, ./fence-token.ts) and caller tokens (§3.2). They sit
// in src/protocol, below the configuration that names them, so that the
// protocol depends on no configuration module; reading key files is the Node
// entry's part (src/config/key-files.ts).
import { createLocalJWKSet, exportJWK, importSPKI, type CryptoKey, type FlattenedJWSInput, type JSONWebKeySet, type JWK, type JWSHeaderParameters } from 'jose';

/** Asymmetric algorithms a configured public key may use. */
export const PUBLIC_KEY_ALGS = ['ES256', 'EdDSA', 'RS256'] as const;
export type PublicKeyAlg = (typeof PUBLIC_KEY_ALGS)[number];

/**
 * Where verification keys come from, as written in the config (`auth`,
 * `fence.signed`). Files (`jwksFile`, `publicKeys[].file`) are read by the
 * Node entry at start-up (`inlineKeyFiles`) and replaced by their contents,
 * so that this module never touches a file system (it runs on Workers too).
 */
export interface KeySetSpec {
  /** HS256 shared secret: a literal (32+ characters) or `{ env: "VAR" }`. */
  secret?: string | { env: string };
  /** SPKI PEM public keys. */
  publicKeys?: { alg: PublicKeyAlg; kid?: string; pem?: string; file?: string }[];
  /** An inline JWKS (`{"keys": [...]}`) of public keys. */
  jwks?: { keys: Record<string, unknown>[] };
  jwksFile?: string;
}

/** A key getter jose can call with the token's protected header. */
export type KeyGetter = (header: JWSHeaderParameters, token: FlattenedJWSInput) => Promise<CryptoKey | Uint8Array | JWK>;

export interface VerificationKeys {
  /** The allow-list passed to jose: never `none`, only what the configured keys can verify. */
  algorithms: string[];
  getKey: KeyGetter;
  /** The HS256 secret bytes, when configured (to mint development tokens). */
  secret: Uint8Array | null;
}

/** A key spec that cannot be used; `field` names the config field. */
export class KeyConfigError extends Error {
  override readonly name = 'KeyConfigError';
  readonly code = 'invalid-keys';
  constructor(
    message: string,
    readonly field: string,
  ) {
    super(message);
  }
}

/**
 * Resolves a key spec once, at start-up: the secret from the environment,
 * the algorithm allow-list. Public keys are imported on first use (WebCrypto
 * imports are async) and cached; an unusable PEM or JWK fails that first
 * verification, and `checkKeys` lets the caller surface it at start-up.
 *
 * @example
 * const keys = verificationKeys({ secret: { env: 'FENCEGATE_JWT_SECRET' } }, process.env, 'auth');
 */
export function verificationKeys(spec: KeySetSpec, env: Record<string, string | undefined>, field: string): VerificationKeys {
  let secret: Uint8Array | null = null;
  if (spec.secret !== undefined) {
    const text = typeof spec.secret === 'string' ? spec.secret : env[spec.secret.env];
    if (text === undefined || text === '')
      throw new KeyConfigError(`${field}.secret: environment variable ${(spec.secret as { env: string }).env} is not set`, `${field}.secret`);
    if (text.length < 32) throw new KeyConfigError(`${field}.secret: must be at least 32 characters (256 bits) for HS256`, `${field}.secret`);
    secret = new TextEncoder().encode(text);
  }
  if (spec.jwksFile !== undefined)
    throw new KeyConfigError(`${field}.jwksFile: key files are read by the Node entry; pass "jwks" inline here`, `${field}.jwksFile`);
  spec.publicKeys?.forEach((k, i) => {
    if (k.pem === undefined)
      throw new KeyConfigError(`${field}.publicKeys[${i}]: key files are read by the Node entry; pass "pem" inline here`, `${field}.publicKeys[${i}]`);
  });

  const algorithms: string[] = [];
  if (secret !== null) algorithms.push('HS256');
  const asymmetric = new Set<string>();
  for (const k of spec.publicKeys ?? []) asymmetric.add(k.alg);
  for (const k of spec.jwks?.keys ?? []) {
    const alg = typeof k.alg === 'string' ? k.alg : k.kty === 'EC' ? 'ES256' : k.kty === 'OKP' ? 'EdDSA' : k.kty === 'RSA' ? 'RS256' : null;
    if (alg !== null && (PUBLIC_KEY_ALGS as readonly string[]).includes(alg)) asymmetric.add(alg);
    if (alg === 'Ed25519') asymmetric.add('EdDSA');
  }
  // jose names Ed25519 signatures either "EdDSA" (RFC 8037) or "Ed25519" (RFC 9864).
  if (asymmetric.has('EdDSA')) asymmetric.add('Ed25519');
  algorithms.push(...asymmetric);
  if (algorithms.length === 0) throw new KeyConfigError(`${field}: no key configured (secret, publicKeys or jwks)`, field);

  let jwks: Promise<ReturnType<typeof createLocalJWKSet> | null> | null = null;
  const keySet = () =>
    (jwks ??= (async () => {
      const keys: JWK[] = (spec.jwks?.keys ?? []).map((k) => ({ ...k }) as JWK);
      for (const [i, k] of (spec.publicKeys ?? []).entries()) {
        const imported = await importSPKI(k.pem!, k.alg, { extractable: true }).catch((err: Error) => {
          throw new KeyConfigError(`${field}.publicKeys[${i}]: not an SPKI PEM public key for ${k.alg} (${err.message})`, `${field}.publicKeys[${i}]`);
        });
        keys.push({ ...(await exportJWK(imported)), alg: k.alg, ...(k.kid === undefined ? {} : { kid: k.kid }) });
      }
      return keys.length === 0 ? null : createLocalJWKSet({ keys } as JSONWebKeySet);
    })());

  const getKey: KeyGetter = async (header, token) => {
    if (header.alg === 'HS256') {
      if (secret === null) throw new NoKeyError('no HS256 secret is configured');
      return secret;
    }
    const set = await keySet();
    if (set === null) throw new NoKeyError(`no public key is configured for ${String(header.alg)}`);
    // jose's local JWKS picks by kid, alg and kty; several matches are tried in turn.
    return (await set(header, token)) as CryptoKey;
  };
  return { algorithms, getKey, secret };
}

/** Imports every public key now, so that a bad PEM or JWK stops start-up instead of the first request. */
export async function checkKeys(keys: VerificationKeys): Promise<void> {
  try {
    await keys.getKey({ alg: 'ES256' }, { payload: '', signature: '' });
  } catch (err) {
    if (err instanceof KeyConfigError) throw err;
  }
}

/** No configured key can verify this token (reported as a verification failure). */
export class NoKeyError extends Error {
  override readonly name = 'NoKeyError';
  readonly code = 'ERR_NO_KEY';
}
