(function () {
  'use strict';
  // The console's core: the session, API calls, small DOM helpers, and
  // start-up. The views (chart.js, rejections.js, records.js) register on
  // `fg` and are started from here once the page has loaded.
  var fg = (window.fencegateConsole = window.fencegateConsole || { init: [], load: [] });
  var KEY = 'fencegate.token';
  var $ = (fg.$ = function (id) {
    return document.getElementById(id);
  });

  // How the admin API is guarded, rendered into the page by the server
  // (page.ts): known before any request, so that with auth on nothing is
  // asked (and logged as unauthorized) before the operator signs in.
  fg.mode = function () {
    return document.body.getAttribute('data-auth');
  };

  function token() {
    return fg.mode() === 'auth' ? sessionStorage.getItem(KEY) || '' : '';
  }

  // Whether the API may be called now: never when it is off, and with auth only with a token.
  fg.ready = function () {
    return fg.mode() === 'open' || (fg.mode() === 'auth' && token() !== '');
  };

  // For a button: whether it may call the API, saying why not when it may not.
  fg.need = function () {
    if (fg.ready()) return true;
    fg.setStatus(fg.mode() === 'off' ? 'the admin API is disabled on this gateway' : 'sign in with a token first', 'error');
    return false;
  };

  fg.setStatus = function (text, kind) {
    var s = $('status');
    s.textContent = text;
    s.className = kind || '';
  };

  function showWho() {
    var mode = fg.mode();
    $('signin').hidden = mode !== 'auth';
    if (mode === 'open') {
      $('whoami').textContent = 'no auth configured: loopback only';
      return;
    }
    if (mode === 'off') {
      $('whoami').textContent = 'admin API disabled: no auth configured and not on loopback';
      return;
    }
    var t = token();
    if (!t) {
      $('whoami').textContent = 'not signed in';
      return;
    }
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

  // `bearer`: the token to send, when it is not the session's (the sign-in check).
  function request(path, init, bearer) {
    init = init || {};
    var headers = init.headers || {};
    var t = bearer === undefined ? token() : bearer;
    if (t) headers['Authorization'] = 'Bearer ' + t;
    init.headers = headers;
    // Relative: the page is served at <adminPrefix>/ (or /console) and the API at <adminPrefix>/v1/.
    return fetch('v1/' + path, init).then(function (res) {
      return res.text().then(function (text) {
        if (res.ok) return text;
        var body = null;
        try {
          body = text ? JSON.parse(text) : null;
        } catch (e) {
          body = null;
        }
        var why = (body && body.title + (body.detail ? ': ' + body.detail : '')) || res.statusText;
        var msg = res.status + ' ' + why;
        if (res.status === 401) msg += ' (sign in with a token)';
        var err = new Error(msg);
        err.status = res.status;
        err.why = why;
        throw err;
      });
    });
  }

  // Every API call: bearer token, JSON or problem+json back.
  fg.api = function (path, init) {
    return request(path, init).then(function (text) {
      return text ? JSON.parse(text) : null;
    });
  };

  // The raw text of an answer (the CSV and NDJSON exports).
  fg.apiText = request;

  fg.cell = function (tr, text, className) {
    var td = document.createElement('td');
    td.textContent = text === null || text === undefined ? '' : String(text);
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  };

  fg.clear = function (node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  };

  fg.fail = function (e) {
    fg.setStatus(e.message, 'error');
  };

  // Loads every view (after sign-in, or at once without auth).
  function loadAll() {
    if (!fg.ready()) return Promise.resolve();
    return Promise.all(
      fg.load.map(function (f) {
        return f();
      }),
    );
  }

  document.addEventListener('DOMContentLoaded', function () {
    fg.init.forEach(function (f) {
      f();
    });
    $('signin').addEventListener('submit', function (ev) {
      ev.preventDefault();
      var t = $('token').value.trim();
      $('token').value = '';
      sessionStorage.removeItem(KEY);
      showWho();
      if (!t) {
        fg.setStatus('signed out');
        return;
      }
      // One request with the new token before calling it signed in: a token
      // the API refuses is one audit row (unauthorized or forbidden), not
      // one per view, and the operator stays signed out.
      fg.setStatus('checking the token…');
      $('sign-in').disabled = true;
      request('operator-actions?limit=1', {}, t)
        .then(
          function () {
            sessionStorage.setItem(KEY, t);
            showWho();
            fg.setStatus('');
            return loadAll();
          },
          function (e) {
            fg.setStatus('token refused: ' + (e.why || e.message), 'error');
          },
        )
        .then(function () {
          $('sign-in').disabled = false;
        });
    });
    $('sign-out').addEventListener('click', function () {
      sessionStorage.removeItem(KEY);
      showWho();
      fg.setStatus('signed out');
    });
    showWho();
    var done = loadAll();
    document.body.setAttribute('data-ready', 'true');
    done.then(function () {
      document.body.setAttribute('data-loaded', 'true');
    });
  });
})();
