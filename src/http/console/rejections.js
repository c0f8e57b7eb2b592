(function () {
  'use strict';
  // The refusals view: one window of the rejection log, fetched with the
  // filters the API takes (window, entity, reason, caller), narrowed in the
  // browser by those it does not (key, request id, route), then charted,
  // counted and listed; and the CSV / NDJSON export of the same filter.
  var fg = (window.fencegateConsole = window.fencegateConsole || { init: [], load: [] });
  var $ = function (id) {
    return fg.$(id);
  };
  var UNITS = { ms: 1, s: 1e3, m: 60e3, h: 3600e3, d: 86400e3 };
  // Rows fetched for one window (5 pages): enough for the chart and counts
  // of a busy day; the export has no such cap.
  var MAX_ROWS = 5000;
  var PAGE_ROWS = 200;
  var state = { rows: [], matched: [], shown: 0, capped: false, start: 0, end: 0, loads: 0 };

  // "2h" or an ISO time, as the API reads `since` / `until`; ms, or NaN.
  function timeOf(v, now) {
    var m = /^(\d{1,12})(ms|s|m|h|d)$/.exec(v);
    if (m) return now - Number(m[1]) * UNITS[m[2]];
    return /^\d{4}-\d{2}-\d{2}/.test(v) ? Date.parse(v) : NaN;
  }

  function serverParams() {
    var p = new URLSearchParams();
    var w = $('rej-window').value;
    if (w === 'custom') {
      ['since', 'until'].forEach(function (f) {
        var v = $('rej-' + f).value.trim();
        if (v) p.set(f, v);
      });
    } else {
      p.set('since', w);
    }
    ['entity', 'reason', 'caller'].forEach(function (f) {
      var v = $('rej-' + f).value.trim();
      if (v) p.set(f, v);
    });
    return p;
  }

  // The filters the API does not take, applied to each fetched row.
  function clientFilter() {
    var key = $('rej-key').value.trim(),
      req = $('rej-request').value.trim(),
      route = $('rej-route').value.trim();
    if (!key && !req && !route) return null;
    return function (r) {
      if (key && (r.idempotency_key || '').indexOf(key) < 0) return false;
      if (req && (r.request_id || '').indexOf(req) < 0 && (r.client_request_id || '').indexOf(req) < 0) return false;
      if (route && ((r.method || '') + ' ' + (r.path || '')).indexOf(route) < 0) return false;
      return true;
    };
  }

  function fetchWindow(params, rows, cursor) {
    var p = new URLSearchParams(params);
    p.set('limit', '1000');
    if (cursor) p.set('cursor', cursor);
    return fg.api('rejections?' + p.toString()).then(function (page) {
      rows.push.apply(rows, page.items);
      if (page.next_cursor && rows.length < MAX_ROWS) return fetchWindow(params, rows, page.next_cursor);
      return { rows: rows.slice(0, MAX_ROWS), capped: page.next_cursor !== null || rows.length > MAX_ROWS };
    });
  }

  function load() {
    var params = serverParams();
    var now = Date.now();
    return fetchWindow(params, [], null)
      .then(function (got) {
        var since = params.get('since'),
          until = params.get('until');
        state.end = until ? timeOf(until, now) : now;
        state.start = since ? timeOf(since, now) : got.rows.length ? Date.parse(got.rows[got.rows.length - 1].at) : state.end - 3600e3;
        state.rows = got.rows;
        state.capped = got.capped;
        var keep = clientFilter();
        state.matched = keep ? got.rows.filter(keep) : got.rows;
        render();
        // Counts finished loads, for whoever waits on one (the tests).
        $('rej-count').setAttribute('data-loads', String(++state.loads));
        fg.setStatus('');
      })
      .catch(fg.fail);
  }

  function countInto(tableId, rows, keyOf) {
    var counts = {};
    rows.forEach(function (r) {
      var k = keyOf(r);
      counts[k] = (counts[k] || 0) + 1;
    });
    var tbody = $(tableId).tBodies[0];
    fg.clear(tbody);
    Object.keys(counts)
      .sort(function (a, b) {
        return counts[b] - counts[a] || (a < b ? -1 : 1);
      })
      .forEach(function (k) {
        var tr = document.createElement('tr');
        fg.cell(tr, k).title = k;
        fg.cell(tr, counts[k], 'num');
        tbody.appendChild(tr);
      });
  }

  var routeOf = function (r) {
    return (r.method || '-') + ' ' + (r.path || '-');
  };

  function render() {
    var rows = state.matched;
    $('rej-count').textContent =
      rows.length +
      (rows.length === 1 ? ' refusal matches' : ' refusals match') +
      (rows.length !== state.rows.length ? ' (of ' + state.rows.length + ' in the window)' : '') +
      (state.capped ? '; only the newest ' + MAX_ROWS + ' rows of the window were fetched (the export has them all)' : '');
    fg.chart.bars($('chart'), rows, state.start, state.end);
    countInto('count-reason', rows, function (r) {
      return r.reason;
    });
    countInto('count-route', rows, routeOf);
    countInto('count-caller', rows, function (r) {
      return r.caller || '(anonymous)';
    });
    fg.clear($('rej-table').tBodies[0]);
    $('rej-detail').hidden = true;
    state.shown = 0;
    more();
  }

  function more() {
    var tbody = $('rej-table').tBodies[0];
    state.matched.slice(state.shown, state.shown + PAGE_ROWS).forEach(function (r) {
      var tr = document.createElement('tr');
      tr.setAttribute('data-id', r.id);
      // Caller-chosen text (entity, key, path) is cut with an ellipsis rather
      // than wrapped, the whole of it on hover and in the row's details.
      [
        [r.id],
        [r.at],
        [r.reason],
        [r.entity, 'cut'],
        [r.presented_fence],
        [r.current_fence],
        [r.idempotency_key, 'cut'],
        [r.caller, 'cut'],
        [routeOf(r), 'cut'],
      ].forEach(function (v) {
        var td = fg.cell(tr, v[0], v[1]);
        if (v[1]) td.title = td.textContent;
      });
      fg.cell(tr, r.request_id, 'mono');
      // The digest is long: its first 12 hex digits here, all of it on hover and in the row's details.
      fg.cell(tr, r.payload_sha256 ? r.payload_sha256.slice(0, 12) + '…' : '', 'mono').title = r.payload_sha256 || '';
      fg.cell(tr, r.detail, 'rest').title = r.detail || '';
      // The columns are fixed (console.css): any cell may be cut, so each has its whole text on hover.
      Array.prototype.forEach.call(tr.cells, function (td) {
        if (!td.title) td.title = td.textContent;
      });
      tr.addEventListener('click', function () {
        detail(r, tr);
      });
      tbody.appendChild(tr);
    });
    state.shown = tbody.rows.length;
    $('rej-more').hidden = state.shown >= state.matched.length;
  }

  // Every field of one row, in full.
  function detail(r, tr) {
    var dl = $('rej-detail');
    fg.clear(dl);
    Object.keys(r).forEach(function (k) {
      var dt = document.createElement('dt'),
        dd = document.createElement('dd');
      dt.textContent = k;
      dd.textContent = r[k] === null ? '' : String(r[k]);
      dd.setAttribute('data-field', k);
      dl.appendChild(dt);
      dl.appendChild(dd);
    });
    if (r.entity) {
      var b = document.createElement('button');
      b.type = 'button';
      b.textContent = 'Show this entity';
      b.addEventListener('click', function () {
        fg.showEntity(r.entity);
      });
      dl.appendChild(b);
    }
    dl.hidden = false;
    Array.prototype.forEach.call(tr.parentNode.rows, function (x) {
      x.classList.toggle('picked', x === tr);
    });
  }

  /**
   * The export of the current filter. The API's own export when every filter
   * is one it takes; otherwise the NDJSON export of the server-side filters,
   * narrowed here line by line, and for CSV the lines of the CSV export whose
   * id (the first column, digits) was kept.
   */
  function exportAs(format) {
    var params = serverParams();
    params.set('format', format);
    var keep = clientFilter();
    var done;
    if (!keep) {
      done = fg.apiText('rejections?' + params.toString());
    } else {
      var nd = new URLSearchParams(params);
      nd.set('format', 'ndjson');
      done = fg.apiText('rejections?' + nd.toString()).then(function (text) {
        var ids = {},
          lines = text.split('\n').filter(function (l) {
            return l !== '' && keep(JSON.parse(l));
          });
        lines.forEach(function (l) {
          ids[JSON.parse(l).id] = true;
        });
        if (format === 'ndjson')
          return lines
            .map(function (l) {
              return l + '\n';
            })
            .join('');
        return fg.apiText('rejections?' + params.toString()).then(function (csv) {
          var out = csv.split('\r\n');
          return [out[0]]
            .concat(
              out.slice(1).filter(function (l) {
                return ids[l.split(',')[0]] === true;
              }),
            )
            .map(function (l) {
              return l + '\r\n';
            })
            .join('');
        });
      });
    }
    return done
      .then(function (text) {
        var blob = new Blob([text], { type: format === 'csv' ? 'text/csv' : 'application/x-ndjson' });
        var a = document.createElement('a');
        a.href = URL.createObjectURL(blob);
        a.download = 'fencegate-rejections-' + new Date().toISOString().replace(/[:.]/g, '-') + '.' + format;
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(function () {
          URL.revokeObjectURL(a.href);
        }, 10000);
        fg.setStatus('exported ' + (format === 'csv' ? Math.max(text.split('\r\n').length - 2, 0) : text.split('\n').length - 1) + ' rows as ' + format, 'ok');
      })
      .catch(fg.fail);
  }

  fg.init.push(function () {
    $('rej-window').addEventListener('change', function () {
      var custom = $('rej-window').value === 'custom';
      $('rej-since').disabled = !custom;
      $('rej-until').disabled = !custom;
    });
    $('rej-form').addEventListener('submit', function (ev) {
      ev.preventDefault();
      if (fg.need()) load();
    });
    $('rej-more').addEventListener('click', more);
    $('rej-csv').addEventListener('click', function () {
      if (fg.need()) exportAs('csv');
    });
    $('rej-ndjson').addEventListener('click', function () {
      if (fg.need()) exportAs('ndjson');
    });
  });
  fg.load.push(load);
})();
