(function () {
  'use strict';
  // A small hand-written SVG renderer: refusals over a window as stacked
  // bars by reason, and an entity's accepted fences as a step line. Built
  // with DOM calls (no markup from strings); text goes in with textContent.
  var fg = (window.fencegateConsole = window.fencegateConsole || { init: [], load: [] });
  var NS = 'http://www.w3.org/2000/svg';
  var W = 1000,
    H = 200,
    LEFT = 44,
    BOTTOM = 22,
    TOP = 8;
  // One colour per reason the rejection log can hold (RejectionReason in
  // src/store/types.ts; test/console/chart-colors.test.ts holds them apart).
  // The 400s of a malformed or missing header come in pairs of one hue,
  // dark for invalid and light for missing.
  var COLORS = {
    'stale-fence': '#d92d20',
    'idempotency-key-reused': '#f79009',
    'outcome-unknown': '#7a5af8',
    'invalid-fence-signature': '#c11574',
    'fence-expired': '#ee46bc',
    unauthorized: '#344054',
    forbidden: '#98a2b3',
    'late-finish': '#0ba5ec',
    'invalid-fence': '#1d4ed8',
    'missing-fence': '#93c5fd',
    'invalid-entity': '#15803d',
    'missing-entity': '#86efac',
    'invalid-idempotency-key': '#92400e',
    'missing-idempotency-key': '#facc15',
    'tool-denied': '#6b21a8',
  };
  // A reason this page does not know (a newer gateway's): grey, unlike any above.
  var OTHER = '#667085';
  var STEPS = [60e3, 5 * 60e3, 10 * 60e3, 15 * 60e3, 30 * 60e3, 3600e3, 2 * 3600e3, 3 * 3600e3, 6 * 3600e3, 12 * 3600e3, 86400e3, 2 * 86400e3, 7 * 86400e3];

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) {
      e.setAttribute(k, String(attrs[k]));
    });
    if (parent) parent.appendChild(e);
    return e;
  }

  function text(parent, x, y, s, anchor) {
    var t = el('text', { x: x, y: y, 'text-anchor': anchor || 'start' }, parent);
    t.textContent = s;
    return t;
  }

  function colorOf(reason) {
    return Object.hasOwn(COLORS, reason) ? COLORS[reason] : OTHER;
  }

  function short(ms, span) {
    var iso = new Date(ms).toISOString();
    return span > 12 * 3600e3 ? iso.slice(5, 16).replace('T', ' ') : iso.slice(11, 16);
  }

  // The smallest step that cuts the window into at most 60 bars.
  function stepFor(span) {
    for (var i = 0; i < STEPS.length; i++) if (span / STEPS[i] <= 60) return STEPS[i];
    return Math.ceil(span / 60);
  }

  /**
   * Refusals per time step and reason, stacked. `rows` are the audit API's
   * rejections ({at, reason}); `start`/`end` in ms. Every bar segment carries
   * data-reason and data-count, every legend entry data-total.
   */
  function bars(container, rows, start, end) {
    fg.clear(container);
    var span = Math.max(end - start, 60e3);
    var step = stepFor(span);
    var n = Math.max(1, Math.ceil(span / step));
    var buckets = [],
      totals = {},
      reasons = [];
    for (var i = 0; i < n; i++) buckets.push({});
    rows.forEach(function (r) {
      var t = Date.parse(r.at);
      if (!(t >= start && t <= end)) return;
      var b = buckets[Math.min(n - 1, Math.floor((t - start) / step))];
      b[r.reason] = (b[r.reason] || 0) + 1;
      if (!totals[r.reason]) {
        totals[r.reason] = 0;
        reasons.push(r.reason);
      }
      totals[r.reason]++;
    });
    reasons.sort();
    var max = 1;
    buckets.forEach(function (b) {
      var sum = 0;
      Object.keys(b).forEach(function (k) {
        sum += b[k];
      });
      if (sum > max) max = sum;
    });
    var svg = el('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'data-step-ms': step, 'data-buckets': n }, container);
    var plotW = W - LEFT - 4,
      plotH = H - TOP - BOTTOM,
      bw = plotW / n;
    el('line', { x1: LEFT, y1: TOP + plotH, x2: W - 4, y2: TOP + plotH, class: 'axis' }, svg);
    el('line', { x1: LEFT, y1: TOP + plotH / 2, x2: W - 4, y2: TOP + plotH / 2, class: 'grid' }, svg);
    text(svg, LEFT - 6, TOP + 10, String(max), 'end');
    text(svg, LEFT - 6, TOP + plotH, '0', 'end');
    text(svg, LEFT, H - 6, short(start, span));
    text(svg, LEFT + plotW / 2, H - 6, short(start + span / 2, span), 'middle');
    text(svg, W - 4, H - 6, short(end, span), 'end');
    buckets.forEach(function (b, i) {
      var y = TOP + plotH;
      reasons.forEach(function (reason) {
        var c = b[reason];
        if (!c) return;
        var h = (plotH * c) / max;
        y -= h;
        var rect = el(
          'rect',
          {
            x: (LEFT + i * bw + 1).toFixed(1),
            y: y.toFixed(1),
            width: Math.max(bw - 2, 1).toFixed(1),
            height: h.toFixed(1),
            fill: colorOf(reason),
            'data-reason': reason,
            'data-count': c,
          },
          svg,
        );
        el('title', {}, rect).textContent = reason + ': ' + c + ' from ' + new Date(start + i * step).toISOString();
      });
    });
    var legend = document.createElement('div');
    legend.className = 'legend';
    reasons.forEach(function (reason) {
      var item = document.createElement('span');
      item.setAttribute('data-reason', reason);
      item.setAttribute('data-total', String(totals[reason]));
      var sw = el('svg', { viewBox: '0 0 10 10' }, item);
      el('rect', { width: 10, height: 10, fill: colorOf(reason) }, sw);
      item.appendChild(document.createTextNode(reason + ' ' + totals[reason]));
      legend.appendChild(item);
    });
    if (reasons.length === 0) legend.appendChild(document.createTextNode('no refusals in this window'));
    container.appendChild(legend);
  }

  /**
   * An entity's accepted fences ({fence, at}, any order) as a step line with
   * one dot per fence, and its refusals ({at, reason, presented_fence}) as
   * crosses in their reason's colour, at the fence they presented (on the
   * axis when they presented none).
   */
  function timeline(container, history, refusals) {
    fg.clear(container);
    var pts = history
      .map(function (h) {
        return { t: Date.parse(h.at), f: Number(h.fence), h: h };
      })
      .sort(function (a, b) {
        return a.t - b.t;
      });
    var refused = (refusals || []).map(function (r) {
      return { t: Date.parse(r.at), f: r.presented_fence === null ? null : Number(r.presented_fence), r: r };
    });
    if (pts.length === 0 && refused.length === 0) return;
    var times = pts.concat(refused).map(function (p) {
      return p.t;
    });
    var fences = pts
      .concat(refused)
      .filter(function (p) {
        return p.f !== null && Number.isFinite(p.f);
      })
      .map(function (p) {
        return p.f;
      });
    var t0 = Math.min.apply(null, times),
      t1 = Math.max(Math.max.apply(null, times), t0 + 1000);
    var f0 = fences.length ? Math.min.apply(null, fences) : 0,
      f1 = Math.max(f0 + 1, fences.length ? Math.max.apply(null, fences) : 1);
    var svg = el('svg', { viewBox: '0 0 ' + W + ' 120', role: 'img' }, container);
    // Room above the highest dot for its label.
    var top = TOP + 12,
      plotW = W - LEFT - 24,
      plotH = 120 - top - BOTTOM;
    var x = function (t) {
      return LEFT + 12 + (plotW * (t - t0)) / (t1 - t0);
    };
    var y = function (f) {
      return top + plotH - (plotH * (f - f0)) / (f1 - f0);
    };
    el('line', { x1: LEFT, y1: top + plotH, x2: W - 4, y2: top + plotH, class: 'axis' }, svg);
    if (pts.length > 0) {
      // Held at each fence until the next one was accepted.
      var d = 'M' + x(pts[0].t).toFixed(1) + ' ' + y(pts[0].f).toFixed(1);
      for (var i = 1; i < pts.length; i++) d += ' H' + x(pts[i].t).toFixed(1) + ' V' + y(pts[i].f).toFixed(1);
      el('path', { d: d, class: 'step' }, svg);
    }
    refused.forEach(function (p) {
      var cx = x(p.t),
        cy = p.f === null || !Number.isFinite(p.f) ? top + plotH : y(p.f);
      var g = el('g', { 'data-refusal': p.r.id, 'data-reason': p.r.reason, stroke: colorOf(p.r.reason), 'stroke-width': 2 }, svg);
      el('line', { x1: (cx - 4).toFixed(1), y1: (cy - 4).toFixed(1), x2: (cx + 4).toFixed(1), y2: (cy + 4).toFixed(1) }, g);
      el('line', { x1: (cx - 4).toFixed(1), y1: (cy + 4).toFixed(1), x2: (cx + 4).toFixed(1), y2: (cy - 4).toFixed(1) }, g);
      el('title', {}, g).textContent = p.r.reason + (p.r.presented_fence !== null ? ' (fence ' + p.r.presented_fence + ')' : '') + ' at ' + p.r.at;
    });
    pts.forEach(function (p) {
      var c = el('circle', { cx: x(p.t).toFixed(1), cy: y(p.f).toFixed(1), r: 4, fill: '#1570ef', 'data-fence': p.h.fence }, svg);
      el('title', {}, c).textContent = 'fence ' + p.h.fence + ' at ' + p.h.at + (p.h.caller ? ' by ' + p.h.caller : '');
      text(svg, x(p.t), y(p.f) - 7, String(p.h.fence), 'middle');
    });
    text(svg, LEFT, 120 - 6, new Date(t0).toISOString().slice(0, 19).replace('T', ' '));
    text(svg, W - 4, 120 - 6, new Date(t1).toISOString().slice(0, 19).replace('T', ' '), 'end');
  }

  fg.chart = { bars: bars, timeline: timeline, colorOf: colorOf, OTHER: OTHER };
})();
