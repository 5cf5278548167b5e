"""
``shoal-analytics report``: one self-contained HTML page from the ``analysis/`` tables.

Plots are matplotlib PNGs embedded as data URIs, so the page opens anywhere (no network, no
scripts). Reads the small aggregate tables with pyarrow/pandas; no Spark needed.
"""

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use('Agg')  # no display; must precede pyplot's import
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

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


def _time_axis(frame: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(frame['window_start_ms'], unit='ms', utc=True)


def _replica_load_plot(load: pd.DataFrame) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    for replica, rows in load.sort_values('window_start_ms').groupby('replica'):
        axes.plot(_time_axis(rows), rows['transfers_per_s'], label=str(replica))
    axes.set_ylabel('transfers/s')
    axes.legend(loc='upper left', fontsize='small')
    return _png(figure)


def _backlog_plot(windows: pd.DataFrame, entities: list[tuple[str, str]]) -> str:
    figure, axes = plt.subplots(figsize=(9, 3.2))
    for address, subscription in entities:
        rows = windows[(windows['address'] == address) & (windows['subscription'] == subscription)]
        rows = rows.sort_values('window_start_ms')
        axes.plot(_time_axis(rows), rows['backlog'], label=f'{address} [{subscription}]')
    axes.set_ylabel('backlog (messages)')
    if entities:
        axes.legend(loc='upper left', fontsize='small')
    return _png(figure)


def _latency_plot(entities: pd.DataFrame) -> str:
    top = entities.dropna(subset=['p99_ms']).nlargest(TOP, 'p99_ms').iloc[::-1]
    figure, axes = plt.subplots(figsize=(9, 0.4 * max(len(top), 3) + 1))
    labels = top['address'] + ' [' + top['subscription'] + ']'
    axes.barh(labels, top['p99_ms'], label='p99')
    axes.barh(labels, top['p95_ms'], label='p95')
    axes.barh(labels, top['p50_ms'], label='p50')
    axes.set_xlabel('delivery latency (ms)')
    axes.legend(loc='lower right', fontsize='small')
    return _png(figure)


def _html_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = ''.join(f'<th>{html.escape(c)}</th>' for c in columns)
    body = []
    for row in rows:
        css = html.escape(str(row.get('severity', '')))
        cells = ''.join(f'<td>{html.escape(_fmt(row.get(c)))}</td>' for c in columns)
        body.append(f'<tr class="{css}">{cells}</tr>')
    return f'<table><tr>{head}</tr>{"".join(body)}</table>'


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f'{value:.3g}' if abs(value) < 1000 else f'{value:,.0f}'
    return '' if value is None else str(value)


def render(lake: Lake) -> str:
    """The report page for the latest analysis of ``lake``."""
    summary_path = lake.summary
    if not summary_path.exists():
        raise ReportError(f'no analysis under {lake.analysis}: run analyze first')
    summary = json.loads(summary_path.read_text())
    entities = _table(lake, 'entities')
    windows = _table(lake, 'entity_windows')
    load = _table(lake, 'replica_windows')
    anomalies: list[dict[str, Any]] = summary['anomalies']
    flagged = sorted({(a['address'], a['subscription']) for a in anomalies if a['address']})
    deepest = entities.dropna(subset=['backlog']).nlargest(TOP, 'backlog')
    deep = list(zip(deepest['address'], deepest['subscription'], strict=True))
    backlog_entities = list(dict.fromkeys(flagged + deep))[:TOP]
    start = pd.to_datetime(summary['window_start_ms'], unit='ms', utc=True)
    end = pd.to_datetime(summary['window_end_ms'], unit='ms', utc=True)
    figures = [
        ('Load per replica', _replica_load_plot(load)),
        ('Backlog of flagged and deepest queues', _backlog_plot(windows, backlog_entities)),
        (f'Delivery latency, top {TOP} p99', _latency_plot(entities)),
    ]
    entity_rows = entities.sort_values('delivered', ascending=False).head(50)
    entity_columns = ['address', 'subscription', 'enqueued', 'delivered', 'redelivery_ratio',
                      'expiry_ratio', 'backlog', 'time_to_drain_s', 'p50_ms', 'p95_ms',
                      'p99_ms']  # fmt: skip
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f'<title>Shoal analytics {html.escape(str(end))}</title>',
        f'<style>{STYLE}</style></head><body>',
        '<h1>Shoal analytics</h1>',
        f'<p>{summary["records"]} metric records from {html.escape(str(start))} to '
        f'{html.escape(str(end))}; {summary["malformed_records"]} malformed.</p>',
        f'<h2>Replicas: {summary["current_replicas"]} running, '
        f'{summary["recommended_replicas"]} recommended</h2>',
        f'<p>{html.escape(summary["reason"])}</p>',
        f'<h2>Anomalies ({len(anomalies)})</h2>',
        _html_table(anomalies, ['severity', 'flag', 'address', 'subscription', 'replica', 'detail'])
        if anomalies else '<p>None.</p>',
        *(f'<figure><figcaption>{html.escape(caption)}</figcaption>'
          f'<img alt="{html.escape(caption)}" src="{uri}"></figure>' for caption, uri in figures),
        '<h2>Queues and subscriptions (busiest 50)</h2>',
        _html_table(entity_rows.to_dict('records'), entity_columns),
        '</body></html>',
    ]  # fmt: skip
    return '\n'.join(parts)


def write_report(lake: Lake, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(lake), encoding='utf-8')
