"""The HTML report: self-contained, with its plots, parsed the way a browser would."""

import base64
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shoal_analytics.analyze import Analysis
from shoal_analytics.cli import main
from shoal_analytics.lake import Lake
from shoal_analytics.synthetic import Synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # uses the planted analysis

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str | None]] = []
        self.captions: list[str] = []
        self.cells: list[str] = []
        self.links: list[str] = []
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in.append(tag)
        values = dict(attrs)
        if tag == 'img':
            self.images.append(values)
        for name in ('href', 'src'):
            if values.get(name) and not str(values[name]).startswith('data:'):
                self.links.append(str(values[name]))

    def handle_endtag(self, tag: str) -> None:
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if self._in and self._in[-1] == 'figcaption':
            self.captions.append(data)
        if self._in and self._in[-1] == 'td':
            self.cells.append(data)


def test_the_report_embeds_its_plots_and_lists_the_anomalies(
    planted: tuple[Synthetic, Lake, Analysis], tmp_path: Path
) -> None:
    spec, lake, analysis = planted
    out = tmp_path / 'report.html'
    assert main(['report', '--lake', str(lake.root), '--out', str(out)]) == 0
    page = _Page()
    page.feed(out.read_text(encoding='utf-8'))
    page.close()
    assert page.links == []  # nothing fetched from anywhere: opens offline
    assert page.captions == [
        'Load per replica (complete 1 min windows)', 'Backlog of flagged and deepest queues',
        'Delivery latency, top 8 p99',
    ]  # fmt: skip
    assert [image['alt'] for image in page.images] == page.captions
    for image in page.images:
        prefix, _, payload = str(image['src']).partition(',')
        assert prefix == 'data:image/png;base64'
        png = base64.b64decode(payload, validate=True)
        assert png.startswith(PNG_SIGNATURE)
        assert len(png) > 5000  # a drawn plot, not an empty canvas
    for flag in spec.planted:
        assert flag in page.cells
    assert spec.starved_replica in page.cells
    assert len(analysis.summary.anomalies) == len(spec.planted)


def test_report_without_an_analysis_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(['report', '--lake', str(tmp_path), '--out', str(tmp_path / 'r.html')])
    assert exit_info.value.code == 2
    assert 'no analysis under' in capsys.readouterr().err
    assert not (tmp_path / 'r.html').exists()
