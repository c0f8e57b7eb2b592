(function () {
  'use strict';
  // The entity view (current fence, fence history as a timeline, in flight),
  // the records waiting for an operator with their resolve form, and the
  // operator-action log.
  var fg = window.fencegateConsole = window.fencegateConsole || { init: [], load: [] };
  var $ = function (id) { return fg.$(id); };
  var state = { resolving: null };
  var scopeText = function (scope) { return scope.split('\u0000').join(' / '); };

  function loadEntity() {
    var entity = $('ent-input').value.trim();
    if (!entity || !fg.need()) return Promise.resolve();
    var tbody = $('ent-history').tBodies[0];
    fg.clear(tbody);
    $('ent-info').hidden = true;
    return fg.api('entities/' + encodeURIComponent(entity)).then(function (e) {
      $('ent-name').textContent = e.entity;
      $('ent-fence').textContent = e.fence === null ? '(none)' : e.fence;
      $('ent-accepted').textContent = e.accepted_at;
      $('ent-inflight').textContent = e.inflight ? 'yes, until ' + e.inflight.until : 'no';
      $('ent-info').hidden = false;
      var history = e.history || [];
      history.forEach(function (h) {
        var tr = document.createElement('tr');
        [h.fence, h.at, h.caller].forEach(function (v) { fg.cell(tr, v); });
        fg.cell(tr, h.request_id, 'mono');
        tbody.appendChild(tr);
      });
      fg.chart.timeline($('ent-timeline'), history);
      fg.setStatus(e.history_next_cursor ? 'showing the latest ' + history.length + ' fences of ' + e.entity : '');
    }).catch(fg.fail);
  }

  fg.showEntity = function (entity) {
    $('ent-input').value = entity;
    $('entity').scrollIntoView();
    return loadEntity();
  };

  function loadUnknown() {
    var tbody = $('unk-table').tBodies[0];
    return fg.api('idempotency?state=outcome_unknown&limit=100').then(function (page) {
      fg.clear(tbody);
      page.items.forEach(function (r) {
        var tr = document.createElement('tr');
        [r.key, scopeText(r.scope), r.entity, r.fence, r.created_at].forEach(function (v) { fg.cell(tr, v); });
        var td = fg.cell(tr, '');
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
      fg.setStatus('');
    }).catch(fg.fail);
  }

  function openResolve(r) {
    state.resolving = r;
    $('res-key').textContent = r.key + ' (' + scopeText(r.scope) + ')';
    $('resolve-form').hidden = false;
    syncOutcome();
  }

  function syncOutcome() {
    $('res-response').hidden = $('res-outcome').value !== 'completed';
  }

  function submitResolve(ev) {
    ev.preventDefault();
    var r = state.resolving;
    if (!r) return;
    // created_at: the attempt on screen, not a later one that reused the key after a release.
    var body = { scope: r.scope, created_at: r.created_at, outcome: $('res-outcome').value };
    if (body.outcome === 'completed') {
      body.response = {
        status: Number($('res-status').value),
        headers: { 'content-type': $('res-ctype').value || 'application/json' },
        body: $('res-body').value
      };
    }
    var note = $('res-note').value.trim();
    if (note) body.note = note;
    return fg.api('idempotency/' + encodeURIComponent(r.key) + '/resolve', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body)
    }).then(function (res) {
      $('resolve-form').hidden = true;
      state.resolving = null;
      var message = 'resolved ' + res.action.key + ' as ' + res.action.action.replace('resolve-', '') + ' by ' + (res.action.operator || 'anonymous');
      // Reload the lists first: their success clears the status line, and
      // the operator must still see what was done.
      return Promise.all([loadUnknown(), loadActions()]).then(function () { fg.setStatus(message, 'ok'); });
    }).catch(fg.fail);
  }

  function loadActions() {
    var tbody = $('act-table').tBodies[0];
    return fg.api('operator-actions?limit=50').then(function (page) {
      fg.clear(tbody);
      page.items.forEach(function (a) {
        var tr = document.createElement('tr');
        [a.at, a.action, a.key, a.entity, a.fence, a.status, a.operator || '(anonymous)'].forEach(function (v) { fg.cell(tr, v); });
        fg.cell(tr, a.note, 'cut').title = a.note || '';
        fg.cell(tr, a.request_id, 'mono');
        tbody.appendChild(tr);
      });
      $('act-empty').hidden = page.items.length > 0;
    }).catch(fg.fail);
  }

  fg.init.push(function () {
    $('ent-form').addEventListener('submit', function (ev) { ev.preventDefault(); loadEntity(); });
    $('unk-refresh').addEventListener('click', function () { if (fg.need()) loadUnknown(); });
    $('act-refresh').addEventListener('click', function () { if (fg.need()) loadActions(); });
    $('res-outcome').addEventListener('change', syncOutcome);
    $('resolve-form').addEventListener('submit', submitResolve);
    $('res-cancel').addEventListener('click', function () { $('resolve-form').hidden = true; state.resolving = null; });
  });
  fg.load.push(loadUnknown, loadActions);
})();
