"""The ``qa`` harness-free benchmark: exact scoring and the LLM judge, whose
failures (HTTP 503, a malformed verdict) are FATAL ``judge_failed`` and retried."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from _common import serving
from _model_support import KEY, QA, details, launch, model, retries

from agentcompass import ComponentError, ComponentRef, ExecutionSpec, ModelSpec, RunRequest, Secret
from agentcompass.benchmarks.qa import QABenchmark, normalize_answer
from agentcompass.testing.model_server import by_instruction, episode, error, text

QUESTIONS = [
    {"id": "q1", "question": "Capital of France?", "answer": "Paris", "category": "geo"},
    {"id": "q2", "question": "Largest planet?", "answer": "Jupiter", "category": "science"},
]


def write_questions(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def qa_request(server, tmp_path: Path, path: Path, execution: ExecutionSpec | None = None, **config) -> RunRequest:
    return RunRequest(
        name="qa",
        benchmark=ComponentRef("qa", {"path": str(path), **config}),
        environment=ComponentRef("local", {"root": str(tmp_path / "sandboxes")}),
        model=model(server, params={"temperature": 0}),
        execution=execution or ExecutionSpec(),
        output_root=tmp_path / "runs",
    )


def answers(paris: str = "paris.", jupiter: str = "Saturn"):
    return by_instruction(
        [
            ("Capital of France?", episode([text(paris, prompt_tokens=7, completion_tokens=2)])),
            ("Largest planet?", episode([text(jupiter, prompt_tokens=5, completion_tokens=1)])),
        ]
    )


def test_normalization_is_squad_like():
    assert normalize_answer("  The Eiffel-Tower! ") == normalize_answer("eiffeltower") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"


async def test_exact_scoring_with_usage_and_categories(tmp_path):
    async with serving(answers()) as server:
        result, run_dir = await launch(qa_request(server, tmp_path, write_questions(tmp_path)))
    assert result.status == "succeeded"
    records = details(run_dir)
    assert records["q1"]["attempts"][0]["values"] == {"correct": True}
    assert records["q2"]["attempts"][0]["values"] == {"correct": False}
    trajectory = records["q1"]["attempts"][0]["run_result"]["trajectory"]
    assert [m["role"] for m in trajectory] == ["system", "user", "assistant"]
    assert trajectory[2]["content"] == "paris." and trajectory[2]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 2,
    }
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["series"]["correct"]["value"] == 0.5
    assert metrics["categories"]["geo"]["series"]["correct"]["value"] == 1.0
    assert metrics["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "calls": 2, "cost_usd": None}
    assert server.requests[0].json["temperature"] == 0


def judge_spec(server) -> dict:
    return {"name": "judge", "base_url": server.base_url, "api_key": Secret(KEY)}


def with_judge(verdicts: list) -> object:
    """Answers for the questions; the judge's replies served in order from ``verdicts``."""
    queue = list(verdicts)
    base = answers(jupiter="Jupiter")

    def reply(request):
        first = next(m["content"] for m in request.json["messages"] if m["role"] == "user")
        if first.startswith("You are grading"):
            return queue.pop(0)
        return base(request)

    return reply


async def test_judge_scoring(tmp_path):
    verdicts = [text('```json\n{"correct": true, "reason": "same"}\n```'), text('{"correct": false, "reason": "no"}')]
    async with serving(with_judge(verdicts)) as server:
        request = qa_request(server, tmp_path, write_questions(tmp_path), scoring="judge", judge=judge_spec(server))
        _, run_dir = await launch(request, task_concurrency=1)
    records = details(run_dir)
    assert sorted(r["attempts"][0]["values"]["correct"] for r in records.values()) == [False, True]
    judge_calls = [r for r in server.requests if r.json["model"] == "judge"]
    assert len(judge_calls) == 2 and "Reference answer: Paris" in judge_calls[0].json["messages"][0]["content"]


@pytest.mark.parametrize(
    "failure",
    [error(503), text("I think it is correct"), text('{"reason": "no verdict"}')],
    ids=["http-503", "not-json", "missing-field"],
)
async def test_judge_failure_is_fatal_and_retried_without_rerunning_the_model(tmp_path, failure):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n")
    execution = ExecutionSpec(max_retries=1, retry_min_delay_seconds=0.01, retry_max_delay_seconds=0.02)
    async with serving(with_judge([failure, text('{"correct": true}')])) as server:
        request = qa_request(server, tmp_path, path, execution, scoring="judge", judge=judge_spec(server))
        _, run_dir = await launch(request)
    record = details(run_dir)["q1"]
    assert record["_dir"] == "normal" and record["attempts"][0]["values"] == {"correct": True}
    (discarded,) = retries(run_dir)
    assert [(i["severity"], i["code"], i["phase"]) for i in discarded["issues"]] == [
        ("fatal", "judge_failed", "evaluate")
    ]
    assert discarded["scope"] == "evaluation"  # only the scoring ran again
    assert [r.json["model"] for r in server.requests] == ["scripted-model", "judge", "judge"]


async def test_judge_failure_without_retries_invalidates_the_score(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n")
    async with serving(with_judge([text("not json")])) as server:
        request = qa_request(server, tmp_path, path, scoring="judge", judge=judge_spec(server))
        result, run_dir = await launch(request)
    assert result.exit_code == 1
    record = details(run_dir)["q1"]
    assert record["_dir"] == "fatal" and record["attempts"][0]["issues"][0]["code"] == "judge_failed"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["evaluation_failed"] and metrics["series"]["correct"]["value"] is None


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ComponentError, match="needs a 'judge'"):
        QABenchmark({"path": "x.jsonl", "scoring": "judge"})
    with pytest.raises(ComponentError, match="scoring"):
        QABenchmark({"path": "x.jsonl", "scoring": "fuzzy"})
    judge = QABenchmark({"path": "x", "scoring": "judge", "judge": {"name": "j", "base_url": "http://h/v1"}})
    assert isinstance(judge.options.judge, ModelSpec)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no questions"),
        ("{not json}\n", ":1: not a JSON object"),
        ('{"id": "a", "question": "q"}\n', "missing key 'answer'"),
    ],
)
async def test_bad_question_files_are_component_errors(tmp_path, content, message):
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(ComponentError, match=message):
        await QABenchmark({"path": str(path)}).load_tasks(None)


async def test_the_bundled_question_set_loads():
    tasks = await QABenchmark({"path": str(QA)}).load_tasks(None)
    assert len(tasks) >= 10 and all(t.category for t in tasks)


def test_preflight_checks_the_file_and_the_task_ids(tmp_path):
    path = write_questions(tmp_path)
    request = RunRequest("qa", ComponentRef("qa", {"path": str(path)}), ComponentRef("local"), task_ids=["q1", "nope"])
    with pytest.raises(ComponentError, match="task_ids: no question 'nope'"):
        QABenchmark({"path": str(path)}).preflight(request)
    with pytest.raises(ComponentError, match="cannot read"):
        QABenchmark({"path": str(tmp_path / "missing.jsonl")}).preflight(attrs.evolve(request, task_ids=None))
