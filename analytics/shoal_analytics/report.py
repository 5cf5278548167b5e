"""
``shoal-analytics report``: one self-contained HTML page from the ``analysis/`` tables.

Plots are matplotlib PNGs embedded as data URIs, so the page opens anywhere (no network, no
scripts). Reads the small aggregate tables with pyarrow/pandas; no Spark needed.
"""

import base64
import datetime
import html
import io
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use('Agg')  # no display; must precede pyplot's import
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from shoal_analytics.anomalies import TOP_BOUND_MS, capped
from shoal_analytics.errors import ReportError
from shoal_analytics.lake import Lake

TOP = 8
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f0f0f0; } .critical { color: #b00; font-weight: bold; } .warning { color: #a60; }
figure { margin: 1.5em 0; } figcaption { font-weight: bold; margin-bottom: 0.4em; }
"""


def _table(lake: Lake, name: str) -> pd.DataFrame:
    return pd.read_parquet(lake.analysis / f'{name}.parquet')


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format='png', dpi=90, bbox_inches='tight')
    plt.close(figure)
    return 'data:image/png;base64,' + base64.b64encode(buffer.getvalue()).decode('ascii')


def _time_axis(frame: pd.DataFrame, column: str = 'window_start_ms') -> pd.Series:
    return pd.to_datetime(frame[column], unit='ms', utc=True)


def _with_gaps(frame: pd.DataFrame, column: str, step_ms: float) -> pd.DataFrame:
    """FRAME sorted by COLUMN with an all-NaN row wherever two rows lie more than 1.5 steps
    apart, so matplotlib breaks the line there instead of drawing across the gap."""
    frame = frame.sort_values(column)
    gaps = frame[column].diff() > 1.5 * step_ms
    if not gaps.any():
        return frame
    fillers = frame.loc[gaps, [column]].copy()
    fillers[column] = fillers[column] - step_ms
    return pd.concat([frame, fillers]).sort_values(column, kind='stable')


Span = tuple[int, int]
"""What the records cover, ms since the epoch: every time axis shows exactly this."""


def _time_limits(axes: Axes, span: Span) -> None:
    start, end = (pd.to_datetime(ms, unit='ms', utc=True) for ms in span)
    axes.set_xlim(start, end)


def _replica_load_plot(load: pd.DataFrame, window_ms: float, span: Span) -> str:
    """Transfers per second per replica, complete windows only (a partial window is not a dip),
    each at its window's middle."""
    figure, axes = plt.subplots(figsize=(9, 3.2))
    load = load.assign(middle_ms=load['window_start_ms'] + window_ms / 2)
    complete = load[load['complete']]
    for replica, rows in complete.groupby('replica'):
        rows = _with_gaps(rows, 'middle_ms', window_ms)
        axes.plot(_time_axis(rows, 'middle_ms'), rows['transfers_per_s'], marker='.',
                  label=str(replica))  # fmt: skip
    _time_limits(axes, span)
    axes.set_ylabel('transfers/s')
    axes.set_ylim(bottom=0)
    if not complete.empty:
        axes.legend(loc='upper left', fontsize='small')
    return _png(figure)


def _backlog_plot(samples: pd.DataFrame, entities: list[tuple[str, str]], span: Span) -> str:
    """The backlog samples as recorded (a gauge: every sample is whole), gaps left open."""
    figure, axes = plt.subplots(figsize=(9, 3.2))
    for address, subscription in entities:
        rows = samples[(samples['address'] == address) & (samples['subscription'] == subscription)]
        if rows.empty:
            continue
        step = float(rows['ts_ms'].sort_values().diff().median()) if len(rows) > 1 else 0.0
        rows = _with_gaps(rows, 'ts_ms', step) if step > 0 else rows
        axes.plot(_time_axis(rows, 'ts_ms'), rows['backlog'], marker='.',
                  label=f'{address} [{subscription}]')  # fmt: skip
    _time_limits(axes, span)
    axes.set_ylabel('backlog (messages)')
    axes.set_ylim(bottom=0)
    if entities:
        axes.legend(loc='upper left', fontsize='small')
    return _png(figure)


def _latency_plot(entities: pd.DataFrame) -> str:
    """p50/p95/p99 on a log scale (milliseconds to minutes side by side); a percentile at the
    records' largest bound is only known to be at least that, and says so."""
    top = entities.dropna(subset=['p99_ms']).nlargest(TOP, 'p99_ms').iloc[::-1]
    figure, axes = plt.subplots(figsize=(9, 0.4 * max(len(top), 3) + 1))
    labels = top['address'] + ' [' + top['subscription'] + ']'
    for column, name in (('p99_ms', 'p99'), ('p95_ms', 'p95'), ('p50_ms', 'p50')):
        axes.barh(labels, top[column].clip(lower=0.1), label=name)
    axes.set_xscale('log')
    axes.xaxis.set_major_formatter(FuncFormatter(lambda ms, _: _duration(ms / 1000)))
    axes.set_xlabel('delivery latency (log scale)')
    for y, value in enumerate(top['p99_ms']):
        if capped(value):
            axes.annotate(f'≥ {_duration(value / 1000)}', (value, y), xytext=(4, 0),
                          textcoords='offset points', va='center', fontsize='small')  # fmt: skip
    if not top.empty:
        axes.set_xlim(right=float(top['p99_ms'].max()) * 4)  # room for a "≥" note
        axes.legend(loc='lower right', fontsize='small')
    return _png(figure)


def _html_table(rows: list[dict[str, str]], columns: list[str]) -> str:
    head = ''.join(f'<th>{html.escape(c)}</th>' for c in columns)
    body = []
    for row in rows:
        css = html.escape(row.get('severity', ''))
        cells = ''.join(f'<td>{html.escape(row.get(c, ""))}</td>' for c in columns)
        body.append(f'<tr class="{css}">{cells}</tr>')
    return f'<table><tr>{head}</tr>{"".join(body)}</table>'


NONE = '—'
"""A value that does not exist (no deliveries to take a ratio of, no latency recorded)."""


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _count(value: object) -> str:
    return NONE if _missing(value) else f'{int(value):,}'  # type: ignore[call-overload]


def _percent(value: object) -> str:
    return NONE if _missing(value) else f'{float(value):.1%}'  # type: ignore[arg-type]


def _duration(seconds: float) -> str:
    """Human units: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min."""
    if seconds < 1:
        return f'{seconds * 1000:.3g} ms'
    if seconds < 60:
        return f'{seconds:.3g} s'
    if seconds < 3600:
        minutes, rest = int(seconds // 60), int(seconds % 60)
        return f'{minutes} min {rest} s' if rest else f'{minutes} min'
    hours, minutes = int(seconds // 3600), int(seconds % 3600 // 60)
    return f'{hours} h {minutes} min' if minutes else f'{hours} h'


def _latency(ms: object) -> str:
    if _missing(ms):
        return NONE
    value = float(ms)  # type: ignore[arg-type]
    return capped(value) + _duration(value / 1000)


def _drain(row: dict[str, Any]) -> str:
    if _missing(row['backlog']):
        return NONE
    if row['backlog'] == 0:
        return 'empty'
    if _missing(row['time_to_drain_s']):
        return 'not draining' if not _missing(row['in_rate']) else NONE
    return _duration(float(row['time_to_drain_s']))


def _entity_row(row: dict[str, Any]) -> dict[str, str]:
    return {
        'address': str(row['address']),
        'subscription': str(row['subscription']),
        'enqueued': _count(row['enqueued']),
        'delivered': _count(row['delivered']),
        'redelivered': _percent(row['redelivery_ratio']),
        'expired': _percent(row['expiry_ratio']),
        'backlog': _count(row['backlog']),
        'time to drain': _drain(row),
        'p50': _latency(row['p50_ms']),
        'p95': _latency(row['p95_ms']),
        'p99': _latency(row['p99_ms']),
    }


def _clock(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime(
        '%Y-%m-%d %H:%M:%S UTC'
    )


def _span(summary: dict[str, Any]) -> Span:
    """What the records cover (an analysis of an older version knows only its lookback)."""
    start = summary.get('data_start_ms', summary['window_start_ms'])
    return int(start), int(summary.get('data_end_ms', summary['window_end_ms']))


def _coverage(summary: dict[str, Any]) -> str:
    """What the records cover, not the lookback they were read from."""
    start, end = _span(summary)
    lookback = summary.get('params', {}).get('lookback_minutes')
    read = f', read from a {lookback}-minute lookback' if lookback else ''
    return (
        f'{summary["records"]:,} metric records covering {_clock(start)} to {_clock(end)} '
        f'({_duration((end - start) / 1000)}){read}; {summary["malformed_records"]} malformed.'
    )


def render(lake: Lake) -> str:
    """The report page for the latest analysis of ``lake``."""
    summary_path = lake.summary
    if not summary_path.exists():
        raise ReportError(f'no analysis under {lake.analysis}: run analyze first')
    summary = json.loads(summary_path.read_text())
    entities = _table(lake, 'entities')
    samples = _table(lake, 'backlog_samples')
    load = _table(lake, 'replica_windows')
    window_ms = float(summary.get('params', {}).get('window_seconds', 60)) * 1000
    span = _span(summary)
    anomalies: list[dict[str, Any]] = summary['anomalies']
    flagged = sorted({(a['address'], a['subscription']) for a in anomalies if a['address']})
    deepest = entities.dropna(subset=['backlog']).nlargest(TOP, 'backlog')
    deep = list(zip(deepest['address'], deepest['subscription'], strict=True))
    backlog_entities = list(dict.fromkeys(flagged + deep))[:TOP]
    end = _clock(summary['window_end_ms'])
    figures = [
        (f'Load per replica (complete {_duration(window_ms / 1000)} windows)',
         _replica_load_plot(load, window_ms, span)),
        ('Backlog of flagged and deepest queues', _backlog_plot(samples, backlog_entities, span)),
        (f'Delivery latency, top {TOP} p99', _latency_plot(entities)),
    ]  # fmt: skip
    entity_rows = entities.sort_values('delivered', ascending=False).head(50)
    entity_columns = ['address', 'subscription', 'enqueued', 'delivered', 'redelivered',
                      'expired', 'backlog', 'time to drain', 'p50', 'p95', 'p99']  # fmt: skip
    anomaly_rows = [{k: '' if _missing(v) else str(v) for k, v in a.items()} for a in anomalies]
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f'<title>Shoal analytics {html.escape(end)}</title>',
        f'<style>{STYLE}</style></head><body>',
        '<h1>Shoal analytics</h1>',
        f'<p>{html.escape(_coverage(summary))}</p>',
        f'<h2>Replicas: {summary["current_replicas"]} running, '
        f'{summary["recommended_replicas"]} recommended</h2>',
        f'<p>{html.escape(summary["reason"])}</p>',
        f'<h2>Anomalies ({len(anomalies)})</h2>',
        _html_table(anomaly_rows, ['severity', 'flag', 'address', 'subscription', 'replica',
                                   'detail'])
        if anomalies else '<p>None.</p>',
        *(f'<figure><figcaption>{html.escape(caption)}</figcaption>'
          f'<img alt="{html.escape(caption)}" src="{uri}"></figure>' for caption, uri in figures),
        '<h2>Queues and subscriptions (busiest 50)</h2>',
        '<p>Backlog: the newest sample, as the backlog plot ends; time to drain at the newest '
        'complete window\'s rates; a latency percentile past the largest recorded bound says '
        f'"≥ {_duration(TOP_BOUND_MS / 1000)}" (past 30 s, "≥ 30 s", for records of replicas '
        'that recorded no further).</p>',
        _html_table([_entity_row(r) for r in entity_rows.to_dict('records')], entity_columns),
        '</body></html>',
    ]  # fmt: skip
    return '\n'.join(parts)


def write_report(lake: Lake, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(lake), encoding='utf-8')
