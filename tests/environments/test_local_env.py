"""The ``local`` Environment, with real subprocesses and files."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from _common import poll_until, processes_marked, wait_dead

from agentcompass.environments._procs import Marked, Scanner, scan
from agentcompass.environments.local import MARKER_FILE, LocalEnvironment, LocalSession
from agentcompass.runtime import (
    ComponentError,
    ComponentRef,
    ExecutionPlan,
    FileRefusedError,
    IssueError,
    NetworkPolicy,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups")

FULL = NetworkPolicy("full")
# Generous bound for anything that should take milliseconds: a hang fails, not blocks.
HANG_GUARD = 20


@pytest.fixture
async def session(tmp_path: Path):
    sandbox = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, FULL)
    try:
        yield sandbox
    finally:
        with trio.CancelScope(shield=True):
            await sandbox.close()


def root_of(session: LocalSession) -> Path:
    return Path(session.handle["path"])


def assert_environment_failed(exc: IssueError) -> None:
    assert (exc.severity, exc.code) == ("fatal", "environment_failed")


async def assert_read_and_write_refused(session: LocalSession, path: str) -> None:
    with pytest.raises(IssueError) as read_error:
        await session.read_file(path)
    assert_environment_failed(read_error.value)
    with pytest.raises(IssueError) as write_error:
        await session.write_file(path, "overwritten")
    assert_environment_failed(write_error.value)


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self") or not hasattr(os, "pidfd_open"), reason="Linux /proc")


# -- layout and paths ---------------------------------------------------------


async def test_open_makes_layout_and_virtual_roots_map(session: LocalSession):
    root = root_of(session)
    assert all((root / name).is_dir() for name in ("app", "tests", "logs", "solution"))
    assert (root / MARKER_FILE).is_file()

    await session.write_file("/app/a.txt", "hello")
    await session.write_file("/tests/deep/er/t.sh", b"echo hi\n")
    assert (root / "app" / "a.txt").read_text() == "hello"
    assert (root / "tests" / "deep" / "er" / "t.sh").is_file()
    assert await session.read_file("app/a.txt") == b"hello"
    assert await session.read_file("/app/a.txt") == b"hello"
    assert await session.read_file("/app/../app/a.txt") == b"hello"

    result = await session.exec('echo "$APP_DIR $TESTS_DIR $LOGS_DIR $SOLUTION_DIR"; pwd; cat a.txt')
    dirs, pwd, content = result.stdout.splitlines()
    assert dirs.split() == [str(root / name) for name in ("app", "tests", "logs", "solution")]
    assert pwd == str(root / "app")
    assert content == "hello"


@pytest.mark.parametrize(
    "path", ["../escape", "app/../../escape", "/etc/passwd", "/app/../../escape", "/", "/apple/x", "/tmp/x"]
)
async def test_path_outside_sandbox_refused(session: LocalSession, path: str):
    await assert_read_and_write_refused(session, path)
    assert not (root_of(session).parent / "escape").exists()


async def test_symlink_escape_refused(session: LocalSession, tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    app = root_of(session) / "app"
    (app / "dirlink").symlink_to(outside)
    (app / "filelink").symlink_to(outside / "secret.txt")

    # A link on the way, or at the end of a read, is never followed.
    for path in ("/app/dirlink/secret.txt", "/app/filelink", "app/dirlink/new.txt"):
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.read_file(path)
    for path in ("/app/dirlink/secret.txt", "app/dirlink/new.txt"):
        with pytest.raises(FileRefusedError, match="symbolic link"):
            await session.write_file(path, "overwritten")
    # A link at the end is replaced by the new file, not written through.
    await session.write_file("/app/filelink", "replaced")
    assert not (app / "filelink").is_symlink() and (app / "filelink").read_text() == "replaced"
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (outside / "new.txt").exists()


async def test_exec_cwd_resolves_inside_sandbox(session: LocalSession):
    root = root_of(session)
    assert (await session.exec("pwd", cwd="/tests")).stdout.strip() == str(root / "tests")
    assert (await session.exec("pwd", cwd="logs")).stdout.strip() == str(root / "logs")
    for cwd in ("..", "/etc", "/app/missing"):
        with pytest.raises(IssueError) as exc:
            await session.exec("pwd", cwd=cwd)
        assert_environment_failed(exc.value)


# -- exec ---------------------------------------------------------------------


async def test_exec_captures_output_exit_code_and_env(session: LocalSession):
    result = await session.exec("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)

    argv = await session.exec(
        [sys.executable, "-c", "import os; print(os.environ['GREETING'])"], env={"GREETING": "hi"}
    )
    assert (argv.exit_code, argv.stdout) == (0, "hi\n")

    assert (await session.exec("printf 'a\\377b'")).stdout == "a\ufffdb"
    assert (await session.exec("kill -TERM $$")).exit_code == -15


async def test_exec_sees_none_of_the_runtimes_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The runtime's own environment is the input here: a key, and a PATH of its own.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-runtime-secret")
    monkeypatch.setenv("PATH", f"{tmp_path / 'runtime-bin'}:{os.environ['PATH']}")
    session = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, FULL)
    try:
        listing = await session.exec("env", env={"GIVEN": "by-the-component"})
    finally:
        await session.close()
    assert listing.exit_code == 0
    variables = dict(line.split("=", 1) for line in listing.stdout.splitlines())
    assert "sk-runtime-secret" not in listing.stdout
    root = root_of(session)
    assert variables.pop("PATH") == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert variables.pop("HOME") == str(root)
    assert variables.pop("GIVEN") == "by-the-component"
    # What bash sets for itself, beside what the session gives.
    for own in ("PWD", "SHLVL", "_", "OLDPWD"):
        variables.pop(own, None)
    assert variables == {
        "LANG": "C.UTF-8",
        "APP_DIR": str(root / "app"),
        "TESTS_DIR": str(root / "tests"),
        "LOGS_DIR": str(root / "logs"),
        "SOLUTION_DIR": str(root / "solution"),
        "AGENTCOMPASS_SANDBOX": str(root),
        "AGENTCOMPASS_SANDBOX_NAME": session.name,
    }


async def test_exec_output_is_bounded_keeping_the_tail(tmp_path: Path):
    env = LocalEnvironment({"root": str(tmp_path), "max_output_bytes": 1000})
    session = await env.open(env.build_config(_plan()), FULL)
    try:
        result = await session.exec(
            "head -c 5000000 /dev/zero | tr '\\0' a; echo END; head -c 300000 /dev/zero | tr '\\0' b >&2"
        )
    finally:
        await session.close()
    assert result.exit_code == 0
    assert len(result.stdout.encode()) <= 1000
    assert result.stdout.startswith("[... ") and "earlier bytes dropped" in result.stdout
    assert result.stdout.endswith("a" * 100 + "END\n")
    assert len(result.stderr.encode()) <= 1000 and result.stderr.endswith("b" * 500)


async def test_exec_start_failure_is_environment_failed(session: LocalSession):
    with pytest.raises(IssueError) as exc:
        await session.exec(["/nonexistent/program"])
    assert_environment_failed(exc.value)


@needs_proc
async def test_exec_timeout_kills_the_whole_process_group(session: LocalSession):
    with trio.fail_after(HANG_GUARD):
        result = await session.exec('echo started; sleep 1000 & echo $! > "$LOGS_DIR/pid"; wait', timeout=1)
    assert result.timed_out and result.exit_code == 124
    assert result.stdout == "started\n"
    grandchild = int((root_of(session) / "logs" / "pid").read_text())
    await wait_dead(grandchild)
    assert not is_alive(grandchild)


@needs_proc
async def test_cancelled_exec_kills_the_whole_process_group(session: LocalSession):
    logs = root_of(session) / "logs"
    os.mkfifo(logs / "ready")
    cmd = 'sleep 1000 & echo $! > "$LOGS_DIR/pid"; echo $$ > "$LOGS_DIR/leader"; echo ready > "$LOGS_DIR/ready"; wait'

    async def cancel_when_ready(scope: trio.CancelScope) -> None:
        # Blocks until the command has started its grandchild and says so through the FIFO.
        await trio.to_thread.run_sync((logs / "ready").read_text, abandon_on_cancel=True)
        scope.cancel()

    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as scope:
                nursery.start_soon(cancel_when_ready, scope)
                await session.exec(cmd)
            assert scope.cancelled_caught
    for name in ("pid", "leader"):
        pid = int((logs / name).read_text())
        await wait_dead(pid)
        assert not is_alive(pid)


async def test_exec_does_not_wait_for_background_processes_holding_its_pipes(session: LocalSession):
    with trio.fail_after(HANG_GUARD):
        result = await session.exec("sleep 1000 & echo done")
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "done\n", False)


# -- exec_stream --------------------------------------------------------------


async def test_exec_stream_hands_over_every_byte_while_the_command_runs(tmp_path: Path):
    # The limit is far below the output: it bounds exec's result, not the stream.
    env = LocalEnvironment({"root": str(tmp_path), "max_output_bytes": 1000})
    session = await env.open(env.build_config(_plan()), FULL)
    logs = root_of(session) / "logs"
    os.mkfifo(logs / "go")
    received: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    all_before_exit = trio.Event()

    async def on_output(stream: str, chunk: bytes) -> None:
        received[stream] += chunk
        if len(received["stdout"]) == 300000 and received["stderr"] == b"err\n":
            all_before_exit.set()

    async def release_when_streamed() -> None:
        await all_before_exit.wait()
        # The command is blocked reading the FIFO: it has not exited yet.
        await trio.to_thread.run_sync((logs / "go").write_text, "go\n")

    try:
        with trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_when_streamed)
                result = await session.exec_stream(
                    'head -c 300000 /dev/zero; echo err >&2; read x < "$LOGS_DIR/go"; echo end',
                    on_output=on_output,
                )
    finally:
        await session.close()
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (0, "", "", False)
    assert received == {"stdout": b"\0" * 300000 + b"end\n", "stderr": b"err\n"}


@needs_proc
async def test_exec_stream_keeps_output_a_slow_consumer_has_not_taken_yet(session: LocalSession):
    # The command writes a line, then (once released) 60000 bytes, which fit
    # in the pipe, and exits while the consumer still holds the first line for
    # longer than the half second exec waits for buffered output.
    logs = root_of(session) / "logs"
    os.mkfifo(logs / "go")
    chunks: list[bytes] = []

    async def slow(stream: str, chunk: bytes) -> None:
        chunks.append(chunk)
        if len(chunks) == 1:
            await trio.to_thread.run_sync((logs / "go").write_text, "go\n")
            await wait_dead(int((logs / "leader").read_text()))
            await trio.sleep(1)  # a slow consumer, not a wait for a condition

    cmd = 'echo $$ > "$LOGS_DIR/leader"; echo first; read x < "$LOGS_DIR/go"; head -c 60000 /dev/zero; echo last'
    with trio.fail_after(HANG_GUARD):
        result = await session.exec_stream(cmd, on_output=slow)
    assert result.exit_code == 0
    assert b"".join(chunks) == b"first\n" + b"\0" * 60000 + b"last\n"


async def test_an_exception_from_on_output_kills_the_command_and_propagates(session: LocalSession):
    class Stop(Exception):
        pass

    async def refuse(stream: str, chunk: bytes) -> None:
        raise Stop

    with trio.fail_after(HANG_GUARD), pytest.RaisesGroup(Stop, allow_unwrapped=True, flatten_subgroups=True):
        await session.exec_stream('echo $$ > "$LOGS_DIR/leader"; echo hi; exec sleep 1000', on_output=refuse)
    await wait_dead(int((root_of(session) / "logs" / "leader").read_text()))
    assert (await session.exec("echo again")).stdout == "again\n"


class _CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` at the n-th time ``task`` is scheduled."""

    def __init__(self, n: int, task: trio.lowlevel.Task, scope: trio.CancelScope):
        self.n, self.task, self.scope, self.seen = n, task, scope, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.seen += 1
            if self.seen == self.n:
                self.scope.cancel()


@needs_proc
async def test_exec_cancelled_at_every_step_leaves_no_process(session: LocalSession):
    """Cancel an exec at its 1st, 2nd, ... scheduling step until one completes:
    whatever step it was in (spawning, reading, waiting), nothing it started lives on."""
    root = root_of(session)
    with trio.fail_after(HANG_GUARD * 3):
        for n in range(1, 100):
            with trio.CancelScope() as scope:
                instrument = _CancelAtStep(n, trio.lowlevel.current_task(), scope)
                trio.lowlevel.add_instrument(instrument)
                try:
                    result = await session.exec("sleep 0.05; echo done")
                finally:
                    trio.lowlevel.remove_instrument(instrument)
            if not scope.cancelled_caught:
                assert result.stdout == "done\n"
                break
            assert processes_marked(root) == [], f"cancelled at step {n}"
        else:
            pytest.fail("exec never completed")
    assert n >= 3  # cancelled before the spawn, and again once the command was running


# -- close and reap -----------------------------------------------------------


async def test_close_is_idempotent_and_removes_the_directory(tmp_path: Path):
    session = await LocalEnvironment({"root": str(tmp_path)}).open(None, FULL)
    root = root_of(session)
    # An agent may leave read-only directories behind; close still removes them.
    await session.exec("mkdir -p locked/inner && touch locked/inner/f && chmod -R a-w locked")
    await session.close()
    assert not root.exists()
    await session.close()
    assert not root.exists()


async def test_close_removes_links_and_files_beside_the_subdirectories_without_following_links(tmp_path: Path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    session = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, FULL)
    root = root_of(session)
    # Top-level entries of the sandbox itself: a link to a directory elsewhere, a file, a full directory.
    await session.exec(f"ln -s {outside} ../dirlink && echo x > ../file && mkdir ../extra && touch ../extra/f")
    await session.close()
    assert not root.exists()
    assert (outside / "keep").is_dir()  # the link was removed, not followed


@needs_proc
async def test_close_kills_leftover_background_processes(session: LocalSession):
    background = await session.exec("sleep 1000 >/dev/null 2>&1 & echo $!")
    escaped = await session.exec("setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $!")
    pids = [int(background.stdout), int(escaped.stdout)]
    assert all(is_alive(pid) for pid in pids)
    await session.close()
    for pid in pids:
        await wait_dead(pid)
        assert not is_alive(pid)


@needs_proc
async def test_concurrent_closes_kill_every_sessions_escaped_daemon(tmp_path: Path):
    env = LocalEnvironment({"root": str(tmp_path)})
    sessions = [await env.open(None, FULL) for _ in range(8)]
    pids = []
    for session in sessions:
        escaped = await session.exec("setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $!")
        pids.append(int(escaped.stdout))
    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(session.close)
    for pid in pids:
        await wait_dead(pid)
        assert not is_alive(pid)
    assert list(tmp_path.iterdir()) == []


async def ask_a_then_b_and_c(answer: Callable[[int], list[Marked]]) -> tuple[int, dict[str, object]]:
    """Drive one shared scanner: ``a`` asks; while its scan runs (held until
    then), ``b`` and ``c`` ask; then ``a``'s scan ends. ``answer(n)`` is the
    result of the n-th scan (or raises). Returns how many scans ran and what
    each caller got (or its ``OSError``)."""
    calls = 0
    first_scan_may_end = threading.Event()

    def scan() -> list[Marked]:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_scan_may_end.wait(HANG_GUARD)
        return answer(calls)

    scanner = Scanner(scan)
    outcome: dict[str, object] = {}

    async def ask(caller: str) -> None:
        try:
            outcome[caller] = await scanner.scan()
        except OSError as exc:
            outcome[caller] = exc

    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(ask, "b")
            nursery.start_soon(ask, "c")
            await trio.testing.wait_all_tasks_blocked()
            first_scan_may_end.set()
    return calls, outcome


def nth_scan(n: int) -> list[Marked]:
    return [Marked(pid=100 + n, pgid=1, sandbox="/s", name="n")]


async def test_closes_share_proc_scans_begun_after_they_asked():
    calls, results = await ask_a_then_b_and_c(nth_scan)
    # b and c asked while a's scan ran: they must not take its result, and share the next.
    assert calls == 2
    assert results == {"a": nth_scan(1), "b": nth_scan(2), "c": nth_scan(2)}


async def test_a_failed_shared_scan_fails_its_caller_and_the_others_retry():
    def answer(n: int) -> list[Marked]:
        if n == 2:
            raise OSError("proc unreadable")
        return nth_scan(n)

    calls, outcome = await ask_a_then_b_and_c(answer)
    # Whichever of b and c ran the failing scan sees the error; the other asks for a new scan.
    assert calls == 3
    failed = [caller for caller in "bc" if isinstance(outcome[caller], OSError)]
    assert len(failed) == 1
    (retried,) = set("bc") - set(failed)
    assert outcome["a"] == nth_scan(1) and outcome[retried] == nth_scan(3)


@needs_proc
async def test_one_proc_scan_reads_both_marks_of_a_sessions_processes(session: LocalSession):
    pid = int((await session.exec("setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $!")).stdout)
    # Scanned once it runs sleep: while a process is inside execve its environ reads empty.
    await poll_until(lambda: Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x001000\x00", "setsid to exec sleep")
    found = {p.pid: p for p in await trio.to_thread.run_sync(scan)}
    # Its group is what it was at the scan (setsid may not have run yet): not compared.
    assert (found[pid].sandbox, found[pid].name) == (session.handle["path"], session.name)
    await session.close()
    await wait_dead(pid)
    assert pid not in {p.pid for p in await trio.to_thread.run_sync(scan)}


async def test_exec_reports_a_removed_app_directory(session: LocalSession):
    await session.exec('rmdir "$APP_DIR"')
    with pytest.raises(IssueError, match="working directory '/app' does not exist"):
        await session.exec("true")


async def test_operations_after_close_raise(session: LocalSession):
    await session.close()
    for operation in (
        session.exec("true"),
        session.read_file("/app/x"),
        session.write_file("/app/x", "x"),
        session.set_network_policy(FULL),
    ):
        with pytest.raises(IssueError) as exc:
            await operation
        assert_environment_failed(exc.value)


@needs_proc
async def test_reap_removes_a_leftover_sandbox_and_its_processes(tmp_path: Path):
    env = LocalEnvironment({"root": str(tmp_path)})
    session = await env.open(None, FULL)
    handle = session.handle
    pid = int((await session.exec("sleep 1000 >/dev/null 2>&1 & echo $!")).stdout)
    # As after a killed runtime: the session object is gone, only the journaled handle remains.
    del session
    await env.reap(handle)
    assert not await trio.Path(handle["path"]).exists()
    await wait_dead(pid)
    assert not is_alive(pid)
    await env.reap(handle)  # idempotent


async def test_reap_refuses_a_directory_that_is_not_a_sandbox(tmp_path: Path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "data").write_text("keep me")
    with pytest.raises(IssueError) as exc:
        await LocalEnvironment({}).reap({"path": str(tmp_path / "precious")})
    assert (exc.value.severity, exc.value.code) == ("warning", "cleanup_failed")
    assert (tmp_path / "precious" / "data").read_text() == "keep me"


# -- network policy -----------------------------------------------------------


def _plan(**policies: NetworkPolicy) -> ExecutionPlan:
    return ExecutionPlan(task_id="t", attempt=0, environment=ComponentRef("local"), **policies)


@pytest.mark.parametrize("phase", ["baseline", "run", "evaluation"])
@pytest.mark.parametrize("policy", [NetworkPolicy("none"), NetworkPolicy("allowlist", ("example.com",))])
def test_build_config_rejects_a_policy_it_cannot_enforce(phase: str, policy: NetworkPolicy):
    with pytest.raises(ComponentError, match=f"'local'.*{policy.mode!r}.*{phase} phase"):
        LocalEnvironment({}).build_config(_plan(**{f"{phase}_network_policy": policy}))


async def test_only_full_policy_opens_and_switches(session: LocalSession, tmp_path: Path):
    env = LocalEnvironment({"root": str(tmp_path)})
    config = env.build_config(_plan())
    with pytest.raises(IssueError) as open_error:
        await env.open(config, NetworkPolicy("none"))
    assert_environment_failed(open_error.value)
    await session.set_network_policy(FULL)
    with pytest.raises(IssueError) as switch_error:
        await session.set_network_policy(NetworkPolicy("none"))
    assert_environment_failed(switch_error.value)
