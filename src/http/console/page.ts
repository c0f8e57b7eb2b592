/**
 * The operator console: one static HTML page with plain JavaScript, served at
 * `<adminPrefix>/console`. It holds no data itself; every call goes to the
 * `/v1` audit API with the bearer token the operator signs in with (kept in
 * sessionStorage: gone when the tab closes). Everything from the server is
 * written with `textContent`, never as HTML: entities, keys and paths are
 * chosen by callers. The script and style are inline, allowed by their hashes
 * in the Content-Security-Policy (see `consoleResponse`).
 *
 * The script below avoids backquotes and dollar-brace so it can live in this
 * TypeScript string unchanged.
 */
const STYLE = String.raw`
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{display:flex;gap:1rem;align-items:center;padding:.6rem 1rem;background:#1d2330;color:#fff}
header h1{font-size:1rem;margin:0;font-weight:600}
header form{display:flex;gap:.4rem;margin-left:auto;align-items:center}
header input{width:22rem}
#whoami{font-size:.85rem;opacity:.85}
main{padding:1rem;display:grid;gap:1rem}
section{background:#fff;border:1px solid #d8dce3;border-radius:6px;padding:.8rem 1rem}
section h2{font-size:1rem;margin:.1rem 0 .6rem}
form.filters{display:flex;flex-wrap:wrap;gap:.5rem;align-items:end}
label{display:flex;flex-direction:column;font-size:.8rem;gap:.15rem}
input,select,textarea,button{font:inherit;padding:.25rem .4rem}
button{cursor:pointer}
table{border-collapse:collapse;width:100%;margin-top:.6rem;font-size:.85rem}
th,td{text-align:left;padding:.25rem .4rem;border-bottom:1px solid #eceef2;vertical-align:top;word-break:break-all}
th{background:#f0f2f5;font-weight:600}
.muted{color:#6b7280}
#status{min-height:1.4em;padding:.3rem 1rem;font-size:.9rem}
#status.error{color:#b42318}
#status.ok{color:#067647}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem .8rem;margin:.4rem 0}
dt{font-weight:600}
#resolve-form{margin-top:.6rem;padding:.6rem;border:1px dashed #98a2b3;border-radius:6px;display:grid;gap:.4rem;max-width:40rem}
#resolve-form[hidden]{display:none}
textarea{min-height:4rem}
`;

const SCRIPT = String.raw`
(function () {
  'use strict';
  var KEY = 'fencegate.token';
  var $ = function (id) { return document.getElementById(id); };
  var state = { rejCursor: null, resolving: null };

  function token() { return sessionStorage.getItem(KEY) || ''; }

  function setStatus(text, kind) {
    var s = $('status');
    s.textContent = text;
    s.className = kind || '';
  }

  function showWho() {
    var t = token();
    if (!t) { $('whoami').textContent = 'not signed in'; return; }
    try {
      var part = t.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
      var claims = JSON.parse(atob(part + '==='.slice((part.length + 3) % 4)));
      var scopes = claims.scope || claims.scp || '';
      if (Array.isArray(scopes)) scopes = scopes.join(' ');
      $('whoami').textContent = 'signed in as ' + (claims.sub || '?') + ' (' + scopes + ')';
    } catch (e) {
      $('whoami').textContent = 'signed in (token not readable here)';
    }
  }

  // Every API call: bearer token, JSON or problem+json back.
  function api(path, init) {
    init = init || {};
    var headers = init.headers || {};
    if (token()) headers['Authorization'] = 'Bearer ' + token();
    init.headers = headers;
    return fetch('v1/' + path, init).then(function (res) {
      return res.text().then(function (text) {
        var body = null;
        try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
        if (!res.ok) {
          var msg = res.status + ' ' + ((body && (body.title + (body.detail ? ': ' + body.detail : ''))) || res.statusText);
          if (res.status === 401) msg += ' (sign in with a token)';
          var err = new Error(msg);
          err.status = res.status;
          throw err;
        }
        return body;
      });
    });
  }

  function cell(tr, text) {
    var td = document.createElement('td');
    td.textContent = text === null || text === undefined ? '' : String(text);
    tr.appendChild(td);
    return td;
  }

  function clear(tbody) { while (tbody.firstChild) tbody.removeChild(tbody.firstChild); }

  // Rejections.
  function rejQuery(cursor) {
    var p = new URLSearchParams();
    ['entity', 'reason', 'caller', 'since', 'until'].forEach(function (f) {
      var v = $('rej-' + f).value.trim();
      if (v) p.set(f, v);
    });
    p.set('limit', '50');
    if (cursor) p.set('cursor', cursor);
    return 'rejections?' + p.toString();
  }

  function loadRejections(more) {
    var tbody = $('rej-table').tBodies[0];
    if (!more) { clear(tbody); state.rejCursor = null; }
    return api(rejQuery(more ? state.rejCursor : null)).then(function (page) {
      page.items.forEach(function (r) {
        var tr = document.createElement('tr');
        [r.id, r.at, r.reason, r.entity, r.presented_fence, r.current_fence, r.idempotency_key, r.caller, r.method + ' ' + r.path, r.detail].forEach(function (v) { cell(tr, v); });
        tbody.appendChild(tr);
      });
      state.rejCursor = page.next_cursor;
      $('rej-more').hidden = !page.next_cursor;
      $('rej-count').textContent = tbody.rows.length + ' shown' + (page.next_cursor ? ', more available' : '');
      setStatus('');
    }).catch(function (e) { setStatus(e.message, 'error'); });
  }

  // Entity and its fence history.
  function loadEntity() {
    var entity = $('ent-input').value.trim();
    if (!entity) return;
    var tbody = $('ent-history').tBodies[0];
    clear(tbody);
    $('ent-info').hidden = true;
    return api('entities/' + encodeURIComponent(entity)).then(function (e) {
      $('ent-name').textContent = e.entity;
      $('ent-fence').textContent = e.fence === null ? '(none)' : e.fence;
      $('ent-accepted').textContent = e.accepted_at;
      $('ent-inflight').textContent = e.inflight ? 'until ' + e.inflight.until : 'no';
      $('ent-info').hidden = false;
      (e.history || []).forEach(function (h) {
        var tr = document.createElement('tr');
        [h.fence, h.at, h.caller, h.request_id].forEach(function (v) { cell(tr, v); });
        tbody.appendChild(tr);
      });
      setStatus('');
    }).catch(function (err) { setStatus(err.message, 'error'); });
  }

  // Records waiting for an operator.
  function loadUnknown() {
    var tbody = $('unk-table').tBodies[0];
    clear(tbody);
    return api('idempotency?state=outcome_unknown&limit=100').then(function (page) {
      page.items.forEach(function (r) {
        var tr = document.createElement('tr');
        [r.key, r.scope.split('\u0000').join(' / '), r.entity, r.fence, r.created_at].forEach(function (v) { cell(tr, v); });
        var td = cell(tr, '');
        var b = document.createElement('button');
        b.type = 'button';
        b.className = 'resolve';
        b.textContent = 'Resolve';
        b.setAttribute('data-key', r.key);
        b.addEventListener('click', function () { openResolve(r); });
        td.appendChild(b);
        tbody.appendChild(tr);
      });
      $('unk-empty').hidden = page.items.length > 0;
      setStatus('');
    }).catch(function (e) { setStatus(e.message, 'error'); });
  }

  function openResolve(r) {
    state.resolving = r;
    $('res-key').textContent = r.key + ' (' + r.scope.split('\u0000').join(' / ') + ')';
    $('resolve-form').hidden = false;
    syncOutcome();
  }

  function syncOutcome() {
    var completed = $('res-outcome').value === 'completed';
    $('res-response').hidden = !completed;
  }

  function submitResolve(ev) {
    ev.preventDefault();
    var r = state.resolving;
    if (!r) return;
    var body = { scope: r.scope, outcome: $('res-outcome').value };
    if (body.outcome === 'completed') {
      body.response = {
        status: Number($('res-status').value),
        headers: { 'content-type': $('res-ctype').value || 'application/json' },
        body: $('res-body').value
      };
    }
    var note = $('res-note').value.trim();
    if (note) body.note = note;
    return api('idempotency/' + encodeURIComponent(r.key) + '/resolve', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body)
    }).then(function (res) {
      $('resolve-form').hidden = true;
      state.resolving = null;
      var message = 'resolved ' + res.action.key + ' as ' + res.action.action.replace('resolve-', '') + ' by ' + (res.action.operator || 'anonymous');
      // Reload the list first: its success clears the status line, and the
      // operator must still see what was done.
      return loadUnknown().then(function () { setStatus(message, 'ok'); });
    }).catch(function (e) { setStatus(e.message, 'error'); });
  }

  document.addEventListener('DOMContentLoaded', function () {
    $('signin').addEventListener('submit', function (ev) {
      ev.preventDefault();
      var t = $('token').value.trim();
      if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY);
      $('token').value = '';
      showWho();
      loadRejections(false);
      loadUnknown();
    });
    $('sign-out').addEventListener('click', function () {
      sessionStorage.removeItem(KEY);
      showWho();
      setStatus('signed out');
    });
    $('rej-form').addEventListener('submit', function (ev) { ev.preventDefault(); loadRejections(false); });
    $('rej-more').addEventListener('click', function () { loadRejections(true); });
    $('ent-form').addEventListener('submit', function (ev) { ev.preventDefault(); loadEntity(); });
    $('unk-refresh').addEventListener('click', loadUnknown);
    $('res-outcome').addEventListener('change', syncOutcome);
    $('resolve-form').addEventListener('submit', submitResolve);
    $('res-cancel').addEventListener('click', function () { $('resolve-form').hidden = true; state.resolving = null; });
    showWho();
    if (token()) { loadRejections(false); loadUnknown(); }
    document.body.setAttribute('data-ready', 'true');
  });
})();
`;

const REASONS = ['stale-fence', 'idempotency-key-reused', 'outcome-unknown', 'invalid-fence-signature', 'fence-expired', 'unauthorized', 'forbidden', 'late-finish'];

const BODY = String.raw`
<header>
  <h1>fencegate console</h1>
  <span id="whoami">not signed in</span>
  <form id="signin" autocomplete="off">
    <input id="token" type="password" placeholder="bearer token (fencegate:audit, fencegate:admin to resolve)" aria-label="token">
    <button id="sign-in" type="submit">Sign in</button>
    <button id="sign-out" type="button">Sign out</button>
  </form>
</header>
<div id="status" role="status"></div>
<main>
  <section id="rejections">
    <h2>Rejections</h2>
    <form id="rej-form" class="filters">
      <label>entity <input id="rej-entity"></label>
      <label>reason <select id="rej-reason"><option value="">any</option>__REASONS__</select></label>
      <label>caller <input id="rej-caller"></label>
      <label>since <input id="rej-since" placeholder="2h or 2025-01-31T00:00Z" size="14"></label>
      <label>until <input id="rej-until" placeholder="ISO time or 10m" size="14"></label>
      <button id="rej-search" type="submit">Search</button>
      <span id="rej-count" class="muted"></span>
    </form>
    <table id="rej-table">
      <thead><tr><th>id</th><th>at</th><th>reason</th><th>entity</th><th>presented</th><th>current</th><th>key</th><th>caller</th><th>request</th><th>detail</th></tr></thead>
      <tbody></tbody>
    </table>
    <button id="rej-more" type="button" hidden>More</button>
  </section>
  <section id="entity">
    <h2>Entity</h2>
    <form id="ent-form" class="filters">
      <label>entity <input id="ent-input" placeholder="tool-job:42" size="30"></label>
      <button id="ent-go" type="submit">Show</button>
    </form>
    <div id="ent-info" hidden>
      <dl>
        <dt>entity</dt><dd id="ent-name"></dd>
        <dt>fence</dt><dd id="ent-fence"></dd>
        <dt>accepted at</dt><dd id="ent-accepted"></dd>
        <dt>in flight</dt><dd id="ent-inflight"></dd>
      </dl>
      <table id="ent-history">
        <thead><tr><th>fence</th><th>accepted at</th><th>caller</th><th>request id</th></tr></thead>
        <tbody></tbody>
      </table>
    </div>
  </section>
  <section id="unknown">
    <h2>Outcome unknown <button id="unk-refresh" type="button">Refresh</button></h2>
    <p class="muted">Requests that may have reached the upstream. Check with the upstream, then settle each one: <b>completed</b> stores the response it gave (retries get it back), <b>released</b> means it never happened (the next retry is forwarded).</p>
    <table id="unk-table">
      <thead><tr><th>key</th><th>route / caller</th><th>entity</th><th>fence</th><th>created</th><th></th></tr></thead>
      <tbody></tbody>
    </table>
    <p id="unk-empty" class="muted" hidden>Nothing waits for an operator.</p>
    <form id="resolve-form" hidden>
      <div>Resolve <b id="res-key"></b></div>
      <label>outcome <select id="res-outcome"><option value="completed">completed: it happened upstream</option><option value="released">released: it never happened</option></select></label>
      <div id="res-response">
        <label>status <input id="res-status" type="number" value="200" min="200" max="599"></label>
        <label>content-type <input id="res-ctype" value="application/json"></label>
        <label>response body (as the upstream gave it) <textarea id="res-body"></textarea></label>
      </div>
      <label>note <input id="res-note" placeholder="what you checked, ticket id"></label>
      <div><button id="res-submit" type="submit">Resolve</button> <button id="res-cancel" type="button">Cancel</button></div>
    </form>
  </section>
</main>
`;

export const CONSOLE_HTML =
  '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">' +
  '<meta name="referrer" content="no-referrer"><link rel="icon" href="data:,"><title>fencegate console</title>' +
  `<style>${STYLE}</style></head><body>` +
  BODY.replace('__REASONS__', REASONS.map((r) => `<option>${r}</option>`).join('')) +
  `<script>${SCRIPT}</script></body></html>\n`;

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
 * plugins, no form posts elsewhere.
 */
export async function consoleResponse(): Promise<Response> {
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
  return new Response(CONSOLE_HTML, {
    headers: {
      'content-type': 'text/html; charset=utf-8',
      'content-security-policy': await csp,
      'x-content-type-options': 'nosniff',
      'referrer-policy': 'no-referrer',
      'cache-control': 'no-store',
    },
  });
}
