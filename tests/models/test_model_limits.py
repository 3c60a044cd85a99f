"""Budgets and cost with the runtime's own client (``react``, ``qa``): a
``tokens`` or ``cost_usd`` limit stops an episode mid-way without a call past
it reaching the scripted server, the attempt is ERROR ``harness_limit_reached``
and still scored; ``cost_usd`` is summed per call, attempt and request from
``ModelSpec.pricing`` and is null without it; every command the agent runs
gets ``AGENTCOMPASS_DEADLINE``."""

from __future__ import annotations

import json
import sys
import time

import attrs
import pytest
from _common import serving
from _model_support import QA, details, launch, model, react_request

from agentcompass import ComponentRef, ExecutionSpec, Limits, Pricing, RunRequest
from agentcompass.testing.model_server import episode, text, tool_call

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash tasks")

#: 1 USD per million prompt tokens, 2 per million completion tokens: a call of 10 + 5 tokens costs 2e-05.
PRICING = Pricing(input=1.0, output=2.0)
CALL_COST = 10 * 1e-6 + 5 * 2e-6

#: Writes the answer at once, then keeps looking around: only a budget ends it.
ENDLESS = [
    tool_call("bash", {"command": "echo 'Hello, world!' > hello.txt"}),
    tool_call("bash", {"command": "ls"}),
]


def _endless(request):
    return ENDLESS[min(sum(m.get("role") == "assistant" for m in request.json["messages"]), 1)]


def _priced(request: RunRequest, pricing: Pricing | None = PRICING) -> RunRequest:
    assert request.model is not None
    return attrs.evolve(request, model=attrs.evolve(request.model, pricing=pricing))


@pytest.mark.parametrize(
    ("limits", "named"),
    [(Limits(tokens=40), "limits.tokens=40 (45 used)"), (Limits(cost_usd=5e-05), "limits.cost_usd=5e-05 (6e-05 used)")],
)
async def test_a_token_or_cost_limit_stops_react_mid_episode_and_the_output_is_scored(tmp_path, limits, named):
    async with serving(_endless) as server:
        request = _priced(react_request(server, tmp_path, ["hello-file"], execution=ExecutionSpec(limits=limits)))
        _, run_dir = await launch(request)
        # 15 tokens (2e-05 USD) a call: the third crosses the budget, the fourth is never sent.
        assert len(server.requests) == 3
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("error", "harness_limit_reached")]
    assert named in attempt["issues"][0]["message"]
    assert attempt["status"] == "run_error"
    assert attempt["values"] == {"reward": 1.0, "passed": True}  # what the agent left is scored
    usage = attempt["run_result"]["usage"]
    assert usage["calls"] == 3 and usage["cost_usd"] == pytest.approx(3 * CALL_COST)


async def test_model_calls_limit_is_enforced_by_the_client_with_no_call_past_it(tmp_path):
    async with serving(_endless) as server:
        request = react_request(server, tmp_path, ["hello-file"], execution=ExecutionSpec(limits=Limits(model_calls=2)))
        _, run_dir = await launch(request)
        assert len(server.requests) == 2
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert [i["code"] for i in attempt["issues"]] == ["harness_limit_reached"]
    assert "limits.model_calls=2" in attempt["issues"][0]["message"]


async def test_cost_is_summed_per_call_attempt_and_request_from_the_pricing(tmp_path):
    steps = [tool_call("bash", {"command": "true"}), text("done", prompt_tokens=1000, completion_tokens=500)]
    pricing = Pricing(input=3.0, output=15.0, cached_input=0.3)
    async with serving(episode(steps)) as server:
        request = _priced(react_request(server, tmp_path, ["hello-file", "word-count", "csv-total"]), pricing)
        _, run_dir = await launch(request, task_concurrency=3)
    per_attempt = (10 * 3.0 + 5 * 15.0 + 1000 * 3.0 + 500 * 15.0) / 1e6
    for record in details(run_dir).values():
        run = record["attempts"][0]["run_result"]
        assert run["usage"]["cost_usd"] == pytest.approx(per_attempt)
        calls = [m["usage"]["cost_usd"] for m in run["trajectory"] if m["role"] == "assistant"]
        assert calls == [pytest.approx((10 * 3.0 + 5 * 15.0) / 1e6), pytest.approx((1000 * 3.0 + 500 * 15.0) / 1e6)]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["usage"]["cost_usd"] == pytest.approx(3 * per_attempt)
    summary = (run_dir / "summary.md").read_text()
    assert f"| cost_usd | ${3 * per_attempt:.6f} |" in summary


async def test_without_pricing_cost_is_null_never_zero(tmp_path):
    async with serving(episode([text("done")])) as server:
        _, run_dir = await launch(react_request(server, tmp_path, ["hello-file"]))
    run = details(run_dir)["hello-file"]["attempts"][0]["run_result"]
    assert run["usage"]["cost_usd"] is None and "cost_usd" not in run["trajectory"][-1]["usage"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["usage"]["calls"] == 1 and metrics["usage"]["cost_usd"] is None
    assert "| cost_usd | unknown (no pricing) |" in (run_dir / "summary.md").read_text()


async def test_qa_is_priced_and_a_zero_call_budget_refuses_its_only_call(tmp_path):
    async with serving(episode([text("Paris", prompt_tokens=100, completion_tokens=2)])) as server:
        request = RunRequest(
            name="qa",
            benchmark=ComponentRef("qa", {"path": str(QA)}),
            environment=ComponentRef("local", {"root": str(tmp_path / "sandboxes")}),
            model=model(server, pricing=Pricing(input=1.0, output=1.0)),
            task_ids=["capital-france"],
            output_root=tmp_path / "runs",
        )
        _, run_dir = await launch(request)
        _, limited_dir = await launch(attrs.evolve(request, execution=ExecutionSpec(limits=Limits(model_calls=0))))
        assert len(server.requests) == 1
    run = details(run_dir)["capital-france"]["attempts"][0]["run_result"]
    assert run["usage"]["cost_usd"] == pytest.approx(102 / 1e6)
    limited = details(limited_dir)["capital-france"]["attempts"][0]
    assert [(i["severity"], i["code"]) for i in limited["issues"]] == [("error", "harness_limit_reached")]
    assert limited["values"] == {"correct": False}


async def test_every_command_gets_the_deadline_of_the_run(tmp_path):
    steps = [tool_call("bash", {"command": 'echo "deadline=$AGENTCOMPASS_DEADLINE"'}), text("done")]
    async with serving(episode(steps)) as server:
        before = time.time()
        request = react_request(server, tmp_path, ["hello-file"], execution=ExecutionSpec(run_timeout_seconds=600))
        _, run_dir = await launch(request)
        after = time.time()
    trajectory = details(run_dir)["hello-file"]["attempts"][0]["run_result"]["trajectory"]
    (tool,) = [m for m in trajectory if m["role"] == "tool"]
    deadline = int(tool["content"].strip().removeprefix("deadline="))
    assert before + 600 - 1 <= deadline <= after + 600 + 1


async def test_the_headline_counts_limited_attempts_and_the_score_resting_on_them(tmp_path):
    async with serving(_endless) as server:
        request = react_request(
            server, tmp_path, ["hello-file", "word-count"], execution=ExecutionSpec(limits=Limits(model_calls=2))
        )
        _, run_dir = await launch(request)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    # hello-file is solved by the first call, word-count is not: all the score rests on a limited attempt.
    assert metrics["headline"] == {
        "series": "reward", "attempts": 2, "invalidated": 0, "errored": 2, "limited": 2, "score_share_errored": 1.0,
    }  # fmt: skip
    summary = (run_dir / "summary.md").read_text()
    assert "2 stopped at a limit; 100% of the reward score rests on tasks with an errored attempt" in summary


async def test_compass_show_puts_cost_and_the_headline_beside_the_score(tmp_path):
    from agentcompass._report._show import render_overview, run_overview

    async with serving(_endless) as server:
        request = _priced(
            react_request(server, tmp_path, ["hello-file"], execution=ExecutionSpec(limits=Limits(model_calls=2)))
        )
        _, run_dir = await launch(request)
    shown = render_overview(*run_overview(run_dir))
    assert "Beside the score: of 1 attempts, 0 invalidated (FATAL, not counted), 1 errored" in shown
    assert "1 stopped at a limit; 100% of the reward score rests on tasks with an errored attempt" in shown
    assert f"Cost:   ${2 * CALL_COST:.6f}" in shown
