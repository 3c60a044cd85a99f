"""Test-only components that fail with credentials in their messages.

Used by ``test_secret_scan.py`` in-process (imported) and through
``compass launch`` (listed under ``plugins:``). What each task does is
fixed by its id, so that one run exercises every path a credential can take
to a file:

- ``t000``: ``IssueError("fatal", ...)`` whose message holds the model's API
  key (retried, so a discarded try is saved too);
- ``t001``: an unclassified ``RuntimeError("Authorization: Bearer <token>")``;
- ``t002``: a returned ERROR issue whose message holds ``api_key=<value>``;
- ``t003``: an ``IssueError`` whose first line is clean and whose second
  line holds the key (only the traceback keeps line two);
- ``t004``: a clean run whose output and trajectory hold the API key.

``secret-leak-analyzer`` fails with the key (read from the environment
variable named by its ``env`` config key) in its message.

``import agentcompass.testing`` registers ``fake-bench`` for the configs.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import attrs
import trio

import agentcompass.testing  # noqa: F401 - registers fake-bench
from agentcompass import register
from agentcompass.runtime._components import BaseAnalyzer, BaseHarness, EnvironmentSession
from agentcompass.runtime._errors import IssueError
from agentcompass.runtime._results import Issue, RunBudget, RunResult
from agentcompass.runtime._values import ExecutionPlan, ModelSpec, PreparedTask, TaskSpec

# Credentials the runtime was never given, so masked by their shapes alone
# (a JSON Web Token, a GitHub token), never for the word before them.
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl"
API_KEY_VALUE = "ghp_" + "XYZ123456" * 4


@attrs.frozen
class _Session:
    task_id: str
    key: str


@register
class SecretLeakHarness(BaseHarness):
    id: ClassVar[str] = "secret-leak-harness"

    async def start_session(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, plan: ExecutionPlan
    ) -> _Session:
        await trio.lowlevel.checkpoint()
        assert model is not None and model.api_key is not None
        return _Session(prepared.task.task_id, model.api_key.reveal())

    async def run_task(self, session: _Session, prepared: PreparedTask, budget: RunBudget) -> RunResult:
        await trio.lowlevel.checkpoint()
        key = session.key
        task = session.task_id
        if task == "t000":
            raise IssueError("fatal", "x", f"failed with key {key}")
        if task == "t001":
            raise RuntimeError(f"Authorization: Bearer {BEARER}")
        if task == "t002":
            issue = Issue("error", "run", "leaky", f"request failed: api_key={API_KEY_VALUE} was rejected")
            return RunResult(output="partial", issues=[issue])
        if task == "t003":
            raise IssueError("error", "y", f"upstream failed\nwhile sending {key}")
        return RunResult(
            output=f"I found the key {key} in the environment",
            trajectory=[{"role": "tool", "content": f"OPENAI_API_KEY={key}"}],
        )

    async def close_session(self, session: _Session) -> None:
        await trio.lowlevel.checkpoint()


@attrs.frozen
class _AnalyzerConfig:
    env: str = "AC_TEST_SECRET"


@register
class SecretLeakAnalyzer(BaseAnalyzer):
    id: ClassVar[str] = "secret-leak-analyzer"
    Config: ClassVar[type | None] = _AnalyzerConfig
    options: _AnalyzerConfig

    async def analyze(self, task: TaskSpec, attempt_record: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        raise RuntimeError(f"analyzer saw {os.environ.get(self.options.env, '')}")
