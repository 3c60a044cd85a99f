"""``expose_directory`` and ``expose_socket`` on a running sandbox: the host's
directory is readable, never writable, from inside; a unix socket in it is
connectable under policy ``none``; closing detaches the bind and never
touches the host's directory."""

from __future__ import annotations

import os
import socket

import trio
from _sandbox_support import requires_sandbox

from agentcompass import NetworkPolicy

pytestmark = requires_sandbox

NONE = NetworkPolicy("none")


async def test_an_exposed_directory_is_read_only_inside_and_survives_close(provider, tag, tmp_path):
    shared = tmp_path / "cache"
    shared.mkdir()
    (shared / "tool.txt").write_text("from the host\n")
    os.chmod(tmp_path, 0o755)
    session = await provider.open(None, NONE, f"{tag}-a")
    try:
        inside = await session.expose_directory(str(shared))
        assert inside.startswith("/run/agentcompass/")
        read = await session.exec(f"cat {inside}/tool.txt")
        assert read.stdout == "from the host\n"
        for attack in (
            f"echo x > {inside}/tool.txt",
            f"touch {inside}/new",
            f"rm -f {inside}/tool.txt",
            f"mount -o remount,rw {inside}",
        ):
            result = await session.exec(attack)
            assert result.exit_code != 0, attack
        # Nothing else of the host's is reachable through it.
        assert (await session.exec(f"ls {inside}/..")).stdout.split() == [os.path.basename(inside)]
    finally:
        with trio.move_on_after(30, shield=True):
            await session.close()
    assert (shared / "tool.txt").read_text() == "from the host\n"
    assert sorted(os.listdir(shared)) == ["tool.txt"]


async def test_an_exposed_socket_is_connectable_under_policy_none(provider, tag, tmp_path):
    directory = tmp_path / "sock"
    directory.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(directory, 0o755)
    path = str(directory / "s")
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen()
    session = await provider.open({}, NONE, f"{tag}-b")
    try:
        inside = await session.expose_socket(path)
        script = (
            "import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            f"s.connect({inside!r})\n"
            "s.sendall(b'ping')\n"
            "print(s.recv(10).decode())\n"
        )
        async with trio.open_nursery() as nursery:

            async def answer() -> None:
                conn, _ = await listener.accept()
                with conn:
                    assert await conn.recv(4) == b"ping"
                    await conn.send(b"pong")

            nursery.start_soon(answer)
            result = await session.exec(["python3", "-c", script], timeout=30)
        assert result.stdout.strip() == "pong", result
    finally:
        listener.close()
        with trio.move_on_after(30, shield=True):
            await session.close()


async def test_sweep_after_a_killed_runtime_detaches_the_binds_and_keeps_the_host_directory(provider, tag, tmp_path):
    shared = tmp_path / "cache"
    shared.mkdir()
    (shared / "keep.txt").write_text("precious\n")
    os.chmod(tmp_path, 0o755)
    session = await provider.open(None, NONE, f"{tag}-c")
    try:
        await session.expose_directory(str(shared))
        await session.expose_directory(str(shared))
        # What a runtime killed now leaves: the sweep of its tag must clean up
        # through the state directory, never by deleting what is bound there.
        await provider.sweep(tag)
    finally:
        with trio.move_on_after(30, shield=True):
            await session.close()
    assert (shared / "keep.txt").read_text() == "precious\n"
    mounts = await trio.Path("/proc/self/mounts").read_text()
    assert not [line for line in mounts.splitlines() if tag in line]
