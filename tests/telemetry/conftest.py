from __future__ import annotations

from collections.abc import Iterator

import pytest

from contextlab.support import telemetry
from tests.telemetry.collector import Collector


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as running:
        yield running
    telemetry.disable()
