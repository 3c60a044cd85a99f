"""Shared helpers of the sandbox provider's tests: the skip reason, unique
session names, a census of every kind of resource a session makes, and
connections from inside a session."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from _common import poll_until
from agentcompass_sandbox import SandboxSession, _forward, _host, host_problem

PROBLEM = host_problem()
requires_sandbox = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

_VETH = re.compile(r"ac[0-9a-f]{12}")


def new_tag() -> str:
    """A name prefix no other test uses."""
    return f"t{secrets.token_hex(4)}"


def leftovers(prefix: str) -> list[str]:
    """Everything that still carries a session name starting with ``prefix``:
    state directories, cgroups, subnet leases and processes (blocking; call through ``trio.to_thread``)."""
    found: list[str] = []
    if _host.STATE_ROOT.is_dir():
        found += [f"dir {e}" for e in os.listdir(_host.STATE_ROOT) if e.startswith(prefix)]
    for base in set(_host.cgroup_bases().values()):
        if base.is_dir():
            found += [f"cgroup {base / e}" for e in os.listdir(base) if e.startswith(prefix)]
    found += [f"lease of {n}" for n in _host.leases_with_prefix(prefix)]
    with open("/proc/self/mounts") as f:
        found += [f"mount {m}" for m in (line.split()[1] for line in f) if m.startswith(f"{_host.STATE_ROOT}/{prefix}")]
    marker = f"{_host.STATE_ROOT}/{prefix}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline:
                argv = cmdline.replace(b"\0", b" ")[:120]
                found.append(f"process {entry}: {argv!r}")
    return found


def veths() -> set[str]:
    """Host veth ends named like the provider's."""
    return {e for e in os.listdir("/sys/class/net") if _VETH.fullmatch(e)}


async def census(prefix: str) -> list[str]:
    return await trio.to_thread.run_sync(leftovers, prefix)


async def wait_for_file(session, path: str, seconds: float = 10) -> bytes:  # type: ignore[no-untyped-def]
    """What a real process inside writes to ``path``, once it is there (the shared bounded poll)."""
    content: list[bytes] = []

    async def written() -> bool:
        try:
            content.append(await session.read_file(path))
        except FileNotFoundError:
            return False
        return True

    await poll_until(written, f"{path} in session {session.name}", seconds)
    return content[-1]


async def first_line(process: trio.Process) -> bytes:
    """What ``process`` wrote to its stdout up to its first newline (or its end)."""
    assert process.stdout is not None
    said = b""
    while b"\n" not in said and (chunk := await process.stdout.receive_some(256)):
        said += chunk
    return said


async def connects(session: SandboxSession, address: str, port: int) -> bool:
    """Whether a TCP connection from inside ``session`` to ``address:port`` is accepted."""
    result = await session.exec(["bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"], timeout=5)
    assert not result.timed_out, "a refused connection must fail fast, not hang"
    return result.exit_code == 0


async def listening(session: SandboxSession, port: int) -> None:
    """Wait until a server started inside accepts on loopback: one exec that
    tries until it connects (a loaded host may take long to start the
    server; the calling test's hang guard bounds the wait)."""
    probe = f"until exec 3<>/dev/tcp/127.0.0.1/{port}; do sleep 0.05; done 2>/dev/null"
    result = await session.exec(["bash", "-c", probe])
    assert result.exit_code == 0, f"no listener on port {port} inside: {result}"


def _ipt(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True)


@contextmanager
def docker_forward_rules() -> Iterator[None]:
    """``FORWARD`` policy ``DROP`` and the ``DOCKER-USER`` chain as a Docker
    daemon makes them; everything undone after (the ``filter`` table too
    where the host had none)."""
    had_table = subprocess.run(["nft", "list", "table", "ip", "filter"], capture_output=True).returncode == 0
    had_chain = subprocess.run(["iptables", "-w", "-S", _forward.CHAIN], capture_output=True).returncode == 0
    policy = "ACCEPT"
    if had_table:
        first = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True).stdout
        policy = first.split("\n")[0].split()[-1] if first.startswith("-P FORWARD") else "ACCEPT"
    try:
        if not had_chain:
            _ipt("-N", _forward.CHAIN)
            _ipt("-A", _forward.CHAIN, "-j", "RETURN")
            _ipt("-I", "FORWARD", "-j", _forward.CHAIN)
        _ipt("-P", "FORWARD", "DROP")
        yield
    finally:
        subprocess.run(["iptables", "-w", "-P", "FORWARD", policy], capture_output=True)
        if not had_chain:
            subprocess.run(["iptables", "-w", "-D", "FORWARD", "-j", _forward.CHAIN], capture_output=True)
            subprocess.run(["iptables", "-w", "-F", _forward.CHAIN], capture_output=True)
            subprocess.run(["iptables", "-w", "-X", _forward.CHAIN], capture_output=True)
        if not had_table:
            subprocess.run(["nft", "delete", "table", "ip", "filter"], capture_output=True)
