"""
``shoal-analytics report``: one self-contained HTML page from the ``analysis/`` tables.

The page leads with what to do (the headline), then the flags, most severe first, then
interactive charts (uPlot, shipped in ``assets/`` with its licence and inlined: hover for
values, drag to zoom, double-click to zoom out, click a legend entry to hide its series) and a
table of queues and subscriptions that sorts on any column and filters as you type. Everything
is inlined, so the file opens anywhere with no network. The data reaches the charts as one JSON
block; the table is plain HTML, so it reads without scripts too. Reads the small aggregate
tables with pandas; no Spark needed.
"""

import datetime
import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from shoal_analytics.anomalies import capped, dead_letter_reasons
from shoal_analytics.errors import ReportError
from shoal_analytics.lake import Lake
from shoal_analytics.units import NONE, count, duration, entity_name, missing, subscription_name

BUSIEST = 50
"""Rows of the table beyond those with a backlog, dead letters or a flag, by deliveries."""
CHART_SERIES = 8


def _asset(name: str) -> str:
    text = resources.files('shoal_analytics').joinpath('assets', name).read_text('utf-8')
    if name == 'uPlot.iife.min.js':  # its banner is a URL: the page names no address at all
        banner = '/*! uPlot v1.6.32, MIT licence: shoal_analytics/assets/uPlot.LICENSE */'
        text = text.replace('/*! https://github.com/leeoniya/uPlot (v1.6.32) */', banner)
    return text


def _table(lake: Lake, name: str) -> pd.DataFrame:
    path = lake.analysis / f'{name}.parquet'
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _percent(value: object) -> str:
    return NONE if missing(value) else f'{float(value):.1%}'  # type: ignore[arg-type]


def _latency(ms: object) -> str:
    if missing(ms):
        return NONE
    value = float(ms)  # type: ignore[arg-type]
    return capped(value) + duration(value / 1000)


def _drain(row: dict[str, Any]) -> str:
    """How long the backlog takes to empty at the newest rates; said only where it matters."""
    if missing(row['backlog']):
        return NONE
    if row['backlog'] == 0:
        return 'empty'
    if not missing(row['time_to_drain_s']):
        return duration(float(row['time_to_drain_s']))
    return 'not draining' if row.get('backlog_growing') else NONE


def _sort_key(value: object) -> str:
    """The sort key of a cell (``data-v``): a number's digits, or the text."""
    if missing(value):
        return ''
    if isinstance(value, int | float):
        return repr(float(value))
    return str(value)


def _numeric(value: object) -> str:
    """Numbers are not broken inside (``1,2|34``); text wraps anywhere it must."""
    return ' class="n"' if isinstance(value, int | float) and not isinstance(value, bool) else ''


Cell = tuple[str, object]
"""Shown text and sort value."""


def _entity_cells(
    row: dict[str, Any], flags: dict[tuple[str, str], list[dict[str, Any]]],
    shares: dict[tuple[str, str], str],
) -> dict[str, Cell]:  # fmt: skip
    key = (row['address'], row['subscription'])
    mine = flags.get(key, [])
    dead = row.get('dead_lettered') or 0
    consumers = row.get('consumers')
    most = row.get('consumers_max')
    present = '' if missing(most) or most == consumers else f' (max {count(most)})'
    return {
        'queue or topic': (str(row['address']), str(row['address'])),
        'subscription': (subscription_name(str(row['subscription'])), str(row['subscription'])),
        'flags': (', '.join(a['flag'].replace('_', ' ') for a in mine), len(mine)),
        'consumers': (count(consumers) + present, consumers),
        'enqueued': (count(row['enqueued']), row['enqueued']),
        'delivered': (count(row['delivered']), row['delivered']),
        'dead-lettered': (count(dead) + (f' ({dead_letter_reasons(row)})' if dead else ''), dead),
        'redelivered': (_percent(row['redelivery_ratio']), row['redelivery_ratio']),
        'expired': (_percent(row['expiry_ratio']), row['expiry_ratio']),
        'backlog': (count(row['backlog']), row['backlog']),
        'time to drain': (_drain(row), row['time_to_drain_s']),
        'p50': (_latency(row['p50_ms']), row['p50_ms']),
        'p95': (_latency(row['p95_ms']), row['p95_ms']),
        'p99': (_latency(row['p99_ms']), row['p99_ms']),
        'replica split': (shares.get(key, NONE), None),
    }


def _html_table(rows: list[dict[str, Cell]], columns: list[str], css: list[str], ident: str) -> str:
    head = ''.join(f'<th scope="col" title="sort">{html.escape(c)}</th>' for c in columns)
    body = []
    for row, style in zip(rows, css, strict=True):
        cells = ''.join(
            f'<td data-v="{html.escape(_sort_key(v))}"{_numeric(v)}>{html.escape(text)}</td>'
            for text, v in (row[c] for c in columns)
        )
        body.append(f'<tr class="{style}">{cells}</tr>')
    return (
        f'<table id="{ident}" class="sortable"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table>'
    )


def _shares(lake: Lake) -> dict[tuple[str, str], str]:
    """'r-a 67 % / r-b 33 %' per entity served by more than one replica."""
    table = _table(lake, 'entity_replicas')
    found: dict[tuple[str, str], str] = {}
    if table.empty:
        return found
    for (address, subscription), rows in table.groupby(['address', 'subscription']):
        if len(rows) > 1:
            rows = rows.sort_values('share', ascending=False)
            found[(str(address), str(subscription))] = ' / '.join(
                f'{r} {s:.0%}' for r, s in zip(rows['replica'], rows['share'], strict=True)
            )
    return found


def _series(frame: pd.DataFrame, x: str, key: str, y: str) -> dict[str, Any]:
    """uPlot's data: one x axis (seconds), one y array per KEY value (null where it has none)."""
    if frame.empty:
        return {'x': [], 'series': []}
    wide = frame.pivot_table(index=x, columns=key, values=y, aggfunc='last').sort_index()
    return {
        'x': [float(t) / 1000 for t in wide.index],
        'series': [
            {'label': str(name), 'values': [None if missing(v) else float(v) for v in wide[name]]}
            for name in wide.columns
        ],
    }


def _charts(lake: Lake, summary: dict[str, Any], entities: pd.DataFrame,
            flagged: list[tuple[str, str]]) -> list[dict[str, Any]]:  # fmt: skip
    window_ms = float(summary.get('params', {}).get('window_seconds', 60)) * 1000
    load = _table(lake, 'replica_windows')
    if not load.empty:
        load = load[load['complete']].assign(middle_ms=load['window_start_ms'] + window_ms / 2)
    charts = [{
        'id': 'load', 'title': f'Load per replica (complete {duration(window_ms / 1000)} windows)',
        'unit': 'transfers/s', 'log': False,
        **_series(load, 'middle_ms', 'replica', 'transfers_per_s'),
    }]  # fmt: skip
    samples = _table(lake, 'backlog_samples')
    if not samples.empty:  # a line that stays at 0 says nothing: only backlogs that were there
        peaks = samples.groupby(['address', 'subscription'])['backlog'].max()
        shown = [e for e in dict.fromkeys(flagged + list(peaks.sort_values(ascending=False).index))
                 if peaks.get(e, 0) > 0][:CHART_SERIES]  # fmt: skip
        names = {entity_name(a, s) for a, s in shown}
        samples = samples.assign(entity=[
            entity_name(a, s)
            for a, s in zip(samples['address'], samples['subscription'], strict=True)
        ])  # fmt: skip
        samples = samples[samples['entity'].isin(names)]
    charts.append({
        'id': 'backlog', 'title': 'Backlog of flagged and deepest queues', 'unit': 'messages',
        'log': False, 'empty': 'No queue or subscription had a backlog in the lookback.',
        **_series(samples, 'ts_ms', 'entity', 'backlog'),
    })  # fmt: skip
    windows = _table(lake, 'entity_windows')
    if not windows.empty:
        slowest = entities.dropna(subset=['p99_ms']).nlargest(CHART_SERIES, 'p99_ms')
        top = {entity_name(a, s) for a, s in zip(slowest['address'], slowest['subscription'],
                                                 strict=True)}  # fmt: skip
        windows = windows.assign(
            entity=[entity_name(a, s) for a, s in zip(windows['address'], windows['subscription'],
                                                      strict=True)],
            middle_ms=windows['window_start_ms'] + window_ms / 2,
        )  # fmt: skip
        windows = windows[windows['entity'].isin(top)].dropna(subset=['p99_ms'])
    charts.append({
        'id': 'latency', 'title': f'p99 delivery latency per window, the {CHART_SERIES} slowest',
        'unit': 'ms (log scale)', 'log': True, 'empty': 'No delivery was acknowledged.',
        **_series(windows, 'middle_ms', 'entity', 'p99_ms'),
    })  # fmt: skip
    return charts


def _clock(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        '%Y-%m-%d %H:%M:%S UTC'
    )


def _coverage(summary: dict[str, Any]) -> str:
    """What the records cover, not the lookback they were read from."""
    start = int(summary.get('data_start_ms', summary['window_start_ms']))
    end = int(summary.get('data_end_ms', summary['window_end_ms']))
    lookback = summary.get('params', {}).get('lookback_minutes')
    read = f', read from a {lookback}-minute lookback' if lookback else ''
    return (
        f'{summary["records"]:,} metric records covering {_clock(start)} to {_clock(end)} '
        f'({duration((end - start) / 1000)}){read}; {summary["malformed_records"]} malformed.'
    )


def _rows_to_show(entities: pd.DataFrame, flags: dict[tuple[str, str], list[dict[str, Any]]]
                  ) -> list[dict[str, Any]]:  # fmt: skip
    """Every entity with a backlog, dead letters or a flag, and the busiest others; flagged
    first (most severe first), then by backlog, then by deliveries."""
    rank = {'critical': 0, 'warning': 1, 'info': 2}
    rows = entities.to_dict('records')

    def severity(row: dict[str, Any]) -> int:
        found = flags.get((row['address'], row['subscription']), [])
        return min((rank.get(a['severity'], 3) for a in found), default=3)

    def number(value: object) -> float:
        return 0.0 if missing(value) else float(value)  # type: ignore[arg-type]

    def must(row: dict[str, Any]) -> bool:
        return severity(row) < 3 or number(row['backlog']) > 0 or number(row['dead_lettered']) > 0

    busiest = sorted(rows, key=lambda r: -number(r['delivered']))[:BUSIEST]
    chosen = {(r['address'], r['subscription']): r for r in busiest + [r for r in rows if must(r)]}
    return sorted(chosen.values(), key=lambda r: (
        severity(r), -number(r['backlog']), -number(r['delivered']), r['address']))  # fmt: skip


ANOMALY_COLUMNS = ['severity', 'flag', 'queue or subscription', 'replica', 'detail']
ENTITY_COLUMNS = ['queue or topic', 'subscription', 'flags', 'consumers', 'enqueued', 'delivered',
                  'dead-lettered', 'redelivered', 'expired', 'backlog', 'time to drain', 'p50',
                  'p95', 'p99', 'replica split']  # fmt: skip


def render(lake: Lake) -> str:
    """The report page for the latest analysis of ``lake``."""
    if not lake.summary.exists():
        raise ReportError(f'no analysis under {lake.analysis}: run analyze first')
    summary = json.loads(lake.summary.read_text())
    entities = _table(lake, 'entities')
    anomalies: list[dict[str, Any]] = summary['anomalies']
    flags: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for a in anomalies:
        if a['address']:
            flags.setdefault((a['address'], a['subscription']), []).append(a)
    shown = _rows_to_show(entities, flags)
    entity_rows = [_entity_cells(r, flags, _shares(lake)) for r in shown]
    entity_css = [min((a['severity'] for a in flags.get((r['address'], r['subscription']), [])),
                      key=['critical', 'warning', 'info'].index, default='')
                  for r in shown]  # fmt: skip
    anomaly_rows: list[dict[str, Cell]] = [{
        'severity': (a['severity'], ['critical', 'warning', 'info'].index(a['severity'])
                     if a['severity'] in ('critical', 'warning', 'info') else 3),
        'flag': (a['flag'].replace('_', ' '), a['flag']),
        'queue or subscription': (entity_name(a['address'], a['subscription'])
                                  if a['address'] else NONE, a['address']),
        'replica': (a['replica'] or NONE, a['replica']),
        'detail': (a['detail'], a['detail']),
    } for a in anomalies]  # fmt: skip
    charts = _charts(lake, summary, entities, list(flags))
    data = json.dumps({'charts': charts}).replace('</', '<\\/')
    end = _clock(summary['window_end_ms'])
    current, recommended = summary['current_replicas'], summary['recommended_replicas']
    headline = summary.get('headline') or summary['reason']
    figures = ''.join(
        f'<figure><figcaption>{html.escape(c["title"])}</figcaption>'
        f'<div class="chart" id="chart-{c["id"]}"></div></figure>'
        for c in charts
    )
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<title>Shoal analytics {html.escape(end)}</title>',
        f'<style>{_asset("uPlot.min.css")}\n{_asset("report.css")}</style></head><body>',
        '<h1>Shoal analytics</h1>',
        f'<p class="coverage">{html.escape(_coverage(summary))}</p>',
        f'<p class="headline">{html.escape(headline)}</p>',
        f'<p>Brokers: {current} running; the load needs {recommended}. '
        f'{html.escape(summary["reason"])}.</p>',
        f'<h2>Flags ({len(anomalies)})</h2>',
        _html_table(anomaly_rows, ANOMALY_COLUMNS,
                    [a['severity'] for a in anomalies], 'anomalies')
        if anomalies else '<p>None: nothing needs attention.</p>',
        f'<div class="charts">{figures}</div>',
        f'<h2>Queues and subscriptions ({len(shown)} of {len(entities)})</h2>',
        '<p class="note">Every queue or subscription with a backlog, dead letters or a flag, and '
        f'the {BUSIEST} busiest; click a column to sort, type to filter. Backlog: the newest '
        'sample; time to drain at the newest complete window\'s rates; latency from enqueue to '
        'acknowledgement, within 2 % (a "≥" value is a bound that older records\' waits went '
        'beyond); replica split: each replica\'s share of the deliveries.</p>',
        '<input id="filter" type="search" placeholder="Filter rows" aria-label="Filter rows">',
        _html_table(entity_rows, ENTITY_COLUMNS, entity_css, 'entities'),
        f'<script type="application/json" id="report-data">{data}</script>',
        f'<script>{_asset("uPlot.iife.min.js")}</script>',
        f'<script>{_asset("report.js")}</script>',
        '</body></html>',
    ]  # fmt: skip
    return '\n'.join(parts)


def write_report(lake: Lake, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(lake), encoding='utf-8')
