from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from _sandbox_support import census, new_tag
from agentcompass_sandbox import SandboxEnvironment


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
