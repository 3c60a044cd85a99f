"""Every dependency has a floor, and ``make test-floors`` runs on exactly those
floors (``COMPASS_FLOORS=1``): the floors are what the code was tested on."""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest
from floors import floors


def test_every_requirement_has_one_floor():
    found = floors()
    assert {"trio", "attrs", "cattrs", "httpx", "pytest-trio", "wsproto"} <= set(found)


@pytest.mark.skipif(not os.environ.get("COMPASS_FLOORS"), reason="make test-floors sets COMPASS_FLOORS=1 in its venv")
def test_the_floor_venv_has_exactly_the_floors():
    wrong = {name: version(name) for name, floor in floors().items() if _release(version(name)) != _release(floor)}
    assert wrong == {}, f"installed above the floors: {wrong}"


def _release(text: str) -> tuple[int, ...]:
    """``"8.1"`` and ``"8.1.0"`` are one version."""
    parts = [int(p) for p in text.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)
