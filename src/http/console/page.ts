/**
 * The operator console: one static HTML page with plain JavaScript, served at
 * `<adminPrefix>/` (and `<adminPrefix>/console`). It holds no data itself;
 * every call goes to the `/v1` audit API with the bearer token the operator
 * signs in with (kept in sessionStorage: gone when the tab closes).
 * Everything from the server is written with `textContent`, never as HTML:
 * entities, keys and paths are chosen by callers. The script and style are
 * inline, allowed by their hashes in the Content-Security-Policy (see
 * `consoleResponse`).
 *
 * The page, its style and its scripts are real files next to this one
 * (console.html, console.css, console.js, chart.js, rejections.js), bundled
 * into assets.generated.ts by scripts/bundle-console.mjs at build time:
 * Workers have no file system.
 */
import { REJECTION_REASONS } from '../../store/types.js';
import { CONSOLE_CSS, CONSOLE_JS, CONSOLE_TEMPLATE } from './assets.generated.js';

/**
 * How the admin API this page talks to is guarded, rendered into the page
 * (`<body data-auth>`) so that the page knows it before its first request:
 * asking the API would itself be an audited call, and with auth on, a call
 * before sign-in is an `unauthorized` row in the audit log.
 * - `auth`: bearer tokens; the page calls nothing until the operator signs in.
 * - `open`: no auth configured, the API answers without a token (loopback only).
 * - `off`: the `/v1` API is disabled (no auth, not loopback); the page calls nothing.
 */
export type ConsoleMode = 'auth' | 'open' | 'off';

// The inline blocks begin on a line of their own; the CSP hashes below cover
// exactly these bytes.
const STYLE = `\n${CONSOLE_CSS}`;
const SCRIPT = `\n${CONSOLE_JS}`;
/** The reason filter's choices: every reason the rejection log can hold. */
export const CONSOLE_REASONS = REJECTION_REASONS;
const REASONS = CONSOLE_REASONS;

/**
 * Puts `text` where `marker` stands, once. Not `String.replace`: its
 * replacement string reads `$'` and `$&` as patterns, and the script is full
 * of `$(`. The script goes in last, so no marker is looked for inside it.
 */
const fill = (template: string, marker: string, text: string) => {
  const [before, after, ...rest] = template.split(marker);
  if (after === undefined || rest.length > 0) throw new Error(`console.html must hold ${marker} exactly once`);
  return before + text + after;
};

const render = (mode: ConsoleMode) =>
  fill(
    fill(fill(fill(CONSOLE_TEMPLATE, '__REASONS__', REASONS.map((r) => `<option>${r}</option>`).join('')), '__AUTH__', mode), '__STYLE__', STYLE),
    '__SCRIPT__',
    SCRIPT,
  );

/** The page for each mode; they differ only in `data-auth` (the CSP hashes cover the script and style, the same in all three). */
export const CONSOLE_PAGES: Readonly<Record<ConsoleMode, string>> = { auth: render('auth'), open: render('open'), off: render('off') };

/** The page as an admin API without caller auth serves it (loopback, `wrangler dev` with FENCEGATE_ADMIN=on). */
export const CONSOLE_HTML = CONSOLE_PAGES.open;

let csp: Promise<string> | null = null;

async function sha256Base64(text: string): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text)));
  let bin = '';
  for (const b of d) bin += String.fromCharCode(b);
  return btoa(bin);
}

/**
 * The page, with a CSP that allows exactly its own inline script and style
 * (by hash), API calls to this origin, and nothing else: no framing, no
 * plugins, no form posts elsewhere. Exports are fetched with the token and
 * saved through an `<a download>` on a blob URL: a download, not a fetch
 * or an image, so the policy needs nothing more for it.
 */
export async function consoleResponse(mode: ConsoleMode = 'open'): Promise<Response> {
  csp ??= (async () =>
    [
      "default-src 'none'",
      `script-src 'sha256-${await sha256Base64(SCRIPT)}'`,
      `style-src 'sha256-${await sha256Base64(STYLE)}'`,
      "connect-src 'self'",
      "img-src 'self' data:",
      "base-uri 'none'",
      "form-action 'none'",
      "frame-ancestors 'none'",
    ].join('; '))();
  return new Response(CONSOLE_PAGES[mode], {
    headers: {
      'content-type': 'text/html; charset=utf-8',
      'content-security-policy': await csp,
      'x-content-type-options': 'nosniff',
      'referrer-policy': 'no-referrer',
      'cache-control': 'no-store',
    },
  });
}
