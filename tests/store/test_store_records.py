"""The store's fast record codec agrees with the converter, both ways."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agentcompass._convert import converter, unstructure
from agentcompass._store._records import attempt_from_data, attempt_to_data, task_from_data
from agentcompass.runtime._results import AttemptRecord, Issue, RunResult, TaskRecord
from agentcompass.runtime._values import ComponentRef, ExecutionPlan, NetworkPolicy, PreparedTask, Secret, TaskSpec

text = st.text(max_size=8)
scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False) | text
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6)
issues = st.builds(
    Issue,
    st.sampled_from(["fatal", "error", "warning"]),
    st.sampled_from(["setup", "run", "collect", "evaluate", "cleanup"]),
    text,
    text,
)
policies = st.builds(NetworkPolicy, st.sampled_from(["none", "allowlist", "full"]), st.tuples(text) | st.just(()))
refs = st.builds(ComponentRef, st.sampled_from(["a", "b"]), st.just({}) | st.dictionaries(text, json_values, max_size=2) | st.just({"api_key": Secret("sk-x")}))
plans = st.builds(
    ExecutionPlan,
    text,
    st.integers(0, 5),
    refs,
    refs,
    st.dictionaries(text, json_values, max_size=2),
    st.sampled_from(["reuse", "none", "fresh"]),
    policies,
    policies,
    policies,
    st.none() | st.floats(0, 100),
    st.none() | st.floats(0, 100),
)
run_results = st.builds(
    RunResult,
    json_values,
    st.lists(json_values, max_size=2),
    st.dictionaries(text, json_values, max_size=2),
    st.dictionaries(text, json_values, max_size=2),
    st.lists(issues, max_size=2),
    st.dictionaries(text, st.floats(0, 10), max_size=2),
)
prepared = st.builds(
    PreparedTask,
    st.builds(TaskSpec, text, st.dictionaries(text, json_values, max_size=2), st.none() | text, st.dictionaries(text, json_values, max_size=2)),
    st.dictionaries(text, json_values, max_size=2),
    st.dictionaries(text, json_values, max_size=2),
)
attempts = st.builds(
    AttemptRecord,
    st.integers(0, 5),
    st.sampled_from(["completed", "run_error", "eval_error", "run_error_or_eval_error"]),
    st.dictionaries(text, st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False), max_size=3),
    st.lists(issues, max_size=3),
    st.none() | run_results,
    st.none() | plans,
    st.dictionaries(text, json_values, max_size=2),
    st.integers(0, 3),
    st.dictionaries(text, st.floats(0, 10), max_size=2),
    st.none() | prepared,
)


def _text(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=unstructure)


@settings(max_examples=150, deadline=None)
@given(attempts)
def test_writing_matches_the_converter(record: AttemptRecord) -> None:
    assert _text(attempt_to_data(record)) == _text(unstructure(record))


@settings(max_examples=150, deadline=None)
@given(attempts, st.sampled_from(["fatal", "error", "normal"]), st.none() | text)
def test_reading_matches_the_converter(record: AttemptRecord, severity: str, category: str | None) -> None:
    data = json.loads(_text(unstructure(record)))
    assert attempt_from_data(data) == converter.structure(data, AttemptRecord)
    task = {"task_id": "t", "category": category, "attempts": [data, data], "severity": severity}
    assert task_from_data(json.loads(json.dumps(task))) == converter.structure(task, TaskRecord)


def test_reading_malformed_data_fails_like_the_converter() -> None:
    data = unstructure(AttemptRecord(0, "completed"))
    for bad in ({**data, "extra": 1}, {**data, "status": "great"}, {**data, "attempt": "0"}):
        try:
            converter.structure(bad, AttemptRecord)
        except Exception as expected:  # noqa: BLE001
            try:
                attempt_from_data(bad)
            except Exception as got:  # noqa: BLE001
                assert type(got) is type(expected) and str(got) == str(expected)
            else:
                raise AssertionError(f"accepted {bad}")
        else:
            raise AssertionError("the converter accepted malformed data")


field_values = json_values | st.floats() | st.builds(Issue, st.just("error"), st.just("run"), text, text)


@settings(max_examples=200, deadline=None)
@given(text, st.floats(0, 2e9), st.dictionaries(text | st.sampled_from(["event", "t"]), field_values, max_size=4))
def test_progress_lines_match_the_lenient_encoder(kind: str, now: float, fields: dict[str, Any]) -> None:
    from agentcompass._store._run_store import _LENIENT, _line

    expected = {"event": kind, "t": now, **fields}
    expected["event"], expected["t"] = kind, now
    assert _line(kind, now, fields) == _LENIENT.encode(expected)
    journal = {"event": kind, **{k: v for k, v in fields.items() if k not in ("event", "t")}, "t": now}
    assert _line(kind, now, fields, last="t") == _LENIENT.encode(journal)
