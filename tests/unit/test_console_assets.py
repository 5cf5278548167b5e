"""The web console's files are in the package and complete: every script, style and module they
load is there, and none names another origin (nothing is fetched from the network)."""

import re

from shoal_broker.management import console

LOADS = re.compile(r"""(?:src|href)="([^"#:]+)"|from '(\./[^']+)'|import\('(\./[^']+)'\)""")
SVG_NAMESPACE = 'http://www.w3.org/2000/svg'
ELSEWHERE = re.compile(r"""(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}""", re.IGNORECASE)


def test_every_file_the_console_loads_ships_with_it() -> None:
    assets = sorted(p.name for p in console.ASSETS.iterdir())
    assert 'index.html' in assets
    loaded = set()
    for name in assets:
        text = (console.ASSETS / name).read_text()
        loaded |= {next(g for g in m.groups() if g) for m in LOADS.finditer(text)}
    local = {name.removeprefix('./') for name in loaded if not name.startswith('../')}
    assert {'app.js', 'style.css', 'api.js', 'browser.js'} <= local
    assert local <= set(assets), local - set(assets)


def test_no_console_file_names_another_origin() -> None:
    for path in console.ASSETS.iterdir():
        text = path.read_text().replace(SVG_NAMESPACE, '')  # a name, never fetched
        assert not ELSEWHERE.findall(text), path.name
