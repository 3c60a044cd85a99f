"""Metrics: counts add up, fatal voids the official score, means are right."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass._store import compute_metrics, reduce_task
from agentcompass._store._metrics import standard_error
from agentcompass.runtime import AttemptRecord, RunResult, TaskRecord

SERIES = ("acc", "f1")


def make_task(task_id: str, severity: str, category: str | None, *values: dict) -> TaskRecord:
    attempts = [
        AttemptRecord(attempt=i, status="completed", values=v) for i, v in enumerate(values)
    ]
    return TaskRecord(task_id, category, attempts, severity)  # type: ignore[arg-type]


def test_reduce_task() -> None:
    t = make_task("t", "normal", None, {"acc": True}, {"acc": 0.5}, {"acc": None}, {})
    assert reduce_task(t, "acc", "avg") == pytest.approx(0.75)
    assert reduce_task(t, "acc", "pass") == 1.0
    assert reduce_task(t, "f1", "avg") is None
    assert reduce_task(t, "f1", "pass") is None
    fails = make_task("t", "normal", None, {"acc": 0.99}, {"acc": False}, {"acc": math.nan})
    assert reduce_task(fails, "acc", "pass") == 0.0
    assert reduce_task(fails, "acc", "avg") == pytest.approx(0.495)
    assert reduce_task(make_task("t", "normal", None, {"acc": 3}), "acc", "pass") == 1.0
    with pytest.raises(ValueError, match="strategy"):
        reduce_task(t, "acc", "best")  # type: ignore[arg-type]


def test_example_with_a_fatal_task() -> None:
    records = [
        make_task("a", "normal", "x", {"acc": 1.0}),
        make_task("b", "error", "x", {"acc": 0.0}),
        make_task("c", "error", "y", {"acc": None}),
        make_task("d", "fatal", None, {"acc": 1.0}),
    ]
    metrics = compute_metrics(("acc",), records, "avg")
    assert metrics["evaluation_failed"] is True
    assert metrics["series"]["acc"] == {
        "value": None,
        "reference_value": 0.5,
        "stderr": 0.5,
        "evaluated": 2,
        "unavailable": 1,
        "invalidated": 1,
        "error": 2,
        "total": 4,
    }
    assert metrics["categories"]["y"]["series"]["acc"]["reference_value"] is None
    assert set(metrics["categories"]) == {"x", "y"}


def test_usage_sums_numbers_of_every_attempt() -> None:
    def attempt(i: int, usage: dict) -> AttemptRecord:
        return AttemptRecord(attempt=i, status="completed", run_result=RunResult(usage=usage))

    records = [
        TaskRecord("a", None, [attempt(0, {"input_tokens": 10, "model": "m"}), attempt(1, {})], "normal"),
        TaskRecord(
            "b", None, [attempt(0, {"input_tokens": 5, "details": {"cached": 2}, "ok": True})], "fatal"
        ),
    ]
    usage = compute_metrics(("acc",), records, "avg")["usage"]
    assert usage == {"input_tokens": 15, "details": {"cached": 2}}


def test_series_default_to_every_value_seen() -> None:
    records = [make_task("a", "normal", None, {"b": 1, "a": 0})]
    assert list(compute_metrics((), records, "avg")["series"]) == ["a", "b"]


value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(-10, 10),
    st.sampled_from([math.nan, math.inf, -math.inf, "n/a"]),
)
attempt_values = st.dictionaries(st.sampled_from(SERIES), value, max_size=2)
task_strategy = st.tuples(
    st.sampled_from(["fatal", "error", "normal"]),
    st.sampled_from([None, "easy", "hard"]),
    st.lists(attempt_values, max_size=3),
)


def hand_reduce(record: TaskRecord, series: str, strategy: str) -> float | None:
    valid = []
    for attempt in record.attempts:
        v = attempt.values.get(series)
        if isinstance(v, bool):
            valid.append(1.0 if v else 0.0)
        elif isinstance(v, (int, float)) and math.isfinite(v):
            valid.append(float(v))
    if not valid:
        return None
    if strategy == "avg":
        return sum(valid) / len(valid)
    return 1.0 if any(v >= 1 for v in valid) else 0.0


@settings(max_examples=300)
@given(st.lists(task_strategy, max_size=12), st.sampled_from(["avg", "pass"]))
def test_metrics_identities(tasks: list, strategy: str) -> None:
    records = [
        make_task(f"t{i}", severity, category, *values)
        for i, (severity, category, values) in enumerate(tasks)
    ]
    metrics = compute_metrics(SERIES, records, strategy)
    any_fatal = any(r.severity == "fatal" for r in records)
    assert metrics["evaluation_failed"] is any_fatal
    scopes = [(metrics["series"], records)] + [
        (block["series"], [r for r in records if r.category == category])
        for category, block in metrics["categories"].items()
    ]
    assert set(metrics["categories"]) == {r.category for r in records} - {None}
    for block, scope in scopes:
        assert list(block) == list(SERIES)
        for name, s in block.items():
            assert s["evaluated"] + s["unavailable"] + s["invalidated"] == s["total"] == len(scope)
            assert s["invalidated"] == sum(r.severity == "fatal" for r in scope)
            assert s["error"] == sum(r.severity == "error" for r in scope)
            reduced = [hand_reduce(r, name, strategy) for r in scope if r.severity != "fatal"]
            evaluated = [v for v in reduced if v is not None]
            assert s["evaluated"] == len(evaluated)
            expected = sum(evaluated) / len(evaluated) if evaluated else None
            if expected is None:
                assert s["reference_value"] is None
            else:
                assert s["reference_value"] == pytest.approx(expected)
            if len(evaluated) < 2:
                assert s["stderr"] is None
            else:
                sd = statistics.stdev(evaluated)  # the sample standard deviation (n - 1)
                assert s["stderr"] == pytest.approx(sd / math.sqrt(len(evaluated)), abs=1e-12)
            if any_fatal:
                assert s["value"] is None
            else:
                assert s["value"] == s["reference_value"]


def test_standard_error_edges() -> None:
    assert standard_error([], None) is None
    assert standard_error([0.7], 0.7) is None  # one task: no spread to measure
    assert standard_error([1.0, 1.0, 1.0], 1.0) == 0.0
    assert standard_error([1.0, 0.0], 0.5) == pytest.approx(0.5)
    # Finite values whose squared deviations overflow still give a finite error;
    # one beyond the float range is no error at all (metrics.json stays JSON).
    assert standard_error([1e200, -1e200], 0.0) == pytest.approx(1e200)
    assert standard_error([1.7e308, -1.7e308], 0.0) == pytest.approx(1.7e308)
    huge = [1.7e308, -1.7e308, -1.7e308]
    assert standard_error(huge, sum(v / 3 for v in huge)) is None
