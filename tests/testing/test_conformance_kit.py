"""The Environment conformance kit: fake-env passes; broken providers fail clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio

from agentcompass.runtime import (
    BaseEnvironment,
    ComponentError,
    EnvironmentSession,
    ExecResult,
    ExecutionPlan,
    NetworkPolicy,
    OutputCallback,
)
from agentcompass.testing import (
    EnvironmentConformance,
    FakeEnvironment,
    call_log,
    check_environment,
    environment_conformance_tests,
)


def live(name: str = "default") -> int:
    return len(call_log(name).live_sessions())


async def test_fake_env_passes_every_check() -> None:
    kit = EnvironmentConformance(
        FakeEnvironment({"script": {"bad": {"open": ["fatal"]}}}),
        exec_output=False,
        failing_config={"task_id": "bad"},
        count_sandboxes=live,
    )
    # Everything but what needs real processes or a network (fake-env names
    # its sessions and sweeps them).
    needs_more = {
        "timeout_kills_tree",
        "cancel_kills_tree",
        "policy_enforced",
        "no_runtime_environment",
        "files_never_follow_links",
        "reads_bounded",
        "exec_stays_in_its_session",
        "gateway_key_masked",
        "gateway_memory_bounded",
    }
    assert kit.checks() == [c for c in EnvironmentConformance.CHECKS if c not in needs_more]
    await kit.run_all()
    log = call_log()
    assert log.opened_sessions()
    assert set(log.closed_sessions()) == set(log.opened_sessions())
    # Every policy was switched to and back.
    assert {"none", "allowlist", "full"} <= {c.detail["mode"] for c in log.select("set_network_policy")}


async def test_rejecting_policies_in_build_config_passes() -> None:
    env = FakeEnvironment({"policies": ["full", "none"], "switchable": False})
    await check_environment(env, exec_output=False, count_sandboxes=live)
    log = call_log()
    # Asked only for what it accepted: never a policy it cannot enforce, never a switch.
    assert "allowlist" not in {c.detail["policy"] for c in log.select("open")}
    assert {c.detail["mode"] for c in log.select("set_network_policy")} == {"full"}


async def test_open_cancelled_part_way_is_covered() -> None:
    # The second open (the one cancelled at its first blocking point) hangs.
    env = FakeEnvironment({"script": {"*": {"open": ["ok", "hang"]}}})
    kit = EnvironmentConformance(env, exec_output=False, count_sandboxes=live)
    await kit.run("close_after_cancelled_open")
    assert [c.detail["action"] for c in call_log().select("open")] == ["ok", "hang", "ok"]


async def test_failing_config_that_does_not_fail_is_reported() -> None:
    kit = EnvironmentConformance(FakeEnvironment({}), exec_output=False, failing_config={"task_id": "fine"})
    with pytest.raises(AssertionError, match="failing_config must make open fail"):
        await kit.run("close_after_failed_open")
    assert not call_log().live_sessions()


async def test_a_close_that_leaks_is_caught_by_the_probe() -> None:
    kit = EnvironmentConformance(
        FakeEnvironment({"script": {"*": {"close": ["fatal"]}}}), exec_output=False, count_sandboxes=live
    )
    with pytest.raises(AssertionError, match=r"'open_exec_handle': close\(\) raised IssueError"):
        await kit.run("open_exec_handle")


def test_unknown_check() -> None:
    kit = EnvironmentConformance(FakeEnvironment({}))
    with pytest.raises(ValueError, match="unknown check"):
        trio.run(kit.run, "everything")


# -- deliberately broken providers -----------------------------------------------


class MemSession(EnvironmentSession):
    """A working in-memory session whose faults the test switches on."""

    def __init__(self, env: MemEnvironment, name: int, policy: NetworkPolicy):
        self.env = env
        self.name = name
        self.policy = policy
        self.closed = False
        self.files: dict[str, bytes] = {}

    @property
    def handle(self) -> dict[str, Any]:
        return self.env.faults.get("handle", {"sandbox": self.name})

    def _check_open(self) -> None:
        if self.closed and "ops_after_close_work" not in self.env.faults:
            raise RuntimeError("closed")

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        await trio.lowlevel.checkpoint()
        self._check_open()
        words = cmd.split() if isinstance(cmd, str) else cmd
        return ExecResult(0, stdout=" ".join(words[1:]) + "\n")

    async def exec_stream(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        *,
        on_output: OutputCallback,
    ) -> ExecResult:
        result = await super().exec_stream(cmd, timeout, cwd, env, on_output=on_output)
        if "stream_keeps_output" in self.env.faults:
            return await self.exec(cmd, timeout, cwd, env)
        return result

    async def read_file(self, path: str) -> bytes:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self.files[path]

    async def write_file(self, path: str, data: bytes | str) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        self.files[path] = data.encode() if isinstance(data, str) else data

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if policy.mode in self.env.faults.get("refuse_switch", ()):
            raise RuntimeError(f"cannot do {policy.mode}")
        self.policy = policy

    async def close(self) -> None:
        if self.closed:
            if "close_twice_fails" in self.env.faults:
                raise RuntimeError("already closed")
            return
        if "close_hangs" in self.env.faults:
            with trio.CancelScope(shield=True):  # a provider that ignores its caller's deadline
                await trio.sleep(self.env.faults["close_hangs"])
        await trio.lowlevel.checkpoint()
        self.closed = True
        if "close_leaks" not in self.env.faults:
            self.env.live.discard(self.name)


class MemEnvironment(BaseEnvironment):
    id: ClassVar[str] = "mem"

    def __init__(self, faults: dict[str, Any] | None = None):
        super().__init__({})
        self.faults = faults or {}
        self.live: set[int] = set()
        self.count = 0

    def build_config(self, plan: ExecutionPlan) -> Any:
        if "build_config_raises" in self.faults:
            raise self.faults["build_config_raises"]
        return {}

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> MemSession:
        if "open_converts_cancelled" in self.faults:
            try:
                await trio.sleep(0.001)
            except trio.Cancelled:
                raise RuntimeError("open interrupted") from None
        await trio.lowlevel.checkpoint()
        self.count += 1
        self.live.add(self.count)
        return MemSession(self, self.count, policy)

    async def reap(self, handle: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        self.live.discard(handle.get("sandbox"))  # type: ignore[arg-type]


async def test_a_working_provider_passes_with_output_checks() -> None:
    env = MemEnvironment()
    await check_environment(env, count_sandboxes=lambda: len(env.live), real_processes=False)


@pytest.mark.parametrize(
    ("faults", "check", "match"),
    [
        ({"close_twice_fails": True}, "close_idempotent", r"a second close\(\) raised .*idempotent"),
        ({"handle": {"path": Path("/tmp/x")}}, "open_exec_handle", "not JSON-serializable"),
        ({"handle": {"argv": ("a", "b")}}, "open_exec_handle", "changes in a JSON round trip"),
        ({"handle": {"blob": "x" * 10_000}}, "open_exec_handle", "keep it under 4096"),
        ({"ops_after_close_work": True}, "ops_after_close_fail", "operations on a closed session must raise"),
        ({"close_leaks": True}, "close_idempotent", r"1 sandbox\(es\) left behind"),
        (
            {"refuse_switch": ("none",)},
            "policies",
            r"set_network_policy\(.*'none'.*must reject plans it cannot",
        ),
        (
            {"build_config_raises": TypeError("nope")},
            "open_exec_handle",
            "build_config rejected the base plan",
        ),
        ({"open_converts_cancelled": True}, "close_after_cancelled_open", "let Cancelled propagate"),
        ({"close_hangs": 0.2}, "close_under_cancellation", "did not finish within the 0.05s grace"),
        ({"stream_keeps_output": True}, "open_exec_handle", "it belongs to on_output only"),
    ],
)
async def test_broken_provider_fails_with_a_clear_message(faults: dict[str, Any], check: str, match: str) -> None:
    env = MemEnvironment(faults)
    kit = EnvironmentConformance(env, count_sandboxes=lambda: len(env.live), grace_seconds=0.05)
    with pytest.raises(AssertionError, match=match) as info:
        await kit.run(check)
    assert f"environment 'mem' fails conformance check {check!r}" in str(info.value)
    # run_all stops at the same violation (or an earlier one).
    with pytest.raises(AssertionError, match="environment 'mem' fails conformance check"):
        env = MemEnvironment(faults)
        await EnvironmentConformance(env, count_sandboxes=lambda: len(env.live), grace_seconds=0.05).run_all()


async def test_build_config_must_reject_with_component_error() -> None:
    class Picky(MemEnvironment):
        def build_config(self, plan: ExecutionPlan) -> Any:
            if plan.run_network_policy.mode == "none":
                raise ValueError("no")
            return {}

    with pytest.raises(AssertionError, match="reject a plan with ComponentError"):
        await EnvironmentConformance(Picky()).run("policies")

    class Rejecting(MemEnvironment):
        def build_config(self, plan: ExecutionPlan) -> Any:
            if "none" in (plan.baseline_network_policy.mode, plan.run_network_policy.mode):
                raise ComponentError("mem cannot do none")
            return {}

    await EnvironmentConformance(Rejecting({"refuse_switch": ("none",)})).run("policies")


async def test_a_hanging_check_fails_as_hung(autojump_clock: trio.abc.Clock) -> None:
    class Hanging(MemEnvironment):
        async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> MemSession:
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    with pytest.raises(AssertionError, match="did not finish within 5s"):
        await EnvironmentConformance(Hanging(), timeout_seconds=5).run("open_exec_handle")


# One pytest test per check, as a provider's own test suite would do it.
test_generated_for_fake_env = environment_conformance_tests(
    lambda: FakeEnvironment({"log": "generated", "script": {"bad": {"open": ["fatal"] * 3}}}),
    exec_output=False,
    failing_config={"task_id": "bad"},
    count_sandboxes=lambda: live("generated"),
)


# -- the checks that need real processes, a network or named sessions ---------------


class _Leaky(MemEnvironment):
    """Writes an absolute write_file path on the host: what files_confined must catch."""

    async def open(self, config: Any, policy: NetworkPolicy) -> MemSession:
        session = await super().open(config, policy)

        async def write_file(path: str, data: bytes | str) -> None:
            await trio.Path(path).write_bytes(data.encode() if isinstance(data, str) else data)

        session.write_file = write_file  # type: ignore[method-assign]
        return session


async def test_files_confined_catches_a_write_to_the_host() -> None:
    with pytest.raises(AssertionError, match="wrote the host file"):
        await EnvironmentConformance(_Leaky(), real_processes=False).run("files_confined")


async def test_an_exec_that_ignores_its_timeout_is_caught() -> None:
    kit = EnvironmentConformance(MemEnvironment())
    with pytest.raises(AssertionError, match="returned timed_out=False"):
        await kit.run("timeout_kills_tree")
    with pytest.raises(AssertionError, match="returned before it was cancelled"):
        await kit.run("cancel_kills_tree")


class _NamedMem(MemEnvironment):
    """Takes a name but its sweep destroys nothing."""

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> MemSession:
        return await super().open(config, policy)

    async def sweep(self, tag: str) -> None:
        await trio.lowlevel.checkpoint()


async def test_sweep_is_checked_for_providers_that_take_names() -> None:
    assert "sweep" not in EnvironmentConformance(MemEnvironment()).checks()
    kit = EnvironmentConformance(_NamedMem(), real_processes=False)
    assert "sweep" in kit.checks()
    with pytest.raises(AssertionError, match=r"still runs commands after sweep"):
        await kit.run("sweep")


async def test_policy_enforced_catches_a_policy_that_is_only_accepted() -> None:
    # local runs real commands on the host's network; one that claims to
    # enforce every policy shows that the probe really connects and checks.
    from agentcompass.environments.local import LocalEnvironment

    class Pretending(LocalEnvironment):
        def build_config(self, plan: ExecutionPlan) -> Any:
            return self.options

        async def open(self, config: Any, policy: NetworkPolicy) -> Any:
            session = await super().open(config, NetworkPolicy("full"))

            async def accept_any(policy: NetworkPolicy) -> None:
                await trio.lowlevel.checkpoint()

            session.set_network_policy = accept_any  # type: ignore[method-assign]
            return session

    kit = EnvironmentConformance(Pretending({}), host_address=lambda session: "127.0.0.1")
    with pytest.raises(AssertionError, match=r"under NetworkPolicy\(mode='none'.*succeeded"):
        await kit.run("policy_enforced")


# -- a naive host-directory provider: what the hostile-session checks catch --------


class _NaiveSession(EnvironmentSession):
    """Commands in a host directory with the runtime's environment; files opened
    by path (following links); ``shared`` makes every session one directory."""

    def __init__(self, root: Path):
        self.root = root

    @property
    def handle(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        import os

        variables = {**os.environ, "APP_DIR": str(self.root / "app")}
        done = await trio.run_process(
            ["bash", "-c", cmd],
            cwd=self.root / "app",
            env=variables,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        return ExecResult(done.returncode, done.stdout.decode(), done.stderr.decode())

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        import os

        def read() -> bytes:
            fd = os.open(self._path(path), os.O_RDONLY | os.O_NONBLOCK)
            try:
                return os.read(fd, 1 << 20)
            finally:
                os.close(fd)

        return await trio.to_thread.run_sync(read)

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await trio.Path(target).write_bytes(data.encode() if isinstance(data, str) else data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


class _NaiveEnvironment(BaseEnvironment):
    id = "naive"

    def __init__(self, root: Path, shared: bool = False):
        super().__init__({})
        self._root, self._shared, self._count = root, shared, 0

    async def open(self, config: Any, policy: NetworkPolicy) -> EnvironmentSession:
        self._count += 1
        root = self._root / ("shared" if self._shared else str(self._count))
        (root / "app").mkdir(parents=True, exist_ok=True)
        await trio.lowlevel.checkpoint()
        return _NaiveSession(root)


@pytest.mark.parametrize(
    ("check", "says"),
    [
        ("no_runtime_environment", "sees the runtime's variable"),
        ("files_never_follow_links", "followed a link the session planted"),
        ("reads_bounded", "returned instead of raising FileRefusedError"),
    ],
)
async def test_hostile_session_checks_catch_a_naive_provider(tmp_path: Path, check: str, says: str) -> None:
    kit = EnvironmentConformance(_NaiveEnvironment(tmp_path))
    assert check in kit.checks()
    with pytest.raises(AssertionError, match=says):
        await kit.run(check)


async def test_exec_stays_in_its_session_catches_shared_sessions(tmp_path: Path) -> None:
    kit = EnvironmentConformance(_NaiveEnvironment(tmp_path, shared=True))
    with pytest.raises(AssertionError, match="read another session's file"):
        await kit.run("exec_stays_in_its_session")
