"""``fake-env``: a scriptable in-memory Environment provider."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import trio

from agentcompass import register
from agentcompass.runtime import (
    BaseEnvironment,
    ComponentError,
    EnvironmentSession,
    ExecResult,
    ExecutionPlan,
    IssueError,
    NetworkPolicy,
)

from ._calls import call_log
from ._memory import within_limit
from ._policies import MODES
from ._script import script_validator, step

__all__ = ["FakeEnvironment", "FakeSession", "session_id"]

ENV_PHASES = ("open", "exec", "read_file", "write_file", "set_network_policy", "close", "reap")


def _check_modes(_instance: Any, _attribute: Any, value: list[str]) -> None:
    for mode in value:
        if mode not in MODES:
            raise ValueError(f"policies: unknown mode {mode!r} (modes: {', '.join(MODES)})")


@attrs.frozen
class FakeEnvironmentConfig:
    """Config keys of ``fake-env``; see :class:`FakeEnvironment`."""

    log: str = "default"
    script: dict[str, dict[str, list[str]]] = attrs.field(
        factory=dict, validator=script_validator(ENV_PHASES)
    )
    policies: list[str] = attrs.field(factory=lambda: list(MODES), validator=_check_modes)
    switchable: bool = True


def session_id(env: EnvironmentSession | None) -> int | None:
    """The fake session id of ``env``, or ``None`` (no env, or another provider's)."""
    # The runtime hands components a wrapper; look through it.
    env = getattr(env, "inner", env)
    return env.session_id if isinstance(env, FakeSession) else None


@attrs.define(eq=False)
class FakeSession(EnvironmentSession):
    """A session of ``fake-env``: files live in a dict, ``exec`` runs nothing.

    Every operation logs a call and performs its scripted action. ``close``
    is idempotent: the first call runs the ``close`` action and, if that
    succeeds, releases the sandbox; later calls log ``close_again`` and do
    nothing. A first close that fails, hangs or is cancelled leaves the
    sandbox live (a leak) until ``reap(handle)``, as a real provider would.
    Operations on a closed session raise FATAL ``environment_failed``.
    """

    log_name: str
    session_id: int
    task_id: str | None
    policy: NetworkPolicy
    _script: dict[str, dict[str, list[str]]]
    _policies: frozenset[str]
    _switchable: bool
    closed: bool = False
    files: dict[str, bytes] = attrs.Factory(dict)

    @property
    def handle(self) -> dict[str, Any]:
        return {"session": self.session_id, "log": self.log_name}

    async def _step(self, phase: str, **detail: Any) -> str:
        if self.closed or call_log(self.log_name).swept(self.session_id):
            call_log(self.log_name).record(
                "environment", phase, self.task_id, self.session_id, {**detail, "refused": "closed"}
            )
            raise IssueError("fatal", "environment_failed", f"fake-env session {self.session_id} is closed")
        outcome, _ = await step(
            self.log_name, self._script, "environment", phase, self.task_id, self.session_id, detail
        )
        return outcome

    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        await self._step("exec", cmd=cmd if isinstance(cmd, str) else list(cmd), timeout=timeout, cwd=cwd)
        return ExecResult(0, stdout="ok")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes stored at ``path`` (after the scripted action);
        :class:`FileRefusedError` past ``max_bytes``, as a real provider refuses."""
        detail: dict[str, Any] = {"path": path} if max_bytes is None else {"path": path, "max_bytes": max_bytes}
        await self._step("read_file", **detail)
        try:
            data = self.files[path]
        except KeyError:
            raise FileNotFoundError(path) from None
        return within_limit(path, data, max_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._step("write_file", path=path)
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._step("set_network_policy", mode=policy.mode, allow=list(policy.allow))
        if policy.mode not in self._policies:
            raise IssueError(
                "fatal", "environment_failed", f"fake-env cannot enforce network policy {policy.mode!r}"
            )
        if not self._switchable and policy != self.policy:
            raise IssueError(
                "fatal",
                "environment_failed",
                f"fake-env cannot switch network policy live ({self.policy.mode!r} -> {policy.mode!r})",
            )
        self.policy = policy

    async def close(self) -> None:
        log = call_log(self.log_name)
        if self.closed:
            log.record("environment", "close_again", self.task_id, self.session_id)
            await trio.lowlevel.checkpoint()
            return
        # Marked closed before acting: a close that fails or is cancelled is not
        # retried by a later close() - that is what reap is for.
        self.closed = True
        await step(self.log_name, self._script, "environment", "close", self.task_id, self.session_id)
        log.release(self.session_id)


@register
class FakeEnvironment(BaseEnvironment):
    """``fake-env``: an in-memory provider whose every call is logged and scriptable.

    Config keys:

    - ``log`` (``"default"``): the :func:`call_log` name its calls go to.
    - ``script`` (``{}``): ``{task_id or "*": {phase: [action, ...]}}`` with
      phases ``open``, ``exec``, ``read_file``, ``write_file``,
      ``set_network_policy``, ``close``, ``reap`` (see the action table in
      :mod:`agentcompass.testing`).
    - ``policies`` (``["none", "allowlist", "full"]``): the modes it can enforce.
    - ``switchable`` (``true``): whether it can change the policy of an open session.

    ``build_config(plan)`` returns ``{"task_id", "attempt"}`` and rejects,
    with a :class:`ComponentError` naming the provider and the phase, a plan
    whose baseline, run or evaluation policy has a mode outside ``policies``,
    or whose phases need different policies when it is not ``switchable``.
    The evaluation policy is ignored in evaluation mode ``none`` (no
    Environment evaluates). ``open`` logs ``open`` (detail ``policy`` and
    ``name``) before acting, then ``opened`` with the new session id, so a
    failed or hung open is visible too. ``sweep(tag)`` releases every live
    session whose name starts with ``tag`` and logs ``sweep``.
    """

    id: ClassVar[str] = "fake-env"
    Config: ClassVar[type | None] = FakeEnvironmentConfig
    options: FakeEnvironmentConfig

    def build_config(self, plan: ExecutionPlan) -> dict[str, Any]:
        call_log(self.options.log).record(
            "environment", "build_config", plan.task_id, None, {"attempt": plan.attempt}
        )
        phases = {"baseline": plan.baseline_network_policy, "run": plan.run_network_policy}
        if plan.evaluation_environment_mode != "none":
            phases["evaluation"] = plan.evaluation_network_policy
        for phase, policy in phases.items():
            if policy.mode not in self.options.policies:
                raise ComponentError(
                    f"environment {self.id!r} cannot enforce network policy {policy.mode!r} "
                    f"in the {phase} phase (it supports: {', '.join(self.options.policies)})"
                )
        if not self.options.switchable and len(set(phases.values())) > 1:
            needed = ", ".join(f"{phase}={policy.mode}" for phase, policy in phases.items())
            raise ComponentError(
                f"environment {self.id!r} cannot switch network policy live; the plan needs {needed}"
            )
        return {"task_id": plan.task_id, "attempt": plan.attempt}

    async def open(self, config: Any, policy: NetworkPolicy, name: str | None = None) -> FakeSession:
        task_id = config.get("task_id") if isinstance(config, Mapping) else None
        log_name = self.options.log
        await step(
            log_name,
            self.options.script,
            "environment",
            "open",
            task_id,
            None,
            {"policy": policy.mode} if name is None else {"policy": policy.mode, "name": name},
        )
        if policy.mode not in self.options.policies:
            raise IssueError(
                "fatal", "environment_failed", f"fake-env cannot enforce network policy {policy.mode!r}"
            )
        sid = call_log(log_name).new_session(task_id, name)
        detail = {"policy": policy.mode} if name is None else {"policy": policy.mode, "name": name}
        call_log(log_name).record("environment", "opened", task_id, sid, detail)
        return FakeSession(
            log_name,
            sid,
            task_id,
            policy,
            self.options.script,
            frozenset(self.options.policies),
            self.options.switchable,
        )

    async def reap(self, handle: dict[str, Any]) -> None:
        log_name = handle.get("log", self.options.log)
        sid = handle.get("session")
        log = call_log(log_name)
        task_id = log.session_task(sid) if isinstance(sid, int) else None
        await step(log_name, self.options.script, "environment", "reap", task_id, sid)
        if isinstance(sid, int):
            log.release(sid)

    async def sweep(self, tag: str) -> None:
        """Log ``sweep`` (detail ``tag`` and the ``swept`` session ids), then
        release every live session of this log whose name starts with ``tag``."""
        log = call_log(self.options.log)
        swept = log.sessions_named(tag)
        log.record("environment", "sweep", None, None, {"tag": tag, "swept": sorted(swept)})
        await trio.lowlevel.checkpoint()
        for sid in swept:
            log.sweep(sid)
