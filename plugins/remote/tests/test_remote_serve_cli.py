"""``compass sandbox serve``: refuses to start without a token; SIGTERM closes
every session within the grace and exits."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from _common import poll_until, processes_marked
from _remote_support import TOKEN
from agentcompass_remote import RemoteEnvironment

from agentcompass import IssueError, NetworkPolicy


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agentcompass._cli", "sandbox", "serve", "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "--token-file is required"),
        (("--token-file", "/nonexistent/token"), "cannot be read"),
        (("--token-file", "{empty}"), "is empty"),
        (("--token-file", "{token}", "--provider", "nope"), "unknown environment id 'nope'"),
        (("--token-file", "{token}", "--capacity", "-1"), "--capacity must be >= 0"),
        (("--token-file", "{token}", "--max-unauthenticated", "-1"), "--max-unauthenticated must be >= 0"),
        (
            ("--token-file", "{token}", "--state-dir", "/proc/no-such-dir"),
            "--state-dir '/proc/no-such-dir' cannot be made",
        ),
        (("--token-file", "{token}", "--provider-config", "[1]"), "--provider-config must be a JSON object"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, token_file: Path, args: tuple[str, ...], message: str):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    proc = _serve(*(a.format(empty=empty, token=token_file) for a in args))
    assert proc.returncode == 2, proc
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and proc.stderr.startswith("error: ")
    assert proc.stdout == ""


def test_compass_lists_the_plugin_command_group():
    proc = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "sandbox" in proc.stdout


async def test_sigterm_closes_every_session_within_the_grace_and_exits(spawn, tmp_path: Path):
    served = await spawn("term", 0, "--grace-seconds", "3")
    env = RemoteEnvironment({"url": served.url, "token": TOKEN})
    sessions = [await env.open(None, NetworkPolicy()) for _ in range(3)]
    busy = sessions[0]
    sandbox = Path(busy.handle["inner"]["path"])
    failures: list[BaseException] = []

    async def exec_until_the_server_goes() -> None:
        try:
            await busy.exec('sleep 1000 & touch "$APP_DIR/started"; wait')
        except IssueError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        # One session is mid-exec when the signal comes.
        nursery.start_soon(exec_until_the_server_goes)
        await poll_until(lambda: (sandbox / "app" / "started").exists(), "the exec to start")
        served.process.send_signal(signal.SIGTERM)
        signalled = trio.current_time()
        with trio.fail_after(3 + 5):
            await served.process.wait()
        exited = trio.current_time() - signalled
    # Within the grace, plus the interpreter's own start of exit on a busy host.
    assert served.process.returncode == 0 and exited <= 3 + 2
    assert [(e.severity, e.code) for e in failures] == [("fatal", "environment_failed")]
    assert list(served.root.iterdir()) == []  # every sandbox was removed
    assert processes_marked(served.root) == []
    for session in sessions:
        await session.close()
