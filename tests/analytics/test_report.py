"""
The HTML report: one self-contained file (its scripts and styles inlined, nothing fetched), its
charts and tables, rendered by headless Chromium at 1400 and 800 px with no element overflowing
and no request made; the screenshots are kept as test artifacts.
"""

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shoal_analytics.analyze import Analysis
from shoal_analytics.cli import main
from shoal_analytics.lake import Lake
from shoal_analytics.synthetic import Synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # uses the planted analysis

ARTIFACTS = Path(os.environ.get('SHOAL_TEST_ARTIFACTS', Path(__file__).parents[2] / '.artifacts'))
"""Where the screenshots are kept for a person to look at (not in git)."""

CHECK = """
<script>
window.addEventListener('load', function () {
  setTimeout(function () {
    var width = document.documentElement.clientWidth, over = [];
    document.querySelectorAll('body *').forEach(function (el) {
      var box = el.getBoundingClientRect();
      if (box.width && (box.right > width + 1 || box.left < -1)) {
        over.push(el.tagName + '#' + el.id + '.' + el.className);
      }
      var cell = el.tagName === 'TD' || el.tagName === 'TH';
      if (cell && el.scrollWidth > el.clientWidth + 1) over.push('cut ' + el.textContent);
    });
    var fetched = performance.getEntriesByType('resource').map(function (r) { return r.name; });
    var result = {overflowing: over.slice(0, 20), pageWidth: document.documentElement.scrollWidth,
                  width: width, requests: fetched,
                  charts: document.querySelectorAll('.uplot').length,
                  sortable: document.querySelectorAll('table.sortable th').length};
    var out = document.createElement('pre'); out.id = 'check-result';
    out.textContent = JSON.stringify(result); document.body.appendChild(out);
  }, 500);
});
</script>
"""
"""Run in the page once it has laid out: what overflows the viewport or its cell, what was
fetched, and how many charts drew."""


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.cells: list[str] = []
        self.scripts = 0
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in.append(tag)
        values = dict(attrs)
        self.scripts += tag == 'script'
        for name in ('href', 'src'):
            if values.get(name):
                self.links.append(str(values[name]))

    def handle_endtag(self, tag: str) -> None:
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if self._in and self._in[-1] == 'td':
            self.cells.append(data)


def _chromium(page: Path, width: int, shot: Path) -> dict[str, object]:
    """Screenshot PAGE at WIDTH px and run the CHECK in it, with every request refused."""
    chromium = shutil.which('chromium')
    assert chromium, 'chromium is not installed (make test installs it)'
    checked = page.with_name(f'checked-{width}.html')
    checked.write_text(page.read_text(encoding='utf-8').replace('</body>', CHECK + '</body>'))
    common = [chromium, '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
              '--host-resolver-rules=MAP * ~NOTFOUND', '--proxy-server=127.0.0.1:9',
              f'--window-size={width},2400']  # fmt: skip
    subprocess.run([*common, f'--screenshot={shot}', page.as_uri()],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    dom = subprocess.run(
        [*common, '--virtual-time-budget=5000', '--dump-dom', checked.as_uri()],
        capture_output=True, timeout=120, check=True, text=True,
    ).stdout  # fmt: skip
    found = re.search(r'<pre id="check-result">(.*?)</pre>', dom, re.DOTALL)
    assert found, 'the check did not run in the page'
    result: dict[str, object] = json.loads(found.group(1).replace('&amp;', '&'))
    return result


def test_the_report_is_one_interactive_file_that_fits_1400_and_800_px_offline(
    planted: tuple[Synthetic, Lake, Analysis], tmp_path: Path
) -> None:
    spec, lake, analysis = planted
    out = tmp_path / 'report.html'
    assert main(['report', '--lake', str(lake.root), '--out', str(out)]) == 0
    text = out.read_text(encoding='utf-8')
    page = _Page()
    page.feed(text)
    page.close()
    assert page.links == []  # nothing to fetch: scripts and styles are inlined
    assert not re.search(r'(src|href)\s*=\s*["\']?https?:', text)
    assert page.scripts == 3  # the data, uPlot, the page's own behaviour
    for flag in spec.planted:
        assert flag.replace('_', ' ') in page.cells
    assert spec.starved_replica in page.cells
    assert len(analysis.summary.anomalies) == len(spec.planted)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in (1400, 800):
        shot = ARTIFACTS / f'report-{width}.png'
        result = _chromium(out, width, shot)
        assert shot.read_bytes().startswith(b'\x89PNG\r\n\x1a\n')
        assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
        assert result['overflowing'] == [], result
        assert result['pageWidth'] == result['width'] == width
        assert result['requests'] == []
        assert result['charts'] == 3
        assert int(str(result['sortable'])) > 10


def test_report_without_an_analysis_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(['report', '--lake', str(tmp_path), '--out', str(tmp_path / 'r.html')])
    assert exit_info.value.code == 2
    assert 'no analysis under' in capsys.readouterr().err
    assert not (tmp_path / 'r.html').exists()
