from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentcompass.testing import reset_logs


@pytest.fixture(autouse=True)
def _fresh_logs() -> Iterator[None]:
    # The fakes keep their logs and script counters at module level.
    reset_logs()
    try:
        yield
    finally:
        reset_logs()
