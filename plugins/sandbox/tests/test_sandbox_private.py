"""exec_private against a hostile session: a daemon the agent left running
cannot reach the verifier's directory (by the shared path, by
``/proc/<pid>/root`` or ``cwd``, by renaming the directory away) nor its
tests (the inputs) while it keeps running and serving; nothing planted in the
session's ``HOME`` runs; the inputs arrive exactly and the session's own
Harbor directories are untouched; the returned files respect ``max_bytes``
and skip links and FIFOs; a timeout, a cancellation and ``close`` leave nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from _common import poll_until
from _sandbox_support import census, requires_sandbox, wait_for_file
from agentcompass_sandbox import SandboxEnvironment, SandboxSession, _host
from agentcompass_sandbox._private import SOURCE_PREFIX

from agentcompass import IssueError, NetworkPolicy
from agentcompass.testing import hang_guard

pytestmark = requires_sandbox
NONE = NetworkPolicy("none")
PORT = 8765
MARKER = "verifier-marker-5f1c"

# The agent's daemon: serves /tmp/www on loopback and, in a loop, writes 1
# into every reward file it can name, renames the verifier's directory away
# and makes a new one, and notes every process command line it can see.
_DAEMON = r"""
import functools, glob, http.server, os, threading
os.makedirs("/tmp/www", exist_ok=True)
with open("/tmp/www/status", "w") as f:
    f.write("daemon alive\n")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/tmp/www")
server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
seen = set()
n = 0
while True:
    n += 1
    targets = ["/logs/verifier/reward.txt"]
    targets += glob.glob("/proc/*/root/logs/verifier/reward.txt")
    targets += [cwd + "/reward.txt" for cwd in glob.glob("/proc/*/cwd")]
    targets += [cwd + "/logs/verifier/reward.txt" for cwd in glob.glob("/proc/*/root")]
    for path in targets:
        try:
            with open(path, "w") as f:
                f.write("1\n")
        except OSError:
            pass
    if n % 5 == 0:
        try:
            os.rename("/logs/verifier", "/logs/verifier.%d" % n)
            os.mkdir("/logs/verifier")
        except OSError:
            pass
    for cmdline in glob.glob("/proc/*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                seen.add(f.read())
        except OSError:
            pass
    if n % 20 == 0:
        with open("/app/count.tmp", "w") as f:
            f.write(str(n))
        os.replace("/app/count.tmp", "/app/count")
        with open("/app/seen.tmp", "wb") as f:
            f.write(b"\n".join(seen))
        os.replace("/app/seen.tmp", "/app/seen")
""".replace("PORT", str(PORT))

# The verifier: reads the daemon's service, gives the daemon time to strike,
# writes 0, and checks what it wrote is still there.
_VERIFIER = f"""
: {MARKER}
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{PORT}/status').read().decode().strip())"
readlink /proc/self/exe
cd /logs/verifier
echo 0 > /logs/verifier/reward.txt
sleep 0.5
cat /logs/verifier/reward.txt
"""


async def test_a_daemon_left_running_cannot_touch_the_private_directory(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(120):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/app/daemon.py", _DAEMON)
            started = await session.exec(
                "mkdir -p /logs/verifier && setsid nohup python3 /app/daemon.py > /dev/null 2>&1 < /dev/null &"
            )
            assert started.exit_code == 0, started
            await wait_for_file(session, "/app/count", 30)
            for attempt in range(5):
                before = int(await session.read_file("/app/count"))
                result, files = await session.exec_private(
                    _VERIFIER, timeout=60, directory="/logs/verifier", max_bytes=1 << 20
                )
                assert result.exit_code == 0, (attempt, result)
                served, exe, written = result.stdout.splitlines()
                # The verifier reached the daemon's service; its /proc/self is its own.
                assert (served, exe) == ("daemon alive", "/usr/bin/readlink")
                # What the verifier wrote stayed what it wrote, and that is what comes back.
                assert written == "0", (attempt, result)
                assert files == {"reward.txt": b"0\n"}, attempt
                # The daemon was at work meanwhile, and is still.
                after = int(await session.read_file("/app/count"))
                assert after > before, (before, after)
            shared = await session.exec("cat /logs/verifier*/reward.txt")
            assert "1" in shared.stdout.split(), shared
            # No process of the verifier was ever visible to the daemon: its
            # list of what it saw, written after the last verifier ended (two
            # count writes on: the count goes before the list in a round).
            now = await daemon_count(session)
            await poll_until(lambda: counted_past(session, now + 20), "the daemon's next list of processes")
            seen = await session.read_file("/app/seen")
            assert b"daemon.py" in seen
            assert MARKER.encode() not in seen
            alive = await session.exec("pgrep -f daemon.py")
            assert alive.exit_code == 0, alive
        finally:
            await session.close()


async def daemon_count(session: SandboxSession) -> int:
    """The rounds a test's daemon has counted in ``/app/count`` (written every 20)."""
    return int(await session.read_file("/app/count"))


async def _reads(session: SandboxSession, path: str, data: bytes) -> bool:
    return await session.read_file(path) == data


async def counted_past(session: SandboxSession, count: int) -> bool:
    return await daemon_count(session) > count


async def test_returned_files_respect_max_bytes_and_skip_links_and_fifos(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.exec("mkdir -p /logs/agent && echo agent-log > /logs/agent/log")
            script = (
                "cd /logs/verifier && printf 0123456789 > a.txt && printf 0123456789 > b.txt"
                " && head -c 100 /dev/zero > c.bin && mkdir d && printf xyz > d/e.txt"
                " && mkfifo fifo && ln -s /etc/passwd link && ln -s a.txt alias && ln -s /etc d/etc"
                " && cat /logs/agent/log"
            )
            result, files = await session.exec_private(script, directory="/logs/verifier", max_bytes=25)
            assert result.exit_code == 0, result
            # The rest of /logs is still there for the command to read.
            assert result.stdout == "agent-log\n"
            # In path order, each file while it fits: c.bin (100 bytes) does not.
            assert files == {"a.txt": b"0123456789", "b.txt": b"0123456789", "d/e.txt": b"xyz"}
            assert sum(len(v) for v in files.values()) <= 25
            # Nothing of it reached the session's own /logs/verifier.
            assert (await session.exec("ls -A /logs/verifier 2>/dev/null | wc -l")).stdout.strip() == "0"
            # A private directory below the Harbor one; and none outside them.
            result, files = await session.exec_private(
                "mkdir -p /app/out/deep && echo hi > /app/out/deep/x && ls /app",
                directory="/app/out/deep",
                max_bytes=10,
            )
            assert result.exit_code == 0 and files == {"x": b"hi\n"}, result
            with pytest.raises(IssueError, match="private directory"):
                await session.exec_private("true", directory="/tmp/x", max_bytes=10)
        finally:
            await session.close()


# The agent's daemon against the tests: in a loop, rewrites every test.sh
# it can name, and every other file under /tests, to write reward 1.
_TESTS_DAEMON = r"""
import glob, os
cheat = b"echo 1 > /logs/verifier/reward.txt\n"
n = 0
while True:
    n += 1
    targets = {"/tests/test.sh"}
    targets.update(glob.glob("/tests/**", recursive=True))
    targets.update(glob.glob("/proc/*/root/tests/**", recursive=True))
    targets.update(glob.glob("/proc/*/root/tests/test.sh"))
    targets.update(cwd + "/test.sh" for cwd in glob.glob("/proc/*/cwd"))
    for path in targets:
        try:
            if os.path.isdir(path):
                continue
            with open(path, "wb") as f:
                f.write(cheat)
        except OSError:
            pass
    if n % 20 == 0:
        with open("/app/count.tmp", "w") as f:
            f.write(str(n))
        os.replace("/app/count.tmp", "/app/count")
"""


async def test_a_daemon_rewriting_the_tests_cannot_change_the_reward(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(120):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/app/daemon.py", _TESTS_DAEMON)
            await session.write_file("/tests/test.sh", "echo 0 > /logs/verifier/reward.txt\n")
            started = await session.exec("setsid nohup python3 /app/daemon.py > /dev/null 2>&1 < /dev/null &")
            assert started.exit_code == 0, started
            await wait_for_file(session, "/app/count", 30)
            rewards = []
            for _ in range(5):
                before = int(await session.read_file("/app/count"))
                result, files = await session.exec_private(
                    "bash /tests/test.sh",
                    timeout=60,
                    directory="/logs/verifier",
                    max_bytes=1 << 20,
                    inputs={"/tests/test.sh": b"echo 0 > /logs/verifier/reward.txt"},
                )
                assert result.exit_code == 0, result
                rewards.append(files.get("reward.txt"))
                await poll_until(lambda n=before: counted_past(session, n), "the daemon to go on working")
            assert rewards == [b"0\n"] * 5
            # What the daemon struck is the session's own copy, which the runs never used.
            # (read until whole: the daemon truncates the file before each rewrite)
            cheat = b"echo 1 > /logs/verifier/reward.txt\n"
            await poll_until(lambda: _reads(session, "/tests/test.sh", cheat), "the daemon's copy of test.sh")
        finally:
            await session.close()


# Files a shell or Python reads from HOME, planted in the session's HOME
# (/tmp): each leaves a marker and writes reward 1.
_PLANT = r"""
set -e
site=$(python3 -c 'import site; print(site.getusersitepackages())')
case "$site" in /tmp/*) ;; *) echo "user site $site is not under HOME=/tmp"; exit 1 ;; esac
mkdir -p "$site"
printf 'import os\nopen("/tmp/ran-usercustomize", "w").close()\nos.makedirs("/logs/verifier", exist_ok=True)\nopen("/logs/verifier/reward.txt", "w").write("1\\n")\n' > "$site/usercustomize.py"
for f in .bashrc .profile .bash_profile; do
    printf 'touch /tmp/ran-%s; echo 1 > /logs/verifier/reward.txt\n' "$f" > "/tmp/$f"
done
"""
_USE_HOME = """echo 0 > /logs/verifier/reward.txt
python3 -c 'import sys'
bash -l -c true
bash -i -c true 2> /dev/null
sh -l -c true
echo "$HOME $(ls -A "$HOME" | wc -l)"
touch "$HOME/made"
"""


async def test_nothing_planted_in_the_sessions_home_runs_in_a_private_run(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            planted = await session.exec(_PLANT)
            assert planted.exit_code == 0, planted
            for _ in range(2):  # and HOME is new each time: what the first run made is gone
                result, files = await session.exec_private(_USE_HOME, directory="/logs/verifier", max_bytes=100)
                assert result.exit_code == 0, result
                assert result.stdout == "/root 0\n", result
                assert files == {"reward.txt": b"0\n"}
            ran = await session.exec("ls /tmp/ran-* 2> /dev/null")
            assert ran.stdout == "", ran
            # The plants work where HOME is the session's.
            await session.exec(_USE_HOME)
            ran = await session.exec("ls /tmp/ran-* | sort")
            assert ran.stdout.split() == [
                "/tmp/ran-.bash_profile",
                "/tmp/ran-.bashrc",
                "/tmp/ran-.profile",
                "/tmp/ran-usercustomize",
            ], ran
        finally:
            await session.close()


_INPUTS = {
    "/tests/test.sh": b"#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n",
    "/tests/test_outputs.py": b"def test_it():\n    assert True\n",
    "/tests/data/deep/all.bin": bytes(range(256)) * 17,
    "/tests/data/empty": b"",
    "/tests/with space.txt": "é\n".encode(),
    "/solution/solve.sh": b"echo solved\n",
}
_COPY_INPUTS = """set -e
cd /logs/verifier
cp -a /tests tests && cp -a /solution solution
ls -A /tests /tests/data /solution
stat -c '%a %u %n' /tests/test.sh /tests/data/empty /tests/data
echo new > /tests/made-by-the-command
"""


async def test_inputs_arrive_exactly_and_leave_the_sessions_directories_alone(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/tests/session-own.txt", "the session's\n")
            await session.write_file("/solution/other.sh", "echo other\n")
            result, files = await session.exec_private(
                _COPY_INPUTS, directory="/logs/verifier", max_bytes=1 << 20, inputs=_INPUTS
            )
            assert result.exit_code == 0, result
            expected = {path.lstrip("/"): data for path, data in _INPUTS.items()}
            assert files == expected
            # Only the inputs are there: none of the session's own entries of
            # those directories; every input mode 0o755, the sandbox user's.
            assert result.stdout.splitlines() == [
                "/solution:", "solve.sh", "",
                "/tests:", "data", "test.sh", "test_outputs.py", "with space.txt", "",
                "/tests/data:", "deep", "empty",
                "755 1000 /tests/test.sh", "755 1000 /tests/data/empty", "755 1000 /tests/data",
            ]  # fmt: skip
            # The session's own /tests and /solution are as they were.
            after = await session.exec("find /tests /solution | sort")
            assert after.stdout.split() == [
                "/solution", "/solution/other.sh", "/tests", "/tests/session-own.txt",
            ]  # fmt: skip
            assert await session.read_file("/tests/session-own.txt") == b"the session's\n"
            # Without inputs, the session's /tests is what the command sees.
            result, _ = await session.exec_private("ls /tests", directory="/logs/verifier", max_bytes=10)
            assert result.stdout == "session-own.txt\n", result
        finally:
            await session.close()


async def test_inputs_that_name_no_file_of_another_harbor_directory_are_refused(
    provider: SandboxEnvironment, tag: str
) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            refused = [
                ("in /logs, the Harbor directory of the private directory", {"/logs/tests/test.sh": b""}),
                ("not a file under", {"/tmp/test.sh": b""}),
                ("not a file under", {"/tests": b""}),
                ("not an absolute path", {"tests/test.sh": b""}),
                ("named twice", {"/tests/a": b"", "/tests//a": b""}),
                ("beneath another input", {"/tests/a": b"", "/tests/a/b": b""}),
                ("not bytes", {"/tests/a": "text"}),
            ]
            for message, inputs in refused:
                with pytest.raises(ValueError, match=message):
                    await session.exec_private(
                        "touch /app/ran",
                        directory="/logs/verifier",
                        max_bytes=10,
                        inputs=inputs,  # type: ignore[arg-type]
                    )
            with pytest.raises(FileNotFoundError):
                await session.read_file("/app/ran")
        finally:
            await session.close()


def _session_pids(name: str) -> dict[str, list[int]]:
    """Processes per leaf of the session's tracking cgroup (blocking)."""
    track = Path(_host.cgroup_bases()["track"]) / name
    found: dict[str, list[int]] = {}
    for entry in os.scandir(track):
        if entry.is_dir():
            found[entry.name] = [int(p) for p in Path(entry.path, "cgroup.procs").read_text().split()]
    return found


def _private_mounts(name: str) -> list[str]:
    """Every process on the host that still has the session's private tmpfs mounted (blocking)."""
    source = (SOURCE_PREFIX + name).encode()
    holders = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if source in Path(f"/proc/{pid}/mountinfo").read_bytes():
                    holders.append(pid)
            except OSError:
                pass
    return holders


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_timeout_kills_the_tree_and_keeps_what_it_wrote(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            fds = _open_fds()
            result, files = await session.exec_private(
                "echo 0 > /logs/verifier/reward.txt; sleep 1000 & sleep 1000",
                timeout=1,
                directory="/logs/verifier",
                max_bytes=100,
                inputs={"/tests/test.sh": b"true"},  # its tmpfs, and HOME's, go too
            )
            assert result.timed_out and result.exit_code == 124
            assert files == {"reward.txt": b"0\n"}
            left = await trio.to_thread.run_sync(_session_pids, session.name)
            assert set(left) == {"init"}, left
            assert await trio.to_thread.run_sync(_private_mounts, session.name) == []
            assert _open_fds() == fds
        finally:
            await session.close()


async def test_a_cancellation_kills_the_tree_and_leaves_nothing(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            fds = _open_fds()
            entries = sorted(os.listdir(session.handle["dir"]))
            with trio.move_on_after(30) as scope:
                async with trio.open_nursery() as nursery:

                    async def verifier() -> None:
                        await session.exec_private(
                            "touch /app/started; sleep 1000 & sleep 1000",
                            directory="/logs/verifier",
                            max_bytes=100,
                            inputs={"/tests/test.sh": b"true"},
                        )

                    nursery.start_soon(verifier)
                    await wait_for_file(session, "/app/started")
                    assert await trio.to_thread.run_sync(_private_mounts, session.name) != []
                    nursery.cancel_scope.cancel()
            assert not scope.cancelled_caught  # the cancellation ended it, not the 30 s
            left = await trio.to_thread.run_sync(_session_pids, session.name)
            assert set(left) == {"init"}, left
            assert await trio.to_thread.run_sync(_private_mounts, session.name) == []
            assert _open_fds() == fds
            assert sorted(os.listdir(session.handle["dir"])) == entries
            # The session goes on.
            assert (await session.exec("echo ok")).stdout == "ok\n"
        finally:
            await session.close()


async def test_close_ends_a_private_run_and_leaves_nothing(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        outcome: list[object] = []
        try:
            async with trio.open_nursery() as nursery:

                async def verifier() -> None:
                    try:
                        outcome.append(
                            await session.exec_private(
                                "touch /app/started; sleep 1000", directory="/logs/verifier", max_bytes=100
                            )
                        )
                    except IssueError as exc:
                        outcome.append(exc)

                nursery.start_soon(verifier)
                await wait_for_file(session, "/app/started")
                await session.close()
            (result,) = outcome
            assert isinstance(result, tuple) and result[0].exit_code != 0, result
            assert await census(tag) == []
            assert await trio.to_thread.run_sync(_private_mounts, session.name) == []
            with pytest.raises(IssueError, match="closed"):
                await session.exec_private("true", directory="/logs/verifier", max_bytes=10)
        finally:
            await session.close()


# The agent owns the session's /: it swaps the top-level symlinks of the
# userland (the ELF interpreter is /lib64/ld-linux-*.so or /lib/ld-linux-*.so)
# for links to an empty directory of its own, in one process, after making
# more top-level names than a private run brings over.
_HIJACK = r"""
import os
os.makedirs("/tmp/evil", exist_ok=True)
for n in range(300):  # more names than are brought over, all sorting before app and tests
    os.mkdir("/a%03d" % n)
for name in ("bin", "sbin", "lib", "lib64"):
    if os.path.islink("/" + name):
        os.rename("/" + name, "/" + name + ".orig")
        os.symlink("/tmp/evil", "/" + name)
"""


async def test_a_private_run_never_runs_what_the_agent_put_in_the_root(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            await session.write_file("/app/hijack.py", _HIJACK)
            # The session's root is read-only: the agent cannot replace its loader.
            hijack = await session.exec("python3 /app/hijack.py")
            assert hijack.exit_code != 0 and "Read-only file system" in hijack.stderr, hijack
            assert (await session.exec("true")).exit_code == 0
            # A private run starts nothing from the session's root either, as root
            # or as the sandbox user: its root has the host's layout.
            result, files = await session.exec_private(
                "echo 0 > /logs/verifier/reward.txt && readlink /lib64 /bin && ls -d /app /tests /tmp /dev/null > /dev/null",
                directory="/logs/verifier",
                max_bytes=100,
            )
            assert result.exit_code == 0, result
            assert files == {"reward.txt": b"0\n"}
            assert "/tmp/evil" not in result.stdout
        finally:
            await session.close()


async def test_a_session_whose_init_died_runs_no_private_command(provider: SandboxEnvironment, tag: str) -> None:
    with hang_guard(60):
        session = await provider.open(None, NONE, f"{tag}-a")
        try:
            assert (await session.exec("kill -9 -1; sleep 5")).exit_code != 0
            result, files = await session.exec_private("touch /app/ran", directory="/logs/verifier", max_bytes=10)
            assert result.exit_code == 255 and "nothing ran" in result.stderr, result
            assert files == {}
            with pytest.raises(FileNotFoundError):
                await session.read_file("/app/ran")
        finally:
            await session.close()
