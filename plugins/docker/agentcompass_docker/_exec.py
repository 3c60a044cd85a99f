"""One command in a ``docker`` session's container.

Every command is an Engine API exec whose output is the daemon's
multiplexed stream (8-byte frame headers), read as a streamed response. The
exec's process is the leader of a session of its own inside the container;
at a timeout or a cancellation the runtime runs, as root inside the same
container, a small ``sh`` that kills that process group and every process
of that session: the command's whole tree, except what moved itself into a
session of its own (a daemon that ``setsid`` itself is the agent's and lives
until the session closes, as with ``sandbox``).
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import trio

from agentcompass import ExecResult
from agentcompass.runtime import OutputCallback, cleanup_deadline

from ._api import Engine, EngineError, demultiplex

__all__ = ["CONTAINER_GONE_EXIT_CODE", "TIMEOUT_EXIT_CODE", "run_command"]

#: ``exit_code`` of a command killed at its timeout, as coreutils ``timeout`` reports it.
TIMEOUT_EXIT_CODE = 124
#: ``exit_code`` of an exec whose container no longer runs (nothing ran).
CONTAINER_GONE_EXIT_CODE = 255
# After the command's own process exits, how long output a background process holds is still read.
_DRAIN_SECONDS = 0.5
# How often a long exec asks whether its own process has exited (a background child may hold the stream).
_POLL_SECONDS = 0.5
# Kills the process group and the session led by pid $1 (stat fields after "comm)": state ppid pgrp session).
_KILL_TREE = (
    'kill -9 -- "-$1" 2>/dev/null; for d in /proc/[0-9]*; do s=$(cat "$d/stat" 2>/dev/null) || continue; '
    's=${s##*) }; set -- "$1" $s; [ "$5" = "$1" ] || [ "$6" = "$1" ] && kill -9 "${d#/proc/}" 2>/dev/null; done; '
    "exit 0"
)


async def run_command(
    engine: Engine,
    container: str,
    where: str,
    body: dict[str, Any],
    timeout: float | None,
    on_output: OutputCallback,
) -> ExecResult:
    """Run the exec ``body`` describes in ``container``, handing its output to
    ``on_output``; ``where`` names the session in a message."""
    try:
        made = await engine.request("POST", f"/containers/{container}/exec", body=body)
    except EngineError as exc:
        if exc.status in (404, 409):
            # The container is gone or stopped: nothing runs any more.
            return ExecResult(exit_code=CONTAINER_GONE_EXIT_CODE, stderr=f"{where}: {exc}\n")
        raise
    exec_id = made["Id"]
    timed_out = False
    info: dict[str, Any] = {}
    try:
        with trio.move_on_after(math.inf if timeout is None else max(timeout, 0)) as deadline:
            info = await _run(engine, exec_id, on_output)
        if deadline.cancelled_caught:
            timed_out = True
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await _kill_tree(engine, container, exec_id)
    except BaseException:
        with trio.move_on_at(cleanup_deadline(), shield=True):
            await _kill_tree(engine, container, exec_id)
        raise
    if timed_out:
        return ExecResult(exit_code=TIMEOUT_EXIT_CODE, timed_out=True)
    code = info.get("ExitCode")
    return ExecResult(exit_code=code if isinstance(code, int) else CONTAINER_GONE_EXIT_CODE)


async def _run(engine: Engine, exec_id: str, on_output: OutputCallback) -> dict[str, Any]:
    """Read the exec's frames until the stream ends, or until a little
    after its own process exited (a background child may hold the stream)."""
    body = {"Detach": False, "Tty": False}
    async with engine.stream("POST", f"/exec/{exec_id}/start", body=body) as response:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_exit, engine, exec_id, nursery.cancel_scope)
            await demultiplex(response, on_output)
            nursery.cancel_scope.cancel()
    # The stream can end before the process does (it closed its output).
    pause = 0.005
    while (info := await engine.request("GET", f"/exec/{exec_id}/json")).get("Running"):
        await trio.sleep(pause)
        pause = min(pause * 2, _POLL_SECONDS)
    return info


async def _watch_exit(engine: Engine, exec_id: str, scope: trio.CancelScope) -> None:
    while True:
        await trio.sleep(_POLL_SECONDS)
        info = await engine.request("GET", f"/exec/{exec_id}/json")
        if not info.get("Running"):
            await trio.sleep(_DRAIN_SECONDS)
            scope.cancel()
            return


async def _kill_tree(engine: Engine, container: str, exec_id: str) -> None:
    """Kill the exec's process group and session inside the container (see the module docstring)."""
    try:
        info = await engine.request("GET", f"/exec/{exec_id}/json")
        host_pid = info.get("Pid") or 0
        if not info.get("Running") or host_pid <= 0:
            return
        inside = await trio.to_thread.run_sync(_namespace_pid, host_pid)
        if inside is None:
            return
        killer = await engine.request(
            "POST",
            f"/containers/{container}/exec",
            body={
                "Cmd": ["/bin/sh", "-c", _KILL_TREE, "sh", str(inside)],
                "User": "0",
                "Tty": False,
                "AttachStdout": True,
                "AttachStderr": True,
            },
        )
        # Attached, so the tree is gone when its output ends (it prints nothing).
        start = f"/exec/{killer['Id']}/start"
        async with engine.stream("POST", start, body={"Detach": False, "Tty": False}) as response:
            async for _ in response.aiter_raw():
                pass
    except (EngineError, httpx.HTTPError):
        pass  # the container is gone, and the tree with it


def _namespace_pid(host_pid: int) -> int | None:
    """The pid of ``host_pid`` in its innermost pid namespace (``NSpid``), or None if it is gone."""
    try:
        with open(f"/proc/{host_pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None
