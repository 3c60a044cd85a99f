"""The ``terminal`` benchmark against hostile task directories and verifiers:
links out of a task, reward files that are FIFOs, huge, links or gone, and a
verifier run privately where the session offers it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _terminal_tasks import make_task

from agentcompass._orchestration._session import GuardedSession
from agentcompass.benchmarks.terminal import TerminalBenchmark
from agentcompass.environments.local import LocalEnvironment, LocalSession
from agentcompass.runtime import (
    ComponentError,
    ComponentRef,
    EnvironmentSession,
    ExecResult,
    IssueError,
    NetworkPolicy,
    PreparedTask,
    RunRequest,
    RunResult,
    TaskSpec,
)
from agentcompass.testing import MemorySession

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux file semantics")

HANG_GUARD = 20
HOST_SECRET = "HOST-SECRET-0123456789\n"


def request_for(path: Path, harness: str = "oracle") -> RunRequest:
    return RunRequest(
        name="t",
        benchmark=ComponentRef("terminal", {"path": str(path)}),
        environment=ComponentRef("local"),
        harness=ComponentRef(harness),
    )


async def load(path: Path) -> list[TaskSpec]:
    request = request_for(path)
    return await TerminalBenchmark(request.benchmark.config).load_tasks(request)


@pytest.fixture
def root_only_file(tmp_path: Path) -> Path:
    """A host file only its owner (root, where the tests run as root) may read."""
    private = tmp_path / "host" / "private.key"
    private.parent.mkdir()
    private.write_text(HOST_SECRET)
    private.chmod(0o600)
    return private


def files_under(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` (links not followed) -> its bytes."""
    found = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = Path(parent, name)
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(directory))] = path.read_bytes()
    return found


# -- task directories ---------------------------------------------------------


@pytest.mark.parametrize(
    "link, target",
    [
        ("environment/shadow", "/etc/shadow"),
        ("environment/key", "ROOT_ONLY"),
        ("environment/sub/up", "../../../elsewhere"),  # relative, dangling
        ("tests/missing", "/nonexistent/file"),  # absolute, dangling
        ("solution/bin", "/usr/bin"),  # a directory
        ("instruction.md", "/etc/hostname"),
        # Each step stays inside lexically, but ``self`` is the task directory,
        # so ``self/..`` is its parent: what the kernel would open is outside.
        ("environment/tricky", "self/../outside"),
    ],
)
async def test_a_link_out_of_the_task_directory_fails_the_load(
    tmp_path: Path, root_only_file: Path, link: str, target: str
):
    task = make_task(tmp_path / "tasks", "leaky", env_files={"given.txt": "x"})
    (task / "environment" / "self").symlink_to("..")
    path = task / link
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(str(root_only_file) if target == "ROOT_ONLY" else target)
    with pytest.raises(ComponentError) as exc:
        await load(tmp_path / "tasks")
    message = str(exc.value)
    assert "\n" not in message
    assert "'leaky'" in message and f"symbolic link {link!r} points outside the task directory" in message


async def test_links_that_stay_inside_are_copied_as_links_and_loading_reads_through_them(tmp_path: Path):
    task = make_task(tmp_path / "tasks", "linked", env_files={"data/real.txt": "real\n"})
    (task / "environment" / "alias.txt").symlink_to("data/real.txt")
    (task / "environment" / "absolute.txt").symlink_to(task / "environment" / "data" / "real.txt")
    (task / "environment" / "data-dir").symlink_to("data")
    (task / "prompt.md").write_text("Do the linked task.\n")
    (task / "instruction.md").unlink()
    (task / "instruction.md").symlink_to("prompt.md")
    [spec] = await load(tmp_path / "tasks")
    assert spec.data["instruction"] == "Do the linked task.\n"

    request = request_for(tmp_path / "tasks", harness="some-agent")
    env = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy())
    try:
        with trio.fail_after(HANG_GUARD):
            await TerminalBenchmark(request.benchmark.config).prepare_task(spec, env, request, {})
            app = Path(env.handle["path"]) / "app"
            assert {name: os.readlink(app / name) for name in ("alias.txt", "absolute.txt", "data-dir")} == {
                "alias.txt": "data/real.txt",
                "absolute.txt": "data/real.txt",  # made relative: the host path means nothing in a session
                "data-dir": "data",
            }
            seen = await env.exec("cat alias.txt absolute.txt data-dir/real.txt")
    finally:
        await env.close()
    assert seen.stdout == "real\n" * 3


@pytest.mark.parametrize("command", ["validate", "launch"])
def test_compass_exits_2_naming_the_task_and_the_link(tmp_path: Path, root_only_file: Path, command: str):
    task = make_task(tmp_path / "tasks", "leaky")
    (task / "environment").mkdir()
    (task / "environment" / "key").symlink_to(root_only_file)
    (task / "environment" / "shadow").symlink_to("/etc/shadow")
    (tmp_path / "config.yaml").write_text(
        "requests:\n"
        "  - name: hostile\n"
        "    benchmark: {id: terminal, config: {path: tasks}}\n"
        "    harness: {id: oracle}\n"
        "    environment: {id: local}\n"
    )
    extra = ("--output-root", "runs") if command == "launch" else ()
    done = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", command, "config.yaml", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert "'leaky'" in line and "symbolic link 'environment/key' points outside the task directory" in line
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran, no session was opened


async def test_links_planted_after_the_load_reach_nothing_of_the_host(tmp_path: Path, root_only_file: Path):
    task = make_task(tmp_path / "tasks", "changed", env_files={"given.txt": "given\n"})
    [spec] = await load(tmp_path / "tasks")
    # The task directory changes between the load and the run.
    (task / "environment" / "shadow").symlink_to("/etc/shadow")
    (task / "environment" / "key").symlink_to(root_only_file)
    os.mkfifo(task / "environment" / "pipe")
    request = request_for(tmp_path / "tasks", harness="some-agent")
    env = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy())
    try:
        with trio.fail_after(HANG_GUARD), pytest.raises(IssueError) as exc:
            await TerminalBenchmark(request.benchmark.config).prepare_task(spec, env, request, {})
        copied = files_under(Path(env.handle["path"]))
        app_entries = os.listdir(Path(env.handle["path"]) / "app")
    finally:
        await env.close()
    assert (exc.value.severity, exc.value.code) == ("fatal", "setup_failed")
    assert "environment/key" in exc.value.message and "outside the task directory" in exc.value.message
    shadow = Path("/etc/shadow").read_bytes()
    assert not any(HOST_SECRET.encode() in data or shadow in data for data in copied.values())
    assert app_entries == []


async def test_a_fifo_planted_after_the_load_is_left_out_without_blocking(tmp_path: Path):
    task = make_task(tmp_path / "tasks", "piped", env_files={"given.txt": "given\n"})
    [spec] = await load(tmp_path / "tasks")
    os.mkfifo(task / "environment" / "pipe")
    request = request_for(tmp_path / "tasks", harness="some-agent")
    env = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy())
    try:
        with trio.fail_after(HANG_GUARD):
            await TerminalBenchmark(request.benchmark.config).prepare_task(spec, env, request, {})
        listing = sorted(os.listdir(Path(env.handle["path"]) / "app"))
    finally:
        await env.close()
    assert listing == ["given.txt"]


# -- reward files a verifier leaves -------------------------------------------


async def evaluate_under_local(tmp_path: Path, test_sh: str) -> tuple[Any, RunResult]:
    make_task(tmp_path / "tasks", "t", f'v="${{LOGS_DIR:-/logs}}/verifier"\n{test_sh}\n')
    [task] = await load(tmp_path / "tasks")
    request = request_for(tmp_path / "tasks", harness="some-agent")
    benchmark = TerminalBenchmark(request.benchmark.config)
    env = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy())
    run_result = RunResult()
    try:
        with trio.fail_after(HANG_GUARD):
            prepared = await benchmark.prepare_task(task, env, request, {})
            evaluation = await benchmark.evaluate(prepared, run_result, GuardedSession(env, NetworkPolicy()), request)
    finally:
        await env.close()
    return evaluation, run_result


@pytest.mark.parametrize(
    "test_sh, detail",
    [
        ('mkfifo "$v/reward.txt"', "not a regular file"),
        ('truncate -s 4G "$v/reward.txt"', "larger than 1048576 bytes"),
        ('head -c 1048577 /dev/zero | tr "\\0" 1 > "$v/reward.txt"', "larger than 1048576 bytes"),
        ('ln -s "$HOST_REWARD" "$v/reward.txt"', "symbolic link"),
        ('ln -s "$HOST_REWARD" "$v/reward.json"', "symbolic link"),
        ('mkdir "$v/reward.txt"', "directory"),
    ],
    ids=["fifo", "sparse-4g", "just-over-1mib", "link-txt", "link-json", "directory"],
)
async def test_an_unreadable_reward_scores_0_with_a_warning_quickly_and_in_bounded_memory(
    tmp_path: Path, test_sh: str, detail: str
):
    host_reward = tmp_path / "host-reward.txt"
    host_reward.write_text("1\n")  # followed, the link would pass the task
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    evaluation, run_result = await evaluate_under_local(tmp_path, test_sh.replace("$HOST_REWARD", str(host_reward)))
    assert evaluation.values == {"reward": 0.0, "passed": False}
    [issue] = evaluation.issues
    assert (issue.severity, issue.phase, issue.code) == ("warning", "evaluate", "reward_unparseable")
    assert detail in issue.message
    assert run_result.artifacts["verifier"]["exit_code"] == 0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 256 * 1024


class VanishingReward(MemorySession):
    """A session whose verifier leaves ``reward.txt``, gone by the time it is read."""

    async def exec(self, cmd: str | list[str], timeout: float | None = None, cwd: str | None = None, env: Any = None):
        await trio.lowlevel.checkpoint()
        return ExecResult(0, stdout="reward.txt\n" if "for f in reward.txt" in str(cmd) else "")


async def test_a_reward_that_vanished_before_it_was_read_scores_0_with_a_warning(tmp_path: Path):
    make_task(tmp_path / "tasks", "t")
    [task] = await load(tmp_path / "tasks")
    request = request_for(tmp_path / "tasks")
    # Through the runtime's wrapper, which tags the provider's FileNotFoundError as an Environment failure.
    env = GuardedSession(VanishingReward(), NetworkPolicy())
    evaluation = await TerminalBenchmark(request.benchmark.config).evaluate(
        PreparedTask(task=task, input={}, metadata={"prepared_in": env.handle}), RunResult(), env, request
    )
    assert evaluation.values == {"reward": 0.0, "passed": False}
    assert [(i.severity, i.code) for i in evaluation.issues] == [("warning", "reward_unparseable")]
    assert "vanished" in evaluation.issues[0].message


# -- exec_private -------------------------------------------------------------


class PrivateVerifier(EnvironmentSession):
    """A ``local`` session that offers ``exec_private``: the command runs in the
    session (so test.sh still writes the shared reward), and what it returns
    stands for the private directory the provider would have given it."""

    def __init__(self, inner: LocalSession, private_files: dict[str, bytes]):
        self.inner = inner
        self.private_files = private_files
        self.private_calls: list[dict[str, Any]] = []

    @property
    def handle(self) -> dict[str, Any]:
        return self.inner.handle

    async def exec(self, cmd: Any, timeout: Any = None, cwd: Any = None, env: Any = None) -> ExecResult:
        return await self.inner.exec(cmd, timeout, cwd, env)

    async def exec_private(
        self,
        cmd: Any,
        timeout: Any = None,
        cwd: Any = None,
        env: Any = None,
        *,
        directory: str,
        max_bytes: int,
        inputs: Any = None,
    ) -> tuple[ExecResult, dict[str, bytes]]:
        self.private_calls.append({"cmd": cmd, "directory": directory, "max_bytes": max_bytes, "inputs": inputs})
        for path, content in (inputs or {}).items():  # a provider would keep these private
            await self.inner.write_file(path, content)
        await self.inner.exec('mkdir -p "$LOGS_DIR/verifier"')  # the private directory starts empty
        return await self.inner.exec(cmd, timeout, cwd, env), dict(self.private_files)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return await self.inner.read_file(path, max_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self.inner.write_file(path, data)


async def evaluate_privately(tmp_path: Path, private_files: dict[str, bytes]) -> tuple[Any, RunResult, PrivateVerifier]:
    # The shared directory says the task passed; only the private files count.
    make_task(tmp_path / "tasks", "t", 'echo 1 > "${LOGS_DIR:-/logs}/verifier/reward.txt"; echo verified\n')
    [task] = await load(tmp_path / "tasks")
    request = request_for(tmp_path / "tasks", harness="some-agent")
    benchmark = TerminalBenchmark(request.benchmark.config)
    local = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy())
    env = PrivateVerifier(local, private_files)
    run_result = RunResult()
    try:
        with trio.fail_after(HANG_GUARD):
            prepared = await benchmark.prepare_task(task, env, request, {})
            evaluation = await benchmark.evaluate(prepared, run_result, GuardedSession(env, NetworkPolicy()), request)
        assert (Path(local.handle["path"]) / "logs" / "verifier" / "reward.txt").read_text() == "1\n"
    finally:
        await local.close()
    return evaluation, run_result, env


async def test_the_reward_comes_from_the_files_exec_private_returns(tmp_path: Path):
    evaluation, run_result, env = await evaluate_privately(
        tmp_path, {"reward.txt": b"0.25\n", "reward.json": b'{"reward": 1}'}
    )
    assert evaluation.values == {"reward": 0.25, "passed": False} and evaluation.issues == []
    [call] = env.private_calls
    assert call["directory"] == "/logs/verifier" and call["max_bytes"] == 16 * 1024 * 1024
    # The verifier's own files go in as private inputs, not through the shared /tests.
    assert set(call["inputs"]) == {"/tests/test.sh"}
    assert "test.sh" in call["cmd"]
    assert run_result.artifacts["verifier"] == {"exit_code": 0, "stdout": "verified\n", "stderr": ""}


@pytest.mark.parametrize(
    "files, code",
    [
        ({}, "reward_missing"),
        ({"notes.txt": b"1"}, "reward_missing"),
        ({"reward.txt": b"1" + b" " * (1024 * 1024)}, "reward_unparseable"),
        ({"reward.json": b"[1]"}, "reward_unparseable"),
    ],
    ids=["nothing", "no-reward", "over-1mib", "malformed"],
)
async def test_what_exec_private_returns_is_scored_not_the_shared_directory(
    tmp_path: Path, files: dict[str, bytes], code: str
):
    evaluation, _, _ = await evaluate_privately(tmp_path, files)
    assert evaluation.values == {"reward": 0.0, "passed": False}
    assert [(i.severity, i.code) for i in evaluation.issues] == [("warning", code)]


class DeadSession(PrivateVerifier):
    """A session whose processes are all gone (the agent killed its init):
    every command fails without running, and it offers no private run."""

    async def exec(self, cmd: Any, timeout: Any = None, cwd: Any = None, env: Any = None) -> ExecResult:
        return ExecResult(exit_code=255, stderr="the session's init has exited; nothing ran\n")

    async def exec_private(self, *args: Any, **kwargs: Any) -> tuple[ExecResult, dict[str, bytes]]:
        raise NotImplementedError


async def test_a_session_the_agent_broke_is_scored_zero_not_fatal(tmp_path: Path):
    make_task(tmp_path / "tasks", "t", 'echo 1 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n')
    [task] = await load(tmp_path / "tasks")
    request = request_for(tmp_path / "tasks", harness="some-agent")
    benchmark = TerminalBenchmark(request.benchmark.config)
    local = await LocalEnvironment({"root": str(tmp_path / "sandboxes")}).open(None, NetworkPolicy())
    try:
        with trio.fail_after(HANG_GUARD):
            prepared = await benchmark.prepare_task(task, local, request, {})
            dead = DeadSession(local, {})
            evaluation = await benchmark.evaluate(prepared, RunResult(), GuardedSession(dead, NetworkPolicy()), request)
            assert evaluation.values == {"reward": 0.0, "passed": False}
            [issue] = evaluation.issues
            assert (issue.severity, issue.code) == ("error", "verifier_setup_failed")
            # In a fresh evaluation session the same failure is the infrastructure's: FATAL.
            fresh = attrs.evolve(prepared, metadata={**prepared.metadata, "prepared_in": {"other": 1}})
            with pytest.raises(IssueError) as raised:
                await benchmark.evaluate(fresh, RunResult(), GuardedSession(dead, NetworkPolicy()), request)
            assert raised.value.severity == "fatal"
    finally:
        await local.close()
