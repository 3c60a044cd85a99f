"""A session's network rules, installed from the host: the mode's nftables
ruleset loaded by ``nsenter`` into the container's network namespace, which
the container's processes cannot change (``NET_ADMIN`` is not theirs)."""

from __future__ import annotations

import os

import trio

from agentcompass import IssueError

from ._api import Engine

__all__ = ["install_ruleset"]


async def install_ruleset(engine: Engine, container: str, where: str, ruleset: str) -> None:
    """Run ``nft -f -`` in ``container``'s network namespace, entered by a
    descriptor opened while the container was known to run with that pid;
    ``where`` names the session in a failure."""
    info = await engine.request("GET", f"/containers/{container}/json")
    pid = (info.get("State") or {}).get("Pid") or 0
    if pid <= 0:
        raise IssueError("fatal", "environment_failed", f"{where}: the container is not running")
    fd = await trio.to_thread.run_sync(os.open, f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        again = await engine.request("GET", f"/containers/{container}/json")
        if (again.get("State") or {}).get("Pid") != pid:
            raise IssueError("fatal", "environment_failed", f"{where}: the container restarted")
        result = await trio.run_process(
            ["nsenter", f"--net=/proc/self/fd/{fd}", "nft", "-f", "-"],
            stdin=ruleset.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            pass_fds=(fd,),
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    finally:
        os.close(fd)
    if result.returncode != 0:
        raise IssueError(
            "fatal",
            "environment_failed",
            f"{where}: nft failed: {result.stderr.decode(errors='replace').strip()[:300]}",
        )
