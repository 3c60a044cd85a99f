"""``local``'s file operations against what a hostile session makes: links
to host files, FIFOs, huge files and a path swapped while the runtime reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from agentcompass.environments.local import LocalEnvironment, LocalSession
from agentcompass.runtime import DEFAULT_MAX_READ_BYTES, FileRefusedError, IssueError, NetworkPolicy

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux file semantics")

HANG_GUARD = 20
HOST_SECRET = b"HOST-SECRET\n"


@pytest.fixture
async def session(tmp_path: Path):
    sandbox = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy("full"))
    try:
        yield sandbox
    finally:
        with trio.CancelScope(shield=True):
            await sandbox.close()


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """A directory only its owner (root, where the tests run as root) may enter, holding a secret."""
    private = tmp_path / "host-private"
    private.mkdir(mode=0o700)
    (private / "secret.txt").write_bytes(HOST_SECRET)
    return private


def app_of(session: LocalSession) -> Path:
    return Path(session.handle["path"]) / "app"


async def test_a_link_the_session_plants_to_a_host_file_is_neither_read_nor_written_through(
    session: LocalSession, host_dir: Path
):
    secret = host_dir / "secret.txt"
    planted = await session.exec(f"ln -s {secret} key && ln -s {host_dir} keys")
    assert planted.exit_code == 0
    with trio.fail_after(HANG_GUARD):
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.read_file("/app/key")
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.read_file("/app/keys/secret.txt")
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.write_file("/app/keys/secret.txt", "owned")
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.write_file("/app/keys/new.txt", "owned")
        await session.write_file("/app/key", "mine")  # replaces the link itself
    assert secret.read_bytes() == HOST_SECRET
    assert sorted(os.listdir(host_dir)) == ["secret.txt"]
    assert (app_of(session) / "key").read_text() == "mine" and not (app_of(session) / "key").is_symlink()


async def test_a_fifo_is_refused_without_blocking(session: LocalSession):
    assert (await session.exec("mkfifo pipe")).exit_code == 0
    with trio.fail_after(HANG_GUARD):  # an open for reading would block until a writer comes
        with pytest.raises(FileRefusedError, match="not a regular file"):
            await session.read_file("/app/pipe")
        await session.write_file("/app/pipe", "data")  # replaced by a rename, never opened
    assert (app_of(session) / "pipe").read_text() == "data"


async def test_a_file_longer_than_max_bytes_is_refused(session: LocalSession):
    app = app_of(session)
    (app / "ten.txt").write_bytes(b"0123456789")
    assert await session.read_file("/app/ten.txt", max_bytes=10) == b"0123456789"
    with pytest.raises(FileRefusedError, match="larger than 9 bytes"):
        await session.read_file("/app/ten.txt", max_bytes=9)
    # The default bound holds too: a sparse file one byte past it is refused, not read.
    assert (await session.exec(f"truncate -s {DEFAULT_MAX_READ_BYTES + 1} big")).exit_code == 0
    with trio.fail_after(HANG_GUARD):
        with pytest.raises(FileRefusedError, match="larger than"):
            await session.read_file("/app/big")


async def test_lexical_escapes_stay_fatal(session: LocalSession):
    for path in ("../x", "/app/../../x", "/etc/passwd"):
        with pytest.raises(IssueError) as exc:
            await session.read_file(path)
        assert (exc.value.severity, exc.value.code) == ("fatal", "environment_failed")


# A session process swapping ``app/sub`` between a real directory and a link to
# the host's private directory, as fast as it can, at least 3,000 times and
# until the test has done its share of reads and writes. The renames are
# atomic, so at every instant ``app/sub`` is missing, the directory, the link,
# or a directory a write made while it was missing.
_SWAPPER = """
import os, shutil, sys
host, stop = sys.argv[1], sys.argv[2]

def put(source):
    while True:  # a write_file may have made a new 'sub' while it was missing: drop it
        try:
            return os.rename(source, "sub")
        except OSError:
            shutil.rmtree("sub", ignore_errors=True)

os.mkdir("sub.d"); open("sub.d/secret.txt", "w").write("sandbox\\n")
os.symlink(host, "sub.l")
put("sub.d")
print("ready", flush=True)
swaps = 0
while swaps < 3000 or not os.path.exists(stop):
    os.rename("sub", "sub.d"); put("sub.l")
    os.rename("sub", "sub.l"); put("sub.d")
    swaps += 2
print(swaps, flush=True)
"""


async def test_a_path_swapped_for_a_link_while_reading_and_writing_never_reaches_the_host(
    session: LocalSession, host_dir: Path, tmp_path: Path
):
    stop = tmp_path / "stop"
    outcomes = {"sandbox": 0, "written": 0, "refused": 0, "missing": 0}
    with trio.fail_after(120):
        swapper = await trio.lowlevel.open_process(
            [sys.executable, "-c", _SWAPPER, str(host_dir), str(stop)], cwd=app_of(session), stdout=subprocess.PIPE
        )
        try:
            assert swapper.stdout is not None
            ready = b""
            while not ready.endswith(b"\n"):
                ready += await swapper.stdout.receive_some(1)
            assert ready == b"ready\n"
            operations = 0
            while swapper.poll() is None:
                try:
                    content = await session.read_file("/app/sub/secret.txt")
                    assert content != HOST_SECRET
                    outcomes["sandbox"] += 1
                # NotADirectoryError: swapped back between the refused open and the
                # look at what refused it.
                except (FileRefusedError, NotADirectoryError):
                    outcomes["refused"] += 1
                except FileNotFoundError:
                    outcomes["missing"] += 1
                try:
                    await session.write_file("/app/sub/secret.txt", "overwritten\n")
                    outcomes["written"] += 1
                except (FileRefusedError, NotADirectoryError):
                    outcomes["refused"] += 1
                except FileNotFoundError:
                    outcomes["missing"] += 1
                operations += 1
                if operations == 2000:
                    stop.touch()
            output = b""
            while chunk := await swapper.stdout.receive_some():
                output += chunk
        finally:
            swapper.kill()
            await swapper.wait()
    assert swapper.returncode == 0
    assert int(output.split()[-1]) >= 3000
    # The loop really raced the swapper: it met both the directory and the link.
    assert outcomes["sandbox"] + outcomes["written"] > 0 and outcomes["refused"] > 0, outcomes
    assert (host_dir / "secret.txt").read_bytes() == HOST_SECRET
    assert sorted(os.listdir(host_dir)) == ["secret.txt"]
