"""Fixtures of the ``remote`` tests: real servers on 127.0.0.1 port 0, in
this Trio run (``server``) or as subprocesses (``spawn``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from _remote_support import TOKEN, InProcess, Spawned, start_in_process, start_spawned


@pytest.fixture
async def server(nursery: trio.Nursery, tmp_path: Path) -> InProcess:
    return await start_in_process(nursery, tmp_path / "sandboxes", grace=5.0)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
async def spawn(token_file: Path, tmp_path: Path) -> AsyncIterator[Any]:
    """``await spawn(name, port=0, *extra)`` starts a server subprocess and
    returns once it listens; every one still running is killed at the end."""
    started: list[Spawned] = []

    async def start(name: str, port: int = 0, *extra: str) -> Spawned:
        spawned = await start_spawned(token_file, tmp_path / f"server-{name}", port, *extra)
        started.append(spawned)
        return spawned

    try:
        yield start
    finally:
        for spawned in started:
            if spawned.process.returncode is None:
                spawned.process.kill()
            with trio.move_on_after(5, shield=True):
                await spawned.process.wait()
