// The report's behaviour: uPlot charts sized to their box (hover for values, drag to zoom,
// double-click to reset, click a legend entry to hide its series), sortable and filterable
// tables. Everything it needs is inlined in the page.
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var palette = ['#36c', '#e60', '#2a2', '#c33', '#93c', '#a63', '#e6c', '#777'];

  function human(ms) {
    if (ms == null) return '—';
    var s = ms / 1000;
    if (s < 1) return (ms < 10 ? ms.toFixed(2) : Math.round(ms)) + ' ms';
    if (s < 60) return s.toPrecision(3) + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
    return Math.floor(s / 3600) + ' h ' + Math.round((s % 3600) / 60) + ' min';
  }
  function plain(v) { return v == null ? '—' : v.toLocaleString(undefined, {maximumFractionDigits: 1}); }

  var plots = [];
  data.charts.forEach(function (chart) {
    var box = document.getElementById('chart-' + chart.id);
    if (!chart.x.length) {
      box.innerHTML = '<p class="empty"></p>';
      box.firstChild.textContent = chart.empty || 'No data.';
      return;
    }
    var format = chart.log ? human : plain;
    var series = [{}].concat(chart.series.map(function (s, i) {
      return {label: s.label, stroke: palette[i % palette.length], width: 1.5, spanGaps: true,
              points: {size: 4}, value: function (u, v) { return format(v); }};
    }));
    var options = {
      width: Math.max(box.clientWidth, 200), height: 260, series: series,
      scales: {x: {time: true}, y: chart.log ? {distr: 3} : {range: function (u, lo, hi) { return [0, Math.max(hi, 1) * 1.1]; }}},
      axes: [{}, {label: chart.unit, size: 60, values: function (u, vals) { return vals.map(format); }}],
      legend: {live: true},
      cursor: {drag: {x: true, y: false}},
    };
    var values = [chart.x].concat(chart.series.map(function (s) { return s.values; }));
    plots.push({plot: new uPlot(options, values, box), box: box});
  });
  var pending;
  window.addEventListener('resize', function () {
    clearTimeout(pending);
    pending = setTimeout(function () {
      plots.forEach(function (p) { p.plot.setSize({width: Math.max(p.box.clientWidth, 200), height: 260}); });
    }, 100);
  });

  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.querySelectorAll('th');
    heads.forEach(function (th, column) {
      th.addEventListener('click', function () {
        var descending = !th.classList.contains('desc');
        heads.forEach(function (h) { h.classList.remove('asc', 'desc'); });
        th.classList.add(descending ? 'desc' : 'asc');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[column].dataset.v, y = b.cells[column].dataset.v;
          var nx = parseFloat(x), ny = parseFloat(y);
          var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny
            : (x === '' ? 1 : y === '' ? -1 : x.localeCompare(y));
          return descending ? -order : order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  var filter = document.getElementById('filter');
  if (filter) {
    filter.addEventListener('input', function () {
      var words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
      document.querySelectorAll('#entities tbody tr').forEach(function (row) {
        var text = row.textContent.toLowerCase();
        row.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
      });
    });
  }
})();
