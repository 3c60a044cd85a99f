"""The ``qa`` benchmark: questions answered by the request's model, no harness.

Config: ``path`` (a JSONL file, one object a line: ``id``, ``question``,
``answer``, optional ``category``), ``scoring`` (``exact`` or ``judge``;
default ``exact``) and ``judge`` (a ModelSpec mapping with ``name``,
``base_url``, ``api_key``, ...; required for ``judge``). Metric
``("correct",)``. Requests use ``harness: {id: none}``.

Run: one chat completion per question (a short system prompt asking for the
answer only) through the orchestration's shared client; a failed call is
the client's classified issue (``model_auth``, ``model_timeout``, ...).
The trajectory holds the three messages, ``usage`` the call's tokens.

Scoring, with no Environment (evaluation mode ``none``, so a retry repeats
only the scoring):

- ``exact``: the normalized answer equals the normalized reference
  (lower case, punctuation and the articles a/an/the dropped, whitespace
  collapsed, as SQuAD's evaluation does).
- ``judge``: the judge model gets the question, the reference and the answer
  and must reply with a JSON object ``{"correct": true|false, "reason": "..."}``
  (a fenced code block around it is accepted). A judge request that fails,
  or a verdict that is not such an object, is FATAL ``judge_failed``: the
  attempt is not scored and is retried while the retry budget lasts, since
  a broken judge says nothing about the model under test.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import trio

from agentcompass import (
    ComponentError,
    EnvironmentSession,
    Evaluation,
    HarnessFreeBenchmark,
    IssueError,
    ModelSpec,
    PreparedTask,
    RunBudget,
    RunRequest,
    RunResult,
    TaskSpec,
    register,
)
from agentcompass.models import ModelError, ModelUsage, chat_client

__all__ = ["QABenchmark", "normalize_answer"]

ANSWER_PROMPT = "Answer the question. Reply with the answer only, no explanation."

JUDGE_PROMPT = """\
You are grading an answer to a question against a reference answer.
Question: {question}
Reference answer: {reference}
Answer to grade: {answer}
Is the answer correct (it means the same as the reference)? Reply with only a JSON object:
{{"correct": true or false, "reason": "<one sentence>"}}"""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's normalization)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


@register
class QABenchmark(HarnessFreeBenchmark):
    """Questions answered by the request's model, scored by exact match or an LLM judge.

    See the module docstring for the file format, the run and the scoring.
    """

    id: ClassVar[str] = "qa"
    metrics: ClassVar[tuple[str, ...]] = ("correct",)

    @attrs.frozen
    class Config:
        path: Path = attrs.field(metadata={"doc": "JSONL file of id, question, answer, optional category"})
        scoring: Literal["exact", "judge"] = attrs.field(
            default="exact", metadata={"doc": "normalized exact match, or an LLM judge"}
        )
        judge: ModelSpec | None = attrs.field(default=None, metadata={"doc": "the judge model (required for judge)"})

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        if self.options.scoring == "judge" and self.options.judge is None:
            raise ComponentError("benchmark 'qa': scoring 'judge' needs a 'judge' model in its config")
        judge = self.options.judge
        if judge is not None and (judge.api != "openai-chat" or not judge.base_url):
            raise ComponentError("benchmark 'qa': the judge needs api 'openai-chat' and a base_url")

    def preflight(self, request: RunRequest) -> None:
        """The question file loads and has every id of ``task_ids``."""
        tasks = _load(Path(self.options.path))
        if request.task_ids:
            known = {t.task_id for t in tasks}
            missing = [t for t in request.task_ids if t not in known]
            if missing:
                raise ComponentError(f"task_ids: no question {missing[0]!r}")

    async def load_tasks(self, request: RunRequest) -> list[TaskSpec]:
        """Every question of the JSONL file; a malformed line is a :class:`ComponentError` naming it."""
        return await trio.to_thread.run_sync(_load, Path(self.options.path))

    def plan(self, task: TaskSpec, request: RunRequest) -> dict[str, Any]:
        return {"evaluation_environment_mode": "none"}

    async def prepare_task(
        self, task: TaskSpec, env: EnvironmentSession, request: RunRequest, benchmark_plan: dict[str, Any]
    ) -> PreparedTask:
        return PreparedTask(task=task, input={"question": task.data["question"]}, expected=task.data["answer"])

    async def run_task(
        self, prepared: PreparedTask, env: EnvironmentSession, model: ModelSpec | None, budget: RunBudget
    ) -> RunResult:
        if model is None:
            raise IssueError("fatal", "setup_failed", "benchmark 'qa' needs a request model")
        client = chat_client(model)
        messages = [
            {"role": "system", "content": ANSWER_PROMPT},
            {"role": "user", "content": prepared.input["question"]},
        ]
        trajectory: list[dict[str, Any]] = [dict(m) for m in messages]
        usage = ModelUsage()
        start = trio.current_time()
        try:
            with trio.fail_after(budget.timeout_seconds if budget.timeout_seconds is not None else float("inf")):
                reply = await client.chat(messages)
        except trio.TooSlowError:
            raise IssueError(
                "error", "model_timeout", f"no answer within the run budget of {budget.timeout_seconds:g}s"
            ) from None
        except ModelError as exc:
            return RunResult(trajectory=trajectory, usage=usage.to_dict(), issues=[exc.to_issue("run")])
        took = trio.current_time() - start
        usage.add(reply.usage)
        trajectory.append(
            {
                "role": "assistant",
                "content": reply.content,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls],
                "step": 1,
                "usage": reply.usage,
                "duration_seconds": round(took, 6),
            }
        )
        return RunResult(
            output=reply.content, trajectory=trajectory, usage=usage.to_dict(), timings={"model": round(took, 6)}
        )

    async def evaluate(
        self, prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession | None, request: RunRequest
    ) -> Evaluation:
        answer = run_result.output
        if not isinstance(answer, str):
            return Evaluation(values={"correct": False})
        reference = str(prepared.task.data["answer"])
        if self.options.scoring == "exact":
            return Evaluation(values={"correct": normalize_answer(answer) == normalize_answer(reference)})
        return Evaluation(values={"correct": await self._judge(prepared.input["question"], reference, answer)})

    async def _judge(self, question: str, reference: str, answer: str) -> bool:
        client = chat_client(self.options.judge)
        prompt = JUDGE_PROMPT.format(question=question, reference=reference, answer=answer)
        try:
            reply = await client.chat([{"role": "user", "content": prompt}])
        except ModelError as exc:
            raise IssueError("fatal", "judge_failed", f"judge request failed ({exc.code}): {exc.message}") from None
        return _verdict(reply.content or "")


def _verdict(text: str) -> bool:
    """The judge's ``correct`` flag; FATAL ``judge_failed`` if the reply is not a verdict."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        data = json.loads(text)
    except ValueError:
        raise IssueError("fatal", "judge_failed", f"judge verdict is not JSON: {text[:120]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("correct"), bool):
        raise IssueError("fatal", "judge_failed", f"judge verdict lacks a boolean 'correct': {text[:120]!r}")
    return bool(data["correct"])  # checked a bool just above; bool() types it for the caller


def _load(path: Path) -> list[TaskSpec]:
    where = f"path: {path}"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ComponentError(f"{where}: cannot read ({type(exc).__name__})") from None
    tasks = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise ComponentError(f"{where}:{number}: not a JSON object") from None
        if not isinstance(item, dict):
            raise ComponentError(f"{where}:{number}: not a JSON object")
        for key in ("id", "question", "answer"):
            if key not in item:
                raise ComponentError(f"{where}:{number}: missing key {key!r}")
        if not isinstance(item["question"], str):
            raise ComponentError(f"{where}:{number}: 'question' must be a string")
        category = item.get("category")
        if category is not None and not isinstance(category, str):
            raise ComponentError(f"{where}:{number}: 'category' must be a string")
        tasks.append(
            TaskSpec(
                task_id=str(item["id"]),
                data={"question": item["question"], "answer": item["answer"]},
                category=category,
            )
        )
    if not tasks:
        raise ComponentError(f"{where}: no questions")
    return tasks
