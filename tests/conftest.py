"""Fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _ray_support import executor as executor  # noqa: F401 - one session cluster for the whole suite
from _ray_support import ray_cluster as ray_cluster  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_logs() -> Iterator[None]:
    """The fakes of ``agentcompass.testing`` keep their call logs and script
    counters at module level: every test starts and ends with none."""
    from agentcompass.testing import reset_logs

    reset_logs()
    try:
        yield
    finally:
        reset_logs()


@pytest.fixture(autouse=True)
def _structlog_as_found() -> Iterator[None]:
    """``structlog.testing.capture_logs`` leaves structlog marked configured
    (with its print-everything defaults) after it restores the processors:
    later launches would then leave it alone. Each test ends as it found it."""
    import structlog

    configured = structlog.is_configured()
    try:
        yield
    finally:
        if not configured:
            structlog.reset_defaults()
