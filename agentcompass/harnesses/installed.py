"""The ``installed`` harness: a third-party CLI agent, run headless in the session.

Per attempt:

1. ``start_session``: the agent's cache entry (``_agent_cache``: built once
   per host and version, then reused) is exposed read-only in the session
   (``EnvironmentSession.expose_directory``) and checked to run there (a
   Python agent's interpreter must be Python >= 3.10; an npm agent's native
   executable must run on the session's libc: otherwise FATAL
   ``environment_unsupported``). ``timings`` get ``agent_install`` (seconds
   spent building the entry in this attempt: 0 when it was cached) and
   ``agent_prepare`` (this whole step).
2. ``run_task``: a model gateway for the attempt is opened
   (:func:`agentcompass.gateway.open_gateway`: the run's ``limits`` hold
   there, ``max_model_calls`` being an alias of ``limits.model_calls``), the
   entry's files are written into a fresh agent home, and one ``exec``
   runs the entry's command under the run budget, in the task's working
   directory, with ``AGENTCOMPASS_DEADLINE`` (Unix seconds at which the run
   budget ends) and the model-call budget given to the agent's own step or
   turn limit where it has one (mini-swe-agent ``agent.step_limit``, Claude
   Code ``--max-turns``); its output is kept in ``/logs/agent/agent.log``.
   Once the gateway has recorded a FATAL model failure the agent gets
   :data:`FATAL_GRACE_SECONDS` (its one retry, its logs) and is then stopped:
   some agents' own retries cannot be turned off.
3. The outcome, in order: the run budget expired: ERROR ``harness_timeout``;
   the gateway recorded a classified model failure: that issue (an
   upstream 5xx is FATAL ``model_server_error`` whatever the agent's exit
   status: aider exits 0 after failed calls); past a budget:
   ERROR ``harness_limit_reached`` naming it; the agent exited non-zero before any
   model call: FATAL ``harness_crashed`` (it never ran); non-zero after
   calls, or its log says it stopped short: ERROR ``agent_failed`` (or the
   entry's code) with its reason; else success.

``RunResult.trajectory`` is the entry's own steps where its log format
gives them, else the gateway's record of every call (the request's new
messages, then the reply with its tool calls, usage, status and timing);
``usage`` is the gateway's (``prompt_tokens``, ``completion_tokens``,
``calls``); ``artifacts.agent`` names the agent, its version and whether the
cache was hit.

Config: ``agent`` (an id of the agent table), ``version`` (the entry's
pinned default), ``args`` (extra CLI arguments), ``max_model_calls``.
"""

from __future__ import annotations

import base64
import os
import shlex
import time
from pathlib import Path
from typing import Any, ClassVar

import attrs
import trio

from agentcompass import (
    BaseHarness,
    ConfigError,
    EnvironmentSession,
    ExecResult,
    ExecutionPlan,
    Issue,
    IssueError,
    ModelSpec,
    PreparedTask,
    RunBudget,
    RunResult,
    register,
)
from agentcompass.gateway import open_gateway

from . import _agents, _agents_more  # noqa: F401  (register the built-in agents)
from ._agent_cache import ensure_installed, path_component
from ._agent_table import AgentRun, InstalledAgent, agent_table

__all__ = ["InstalledHarness"]

_LOG_BYTES = 16 * 1024 * 1024
_OUTPUT_TAIL = 2000
#: The exit status of the gateway's wrapper when its forwarder could not start.
_NO_FORWARDER = 97
#: How long an agent may go on after the gateway recorded a FATAL model failure
#: (time for its one retry and its logs), before it is stopped.
FATAL_GRACE_SECONDS = 10.0


@attrs.define(eq=False)
class InstalledSession:
    """What ``start_session`` hands to ``run_task``."""

    env: EnvironmentSession
    model: ModelSpec
    agent: InstalledAgent
    version: str
    root: str
    timings: dict[str, float]
    cache_hit: bool


@register
class InstalledHarness(BaseHarness):
    """A third-party CLI agent from the agent table, reaching the model only
    through the attempt's gateway (see the module docstring)."""

    id: ClassVar[str] = "installed"

    @attrs.frozen
    class Config:
        agent: str = attrs.field(metadata={"doc": "an id of the agent table (mini-swe-agent, aider, ...)"})
        version: str | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(path_component),
            metadata={"doc": "the agent's version (its pinned default); it names the agent's cache entry"},
        )
        args: list[str] = attrs.field(factory=list, metadata={"doc": "extra command-line arguments for the agent"})
        max_model_calls: int | None = attrs.field(
            default=None,
            metadata={"doc": "model calls per attempt, an alias of execution.limits.model_calls (the lower wins)"},
        )

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        table = agent_table()
        if self.options.agent not in table:
            known = ", ".join(sorted(table))
            raise ConfigError(f"harness 'installed': unknown agent {self.options.agent!r} (known: {known})")
        self.agent = table[self.options.agent]()

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> InstalledSession:
        agent = self.agent
        if model is None or model.api != agent.api:
            raise IssueError("fatal", "setup_failed", f"agent {agent.id!r} needs a request model with api {agent.api!r}")
        start = time.monotonic()
        version = self.options.version or agent.version
        binaries = agent.binaries()
        entry = await ensure_installed(
            f"{agent.id}-{version}", agent.requirements(version), installer=agent.installer, binaries=binaries
        )
        try:
            inside = await env.expose_directory(str(entry.path))
        except NotImplementedError:
            raise IssueError(
                "fatal", "environment_unsupported", f"{type(env).__name__} cannot make the agent's installation available"
            ) from None
        root = inside.rstrip("/")
        await _check_runs(env, agent, root, binaries, entry.path)
        timings = {"agent_install": round(entry.install_seconds, 3), "agent_prepare": round(time.monotonic() - start, 3)}
        return InstalledSession(env, model, agent, version, root, timings, not entry.built)

    async def run_task(self, session: InstalledSession, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        agent, env = session.agent, session.env
        run = AgentRun(
            venv=session.root + "/venv",
            python=session.root + "/venv/bin/python",
            root=session.root,
            instruction=_instruction(prepared),
            model=session.model.name,
            args=tuple(self.options.args),
            max_turns=budget.limits.tightened(self.options.max_model_calls).model_calls,
        )
        issues: list[Issue] = []
        start = time.monotonic()
        async with open_gateway(env, session.model, max_model_calls=self.options.max_model_calls) as gateway:
            script = gateway.command(_prologue(agent.files(run)) + agent.command(run))
            record = gateway.record
            result = ExecResult(exit_code=-1, stderr=f"stopped {FATAL_GRACE_SECONDS:g}s after a fatal model failure")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_after_failure, record.failed, nursery.cancel_scope)
                result = await env.exec(script, timeout=budget.timeout_seconds, env=budget.environment() or None)
                nursery.cancel_scope.cancel()
        took = time.monotonic() - start
        logs = await _read_logs(env, agent.log_files)
        await _save_output(env, result.stdout, result.stderr)
        outcome = agent.outcome(logs, result.exit_code)
        if result.timed_out:
            issues.append(
                Issue("error", "run", "harness_timeout", f"agent {agent.id!r} did not finish within {budget.timeout_seconds:g}s")
            )
        issues += record.issues
        failed_model = any(i.severity == "fatal" for i in record.issues)
        if not result.timed_out and not failed_model:
            if result.exit_code == _NO_FORWARDER:
                issues.append(
                    Issue("fatal", "run", "environment_unsupported", "the gateway's forwarder needs python3 in the session")
                )
            elif any(i.severity != "warning" for i in record.issues):
                pass  # the agent stopped over a model failure: the gateway's record says which
            elif result.exit_code != 0 and record.calls == 0:
                issues.append(
                    Issue(
                        "fatal",
                        "run",
                        "harness_crashed",
                        f"agent {agent.id!r} exited {result.exit_code} before any model call: {_tail(result.stderr)}",
                    )
                )
            elif outcome.failure is not None:
                issues.append(outcome.failure)
            elif result.exit_code != 0:
                issues.append(
                    Issue("error", "run", "agent_failed", f"agent {agent.id!r} exited {result.exit_code}: {_tail(result.stderr)}")
                )
        return RunResult(
            output=outcome.output,
            trajectory=_with_calls(outcome.trajectory, record.trajectory) or record.trajectory,
            usage=record.usage.to_dict(),
            artifacts={
                "agent": {"id": agent.id, "version": session.version, "cache": "hit" if session.cache_hit else "built"},
                "agent_exit_code": result.exit_code,
            },
            issues=issues,
            timings={**session.timings, "agent_run": round(took, 3)},
        )


async def _check_runs(
    env: EnvironmentSession, agent: InstalledAgent, root: str, binaries: dict[str, list[str]], entry: Path
) -> None:
    """FATAL ``environment_unsupported`` unless the entry runs in the session: a
    Python agent's interpreter, or an npm agent's first native executable
    (which runs on the session's userland and libc, not the host's).

    A Python entry's packages are built for the host interpreter its venv
    links to, so the session needs that one: the same minor version at the
    same path (named in the message)."""
    if agent.installer == "npm":
        if not binaries:
            return
        program = f"{root}/bin/{next(iter(binaries))}"
        check = await env.exec([program, "--version"], timeout=60)
        needs = f"an executable of the host's platform to run in the session; {program} did not"
    else:
        program = f"{root}/venv/bin/python"
        made_with = await trio.to_thread.run_sync(_made_with, entry / "venv")
        need = f"sys.version_info[:2] >= {tuple(agent.python)!r}"
        if made_with is not None:
            need += f" and sys.version_info[:2] == {made_with[1:]!r}"
        check = await env.exec([program, "-c", f"import sys; sys.exit(0 if {need} else 3)"], timeout=60)
        same = f", the one its installation was made with (Python {made_with[1]}.{made_with[2]} at {made_with[0]})" if made_with else ""
        needs = f"Python >= {'.'.join(map(str, agent.python))} in the session{same}; {program} did not run it"
    if check.exit_code != 0:
        raise IssueError(
            "fatal",
            "environment_unsupported",
            f"agent {agent.id!r} needs {needs} (exit {check.exit_code}: {' '.join(check.stderr.split())[:200]})",
        )


def _made_with(venv: Path) -> tuple[str, int, int] | None:
    """(interpreter, major, minor) of the host Python a virtual environment
    links to (its ``bin/python3`` link and ``pyvenv.cfg``), or None when it does not say."""
    try:
        config = (venv / "pyvenv.cfg").read_text()
        link = os.readlink(venv / "bin" / "python3")
    except OSError:
        return None
    for line in config.splitlines():
        key, _, value = line.partition("=")
        numbers = value.strip().split(".")
        if key.strip() == "version" and len(numbers) >= 2 and numbers[0].isdigit() and numbers[1].isdigit():
            return link, int(numbers[0]), int(numbers[1])
    return None


def _with_calls(steps: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's own steps, each of its assistant messages given the
    gateway's ``call``, ``status``, ``usage`` and ``duration_seconds`` of the
    reply it came from, where the two line up (as many replies as assistant
    messages); else the steps as they are."""
    replies = [c for c in calls if c.get("role") == "assistant" and "usage" in c]
    mine = [i for i, s in enumerate(steps) if s.get("role") == "assistant"]
    if not mine or len(mine) != len(replies):
        return steps
    steps = list(steps)
    for index, reply in zip(mine, replies, strict=True):
        steps[index] = steps[index] | {k: reply[k] for k in ("call", "status", "usage", "duration_seconds") if k in reply}
    return steps


async def _stop_after_failure(failed: trio.Event, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` (the agent's exec) :data:`FATAL_GRACE_SECONDS` after the
    gateway recorded a FATAL model failure: the attempt's outcome is decided,
    and an agent whose own retries cannot be turned off would spend minutes on
    them before the runtime's retry starts afresh."""
    await failed.wait()
    await trio.sleep(FATAL_GRACE_SECONDS)
    scope.cancel()


def _instruction(prepared: PreparedTask) -> str:
    for key in ("instruction", "question", "prompt"):
        value = prepared.input.get(key)
        if isinstance(value, str):
            return value
    return str(prepared.input)


def _prologue(files: dict[str, str]) -> str:
    """Shell text making the agent's home and log directories and writing its files."""
    lines = [
        'AGENT_HOME="$HOME/.agentcompass-agent"; AGENT_LOGS="${LOGS_DIR:-/logs}/agent"',
        'rm -rf "$AGENT_HOME"; mkdir -p "$AGENT_HOME" "$AGENT_LOGS" || exit 96',
        "export AGENT_HOME AGENT_LOGS",
    ]
    for name, text in files.items():
        data = base64.b64encode(text.encode()).decode()
        lines.append(f'printf %s {data} | base64 -d > "$AGENT_HOME"/{shlex.quote(name)} || exit 96')
    return "\n".join(lines) + "\n"


async def _read_logs(env: EnvironmentSession, names: tuple[str, ...]) -> dict[str, bytes]:
    logs: dict[str, bytes] = {}
    for name in names:
        try:
            logs[name] = await env.read_file(f"/logs/agent/{name}", max_bytes=_LOG_BYTES)
        except Exception as exc:
            if not _made_by_session(exc):
                raise
            # Missing, too long, a link: the agent's doing, read as absent.
    return logs


def _made_by_session(exc: BaseException) -> bool:
    """Whether ``exc`` is a file error of what the session holds. The runtime
    passes :class:`FileRefusedError` through and tags a provider's other
    errors as Environment failures with the provider's error as the cause."""
    return any(isinstance(c, OSError) for c in (exc, exc.__cause__))


async def _save_output(env: EnvironmentSession, stdout: str, stderr: str) -> None:
    text = stdout + ("\n[stderr]\n" + stderr if stderr else "")
    if text:
        try:
            await env.write_file("/logs/agent/agent.log", text)
        except Exception as exc:
            if not _made_by_session(exc):
                raise
            # The log directory is the agent's: a planted link is refused, the log lost.


def _tail(text: str) -> str:
    return " ".join(text.split())[-_OUTPUT_TAIL:] or "no output"
