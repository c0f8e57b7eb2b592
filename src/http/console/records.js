(function () {
  'use strict';
  // The entity view (current fence, fence history as a timeline, in flight,
  // and its whole story in time order: fences accepted, commands and how each
  // ended (the command log, with its status: 502, 504, 413, entity-busy
  // included), refusals, unknown outcomes, and what operators and the
  // reconciler settled), the
  // records waiting for an operator with their resolve form and its
  // confirmation, and the operator-action log.
  var fg = (window.fencegateConsole = window.fencegateConsole || { init: [], load: [] });
  var $ = function (id) {
    return fg.$(id);
  };
  var state = { resolving: null };
  var scopeText = function (scope) {
    return scope.split('\u0000').join(' / ');
  };

  // Pages of a list endpoint, following next_cursor up to `pages` pages.
  function pages(path, pagesLeft, items, cursor) {
    var sep = path.indexOf('?') < 0 ? '?' : '&';
    return fg.api(path + (cursor ? sep + 'cursor=' + encodeURIComponent(cursor) : '')).then(function (page) {
      items.push.apply(items, page.items);
      if (page.next_cursor && pagesLeft > 1) return pages(path, pagesLeft - 1, items, page.next_cursor);
      return { items: items, more: page.next_cursor !== null };
    });
  }

  function loadEntity() {
    var entity = $('ent-input').value.trim();
    if (!entity || !fg.need()) return Promise.resolve();
    var tbody = $('ent-history').tBodies[0];
    fg.clear(tbody);
    fg.clear($('ent-story').tBodies[0]);
    $('ent-info').hidden = true;
    // The entity, its commands (the command log filtered by entity), its
    // refusals (the rejection log filtered by entity), the records of it that
    // wait for an operator and the operator actions on it (both filtered
    // here: the API lists them for every entity).
    return Promise.all([
      // Unknown to the gateway (no fence ever accepted, or forgotten after
      // its retention): its refusals and records may still tell its story.
      fg.api('entities/' + encodeURIComponent(entity)).catch(function (err) {
        if (err.status !== 404) throw err;
        return { entity: entity, fence: null, accepted_at: null, inflight: null, history: [], history_next_cursor: null, unknown: true };
      }),
      pages('rejections?limit=1000&entity=' + encodeURIComponent(entity), 1, [], null),
      pages('idempotency?state=outcome_unknown&limit=1000', 5, [], null),
      pages('commands?limit=1000&entity=' + encodeURIComponent(entity), 1, [], null),
      pages('operator-actions?limit=1000', 2, [], null),
    ])
      .then(function (got) {
        var e = got[0],
          refusals = got[1],
          unknown = got[2].items.filter(function (r) {
            return r.entity === e.entity;
          }),
          commands = got[3],
          actions = got[4].items.filter(function (a) {
            return a.entity === e.entity;
          });
        var history = e.history || [];
        // When the current fence was accepted: its row in the fence history.
        // The entity's accepted_at is when it was last accepted (a later
        // forwarded request at the same fence moves it; the retention runs
        // from it), shown beside it when it differs.
        var current = history.filter(function (h) {
          return h.fence === e.fence;
        })[0];
        $('ent-name').textContent = e.entity;
        $('ent-fence').textContent = e.unknown ? '(none: no fence accepted, or forgotten after its retention)' : e.fence === null ? '(none)' : e.fence;
        $('ent-accepted').textContent = current ? current.at : e.accepted_at || '';
        $('ent-last').textContent = current && current.at !== e.accepted_at ? e.accepted_at : '';
        $('ent-last-row').hidden = $('ent-last').textContent === '';
        $('ent-inflight').textContent = e.inflight ? 'yes, until ' + e.inflight.until : 'no';
        $('ent-info').hidden = false;
        history.forEach(function (h) {
          var tr = document.createElement('tr');
          [h.fence, h.at, h.caller].forEach(function (v) {
            fg.cell(tr, v);
          });
          fg.cell(tr, h.request_id, 'mono');
          tbody.appendChild(tr);
        });
        fg.chart.timeline($('ent-timeline'), history, refusals.items);
        story(e, history, refusals.items, unknown, commands.items, actions);
        var notes = [];
        if (commands.more) notes.push('the latest ' + commands.items.length + ' commands');
        if (e.history_next_cursor) notes.push('the latest ' + history.length + ' fences');
        if (refusals.more) notes.push('the latest ' + refusals.items.length + ' refusals');
        fg.setStatus(notes.length ? 'showing ' + notes.join(' and ') + ' of ' + e.entity : '');
      })
      .catch(fg.fail);
  }

  // What a command-log row says happened, in an auditor's words.
  function commandWhat(c) {
    var status = c.status === null ? '' : ' ' + c.status;
    if (c.outcome === 'outcome_unknown') return 'outcome unknown:' + status + ' ' + c.decision;
    if (c.outcome === 'completed') return 'completed:' + status;
    if (c.outcome === 'released') return 'released:' + status + (c.decision && c.decision !== 'forwarded-released' ? ' ' + c.decision : ' (not processed)');
    return c.outcome + ':' + status;
  }

  // The entity's whole story in time order, oldest first: fences accepted,
  // commands (when each ended, with the status its caller got), requests
  // refused, requests whose outcome is unknown (at their creation), and the
  // resolutions of operators and of the reconciler.
  function story(e, history, refusals, unknown, commands, actions) {
    var events = [];
    (commands || []).forEach(function (c) {
      events.push({
        at: c.at,
        kind: 'command',
        what: commandWhat(c),
        fence: c.fence,
        key: c.idempotency_key,
        caller: c.caller || (c.scope ? scopeText(c.scope) : c.route),
        request: c.request_id,
        detail: [c.route, c.method, c.path, c.upstream_ms === null ? null : 'upstream ' + c.upstream_ms + ' ms', c.tool ? 'tool ' + c.tool : null]
          .filter(function (v) {
            return v;
          })
          .join(' '),
        status: c.status,
        outcome: c.outcome,
      });
    });
    (actions || []).forEach(function (a) {
      var reconciler = a.operator === 'reconciler';
      events.push({
        at: a.at,
        kind: reconciler ? 'reconciled' : 'resolved',
        what: (reconciler ? 'reconciled: ' : 'resolved: ') + a.action.replace(/^resolve-/, '') + (a.status !== null ? ' ' + a.status : ''),
        fence: a.fence,
        key: a.key,
        caller: a.operator,
        request: a.request_id,
        detail: a.note || '',
      });
    });
    history.forEach(function (h) {
      events.push({
        at: h.at,
        kind: 'fence',
        what: 'fence ' + h.fence + ' accepted',
        fence: h.fence,
        key: '',
        caller: h.caller,
        request: h.request_id,
        detail: '',
      });
    });
    refusals.forEach(function (r) {
      events.push({
        at: r.at,
        kind: 'refusal',
        what: 'refused: ' + r.reason,
        fence: r.presented_fence,
        key: r.idempotency_key,
        caller: r.caller,
        request: r.request_id,
        detail: r.detail || (r.current_fence !== null ? 'current fence ' + r.current_fence : ''),
        row: r,
      });
    });
    unknown.forEach(function (r) {
      events.push({
        at: r.created_at,
        kind: 'unknown',
        what: 'outcome unknown',
        fence: r.fence,
        key: r.key,
        caller: scopeText(r.scope),
        request: '',
        detail: 'waits for an operator',
        record: r,
      });
    });
    // ISO times of one format sort as text; ties keep the order above.
    events.sort(function (a, b) {
      return a.at < b.at ? -1 : a.at > b.at ? 1 : 0;
    });
    var tbody = $('ent-story').tBodies[0];
    events.forEach(function (ev) {
      var tr = document.createElement('tr');
      tr.className = 'ev-' + ev.kind;
      tr.setAttribute('data-kind', ev.kind);
      if (ev.status !== undefined && ev.status !== null) tr.setAttribute('data-status', String(ev.status));
      if (ev.outcome) tr.setAttribute('data-outcome', ev.outcome);
      fg.cell(tr, ev.at);
      fg.cell(tr, ev.what);
      fg.cell(tr, ev.fence);
      fg.cell(tr, ev.key, 'cut').title = ev.key || '';
      fg.cell(tr, ev.caller, 'cut').title = ev.caller || '';
      fg.cell(tr, ev.request, 'mono cut').title = ev.request || '';
      var td = fg.cell(tr, ev.detail, 'rest');
      td.title = ev.detail || '';
      if (ev.record) {
        var b = document.createElement('button');
        b.type = 'button';
        b.className = 'resolve';
        b.textContent = 'Resolve';
        b.setAttribute('data-key', ev.record.key);
        b.addEventListener('click', function () {
          openResolve(ev.record);
        });
        td.insertBefore(document.createTextNode(' '), td.firstChild);
        td.insertBefore(b, td.firstChild);
      }
      tbody.appendChild(tr);
    });
    $('ent-story-empty').hidden = events.length > 0;
  }

  fg.showEntity = function (entity) {
    $('ent-input').value = entity;
    $('entity').scrollIntoView();
    return loadEntity();
  };

  // A duration as the table shows it: whole seconds, minutes, hours or days.
  function ageText(ms) {
    var s = Math.max(0, Math.floor(ms / 1000));
    if (s < 120) return s + 's';
    if (s < 7200) return Math.floor(s / 60) + 'm';
    if (s < 172800) return Math.floor(s / 3600) + 'h';
    return Math.floor(s / 86400) + 'd';
  }

  // The status query's last answer that settled nothing (DESIGN §3.12), how long ago (this
  // browser's clock: display only), and whether the reconciler gave the record up.
  function reconcileText(r, now) {
    var last = r.last_reconcile ? r.last_reconcile.result + ', ' + ageText(now - Date.parse(r.last_reconcile.at)) + ' ago' : '';
    if (r.reconcile === 'gave-up') last = last ? last + ' (gave up)' : 'gave up';
    return last;
  }

  function loadUnknown() {
    var tbody = $('unk-table').tBodies[0];
    return fg
      .api('idempotency?state=outcome_unknown&limit=100')
      .then(function (page) {
        fg.clear(tbody);
        var now = Date.now();
        page.items.forEach(function (r) {
          var tr = document.createElement('tr');
          tr.setAttribute('data-key', r.key);
          [r.key, scopeText(r.scope), r.entity, r.fence, r.created_at, ageText(now - Date.parse(r.created_at)), reconcileText(r, now)].forEach(function (v) {
            fg.cell(tr, v);
          });
          var td = fg.cell(tr, '');
          var b = document.createElement('button');
          b.type = 'button';
          b.className = 'resolve';
          b.textContent = 'Resolve';
          b.setAttribute('data-key', r.key);
          b.addEventListener('click', function () {
            openResolve(r);
          });
          td.appendChild(b);
          tbody.appendChild(tr);
        });
        $('unk-empty').hidden = page.items.length > 0;
        fg.setStatus('');
      })
      .catch(fg.fail);
  }

  function openResolve(r) {
    state.resolving = r;
    $('res-key').textContent = r.key + ' (' + scopeText(r.scope) + ')';
    $('resolve-form').hidden = false;
    $('res-confirm').hidden = true;
    $('res-submit').disabled = false;
    syncOutcome();
    $('resolve-form').scrollIntoView({ block: 'nearest' });
  }

  function closeResolve() {
    $('resolve-form').hidden = true;
    $('res-confirm').hidden = true;
    state.resolving = null;
  }

  function syncOutcome() {
    $('res-response').hidden = $('res-outcome').value !== 'completed';
  }

  // The request the form describes, for the confirmation and then the API.
  function resolution() {
    var r = state.resolving;
    // created_at: the attempt on screen, not a later one that reused the key after a release.
    var body = { scope: r.scope, created_at: r.created_at, outcome: $('res-outcome').value };
    if (body.outcome === 'completed') {
      body.response = {
        status: Number($('res-status').value),
        headers: { 'content-type': $('res-ctype').value || 'application/json' },
        body: $('res-body').value,
      };
    }
    var note = $('res-note').value.trim();
    if (note) body.note = note;
    return body;
  }

  // Submitting the form only shows what will be done; Confirm does it.
  function askResolve(ev) {
    ev.preventDefault();
    var r = state.resolving;
    if (!r) return;
    var body = resolution();
    var status = $('res-status');
    if (body.outcome === 'completed' && !status.checkValidity()) {
      fg.setStatus('status: ' + status.validationMessage, 'error');
      return;
    }
    var dl = $('res-what');
    fg.clear(dl);
    [
      ['key', r.key],
      ['scope', scopeText(r.scope)],
      ['created', r.created_at],
      [
        'outcome',
        body.outcome === 'completed'
          ? 'completed: it happened upstream; retries get this response'
          : 'released: it never happened; the next retry is forwarded',
      ],
      ['status', body.outcome === 'completed' ? String(body.response.status) : '(none: nothing is stored)'],
      ['note', body.note || ''],
    ].forEach(function (f) {
      var dt = document.createElement('dt'),
        dd = document.createElement('dd');
      dt.textContent = f[0];
      dd.textContent = f[1];
      dd.setAttribute('data-field', f[0]);
      dl.appendChild(dt);
      dl.appendChild(dd);
    });
    $('res-confirm').hidden = false;
    $('res-submit').disabled = true;
    $('res-confirm-yes').focus();
  }

  function submitResolve() {
    var r = state.resolving;
    if (!r) return Promise.resolve();
    var body = resolution();
    $('res-confirm-yes').disabled = true;
    return fg
      .api('idempotency/' + encodeURIComponent(r.key) + '/resolve', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      })
      .then(function (res) {
        closeResolve();
        var message = 'resolved ' + res.action.key + ' as ' + res.action.action.replace('resolve-', '') + ' by ' + (res.action.operator || 'anonymous');
        // Reload the lists first: their success clears the status line, and
        // the operator must still see what was done.
        return Promise.all([loadUnknown(), loadActions()]).then(function () {
          fg.setStatus(message, 'ok');
        });
      })
      .catch(function (e) {
        // Back to the form, to change it or cancel.
        $('res-confirm').hidden = true;
        $('res-submit').disabled = false;
        fg.fail(e);
      })
      .then(function () {
        $('res-confirm-yes').disabled = false;
      });
  }

  function loadActions() {
    var tbody = $('act-table').tBodies[0];
    return fg
      .api('operator-actions?limit=50')
      .then(function (page) {
        fg.clear(tbody);
        page.items.forEach(function (a) {
          var tr = document.createElement('tr');
          [a.at, a.action, a.key, a.entity, a.fence, a.status, a.operator || '(anonymous)'].forEach(function (v) {
            fg.cell(tr, v);
          });
          fg.cell(tr, a.note, 'cut').title = a.note || '';
          fg.cell(tr, a.request_id, 'mono');
          tbody.appendChild(tr);
        });
        $('act-empty').hidden = page.items.length > 0;
      })
      .catch(fg.fail);
  }

  fg.init.push(function () {
    $('ent-form').addEventListener('submit', function (ev) {
      ev.preventDefault();
      loadEntity();
    });
    $('unk-refresh').addEventListener('click', function () {
      if (fg.need()) loadUnknown();
    });
    $('act-refresh').addEventListener('click', function () {
      if (fg.need()) loadActions();
    });
    $('res-outcome').addEventListener('change', syncOutcome);
    $('resolve-form').addEventListener('submit', askResolve);
    $('res-confirm-yes').addEventListener('click', submitResolve);
    // Cancel on the confirmation: back to the form, nothing sent.
    $('res-confirm-no').addEventListener('click', function () {
      $('res-confirm').hidden = true;
      $('res-submit').disabled = false;
    });
    // Any change to the form asks again.
    $('resolve-form').addEventListener('input', function () {
      $('res-confirm').hidden = true;
      $('res-submit').disabled = false;
    });
    $('res-cancel').addEventListener('click', closeResolve);
  });
  fg.load.push(loadUnknown, loadActions);
})();
