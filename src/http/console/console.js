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
