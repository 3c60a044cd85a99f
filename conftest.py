"""Hooks and autouse fixtures for every test directory (``tests`` and
``plugins/*/tests``): how tests share resources and the machine under
pytest-xdist (``tests/_xdist_support.py``), and each test starting and ending
with clean module-level state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _xdist_support import (
    RUN_DIR,
    GroupScheduling,
    group_shared,
    machine_lock,
    remove_run_dir,
    run_dir,
    write_groups,
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_shared(items)
    if hasattr(config, "workerinput"):
        write_groups(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    node.workerinput[RUN_DIR] = str(run_dir(node.config))  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if GroupScheduling is not None and config.getvalue("dist") == "loadgroup":
        return GroupScheduling(config, log)
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        remove_run_dir(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Under xdist a ``serial`` test runs alone on the machine (``_xdist_support``)."""
    if _LOCK not in item.config.stash:
        item.config.stash[_LOCK] = machine_lock(item.config)
    lock = item.config.stash[_LOCK]
    if lock is None:
        return (yield)
    with lock.hold(exclusive=item.get_closest_marker("serial") is not None):
        return (yield)


_LOCK = pytest.StashKey[Any]()


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
