"""One definition of a valid value and of a success (SPEC 6), and every
reader of attempt values agreeing with it: the ``pass`` strategy's stop, the
metrics, and the viewer's task value, over anything JSON-like a benchmark
may return."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass import Evaluation, register
from agentcompass._observations import is_success, reduce_values, valid_value
from agentcompass._orchestration._task import run_task
from agentcompass._store._metrics import compute_metrics
from agentcompass._view._data import RunData
from agentcompass.runtime._convert import unstructure
from agentcompass.testing import FakeBenchmark
from tests.orchestration._support import make_context, make_request

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**400, -(10**400), 1, 0, -1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([math.inf, -math.inf, math.nan, 1.0, 0.999, 1e308])
    | st.text(max_size=3)
)
JSON_LIKE = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=5
)


@register
class ObservingBenchmark(FakeBenchmark):
    """``fake-bench`` whose n-th evaluation returns ``observed[n]`` as its
    ``score``, whatever that is (the last one repeats)."""

    id: ClassVar[str] = "observing-bench"

    def __init__(self, config: dict[str, Any] | None = None):
        config = dict(config or {})
        self.observed = config.pop("observed")
        super().__init__(config)
        self.evaluations = 0

    async def evaluate(self, prepared: Any, run_result: Any, env: Any, request: Any) -> Evaluation:
        evaluation = await super().evaluate(prepared, run_result, env, request)
        value = self.observed[min(self.evaluations, len(self.observed) - 1)]
        self.evaluations += 1
        return Evaluation({"score": value}, evaluation.issues)


def _run(observed: list[Any], strategy: str) -> Any:
    request = make_request(k=len(observed), strategy=strategy, tasks=1)
    benchmark = attrs.evolve(request.benchmark, id="observing-bench", config={**request.benchmark.config, "observed": observed})
    request = attrs.evolve(request, benchmark=benchmark)

    async def main() -> Any:
        ctx, _, _ = make_context(request)
        (task,) = await ctx.benchmark.load_tasks(request)
        return await run_task(ctx, task, list(range(len(observed))))

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _viewer_value(record: Any, strategy: str) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "r" / "20260101T000000.000Z-aaaa"
        (run_dir / "details" / record.severity).mkdir(parents=True)
        info = {"request": {"name": "r", "execution": {"attempts": {"k": len(record.attempts), "strategy": strategy}}},
                "status": "succeeded"}
        (run_dir / "run_info.json").write_text(json.dumps(info))
        (run_dir / "details" / record.severity / f"{record.task_id}.json").write_text(json.dumps(unstructure(record)))
        (row,) = RunData(run_dir).run()["tasks"]
        return row[5]


@settings(max_examples=150, deadline=None)
@given(observed=st.lists(JSON_LIKE, min_size=1, max_size=3), strategy=st.sampled_from(["avg", "pass"]))
def test_every_reader_of_attempt_values_agrees(observed: list[Any], strategy: str) -> None:
    record = _run(observed, strategy)

    # The attempt strategy: ``pass`` stops right after the first success, never raises.
    successes = [i for i, value in enumerate(observed) if is_success(value)]
    ran = successes[0] + 1 if strategy == "pass" and successes else len(observed)
    assert len(record.attempts) == ran
    assert all(a.values["score"] is observed[a.attempt] for a in record.attempts)
    kept = observed[:ran]

    # The metrics: the task reduces to its valid values, a pass to 1 iff it stopped on a success.
    expected = reduce_values(kept, strategy)
    series = compute_metrics(("score",), [record], strategy)["series"]["score"]
    assert series["reference_value"] == expected
    assert series["evaluated"] == (0 if expected is None else 1)
    if strategy == "pass" and expected is not None:
        assert (expected == 1.0) == bool(successes)
    if expected is not None:
        assert math.isfinite(expected)

    # The viewer shows the same task value.
    assert _viewer_value(record, strategy) == expected


def test_valid_values_are_finite_numbers_and_booleans() -> None:
    assert [valid_value(v) for v in (True, False, 0, 3, 0.5, -2.0)] == [1.0, 0.0, 0.0, 3.0, 0.5, -2.0]
    for invalid in (None, math.nan, math.inf, -math.inf, 10**400, "1", [1], {"score": 1}, b"1"):
        assert valid_value(invalid) is None, invalid
        assert not is_success(invalid), invalid


def test_a_success_is_true_or_a_number_at_least_one() -> None:
    assert [is_success(v) for v in (True, 1, 1.0, 2, 1e308)] == [True] * 5
    assert [is_success(v) for v in (False, 0, 0.999, -5)] == [False] * 4


def test_means_of_huge_values_stay_finite() -> None:
    assert reduce_values([1e308, 1e308, "x"], "avg") == 1e308
    assert reduce_values([math.inf, 0.5], "pass") == 0.0
