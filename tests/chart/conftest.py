"""``variant``: parametrizes a chart test over every documented values variant."""

import pytest
from chartrender import VARIANTS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if 'variant' in metafunc.fixturenames:
        metafunc.parametrize('variant', list(VARIANTS), ids=list(VARIANTS))
