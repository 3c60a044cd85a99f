"""The ``sandbox`` tests' fixtures; ``tests/`` helpers import here too, whatever a run collects."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agentcompass_sandbox import SandboxEnvironment

_TESTS = Path(__file__).resolve().parents[3] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))

from _sandbox_support import census, new_tag  # noqa: E402


@pytest.fixture
def tag() -> str:
    return new_tag()


@pytest.fixture
async def provider(tag: str) -> AsyncIterator[SandboxEnvironment]:
    """The provider; whatever a test leaves under its tag is swept and reported."""
    env = SandboxEnvironment({})
    try:
        yield env
    finally:
        left = await census(tag)
        await env.sweep(tag)
        assert not left, f"the test left {left}"
