"""Smoke-sized runs of every ``make bench`` scenario.

They keep the benchmark suite working; they assert what each scenario
reports and that the runs were correct (every session closed, every task
done), never how fast anything was: timings belong to ``make bench``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import _scenarios as scenarios  # noqa: E402
from bench.__main__ import SMOKE, main  # noqa: E402
from bench._report import render_table, targets  # noqa: E402


def _kwargs(name: str) -> dict:
    return {k: v for k, v in SMOKE[name].items() if k != "fn"}


def test_overhead_bound(tmp_path: Path) -> None:
    result = scenarios.overhead_bound(tmp_path, **_kwargs("overhead"))
    assert result["status"] == "succeeded"
    assert result["attempts_per_s"] > 0 and result["cpu_us_per_attempt"] > 0


def test_agent_bound_with_its_bare_loop(tmp_path: Path) -> None:
    from bench._agent import agent_bound, agent_rows
    from bench._report import _row

    result = agent_bound(tmp_path, **_kwargs("agent"))
    assert result["status"] == "succeeded" and result["model_calls"] == result["expected_calls"]
    # The bare loop made the same calls, spawning the same processes.
    assert result["bare_calls"] == result["expected_calls"]
    assert result["bare_cpu_ms_per_call"] > 0 and result["cpu_over_bare"] > 0
    rows = {r["metric"]: r for r in agent_rows({"agent": result}, _row)}
    assert rows["runtime CPU per model call / bare loop's"]["target"] == "<= 1.5"
    assert rows["runtime CPU ms per model call"]["target"] == "(context)"
    assert rows["x Inspect AI wall"]["target"].startswith(">= 4")


def test_gateway_overhead_beside_react(tmp_path: Path) -> None:
    from bench._gateway import gateway_overhead

    result = gateway_overhead(tmp_path, **_kwargs("gateway"))
    calls = result["tasks"] * result["calls_per_attempt"]
    # Both harnesses made every call: the installed agent's through its gateway.
    assert result["installed_status"] == result["react_status"] == "succeeded"
    assert result["installed_model_calls"] == result["react_model_calls"] == calls
    assert result["installed_cpu_ms_per_attempt"] > 0 and result["cpu_over_react"] > 0
    rows = [r for r in targets({"gateway": result}) if r["scenario"].startswith("gateway")]
    assert len(rows) == 4 and all(r["target"] == "(context)" for r in rows)


def test_overhead_bound_with_checkpoints(tmp_path: Path) -> None:
    result = scenarios.overhead_bound(tmp_path, **_kwargs("overhead_k3"))
    assert result["status"] == "succeeded" and result["k"] == 3
    assert result["attempts_per_s"] == pytest.approx(3 * result["tasks"] / result["wall_s"])


def test_latency_bound(tmp_path: Path) -> None:
    result = scenarios.latency_bound(tmp_path, **_kwargs("latency"))
    assert result["status"] == "succeeded"
    assert result["ideal_s"] == pytest.approx(0.02)
    assert result["wall_over_ideal"] > 0
    # The bare Trio loop of the same shape sleeps ceil(N/C) rounds at least.
    assert result["bare_trio_wall_s"] >= result["ideal_s"]
    assert result["trio_thread_us_per_attempt"] > 0
    # The fixed part: the run starts before its first attempt and returns
    # after its last record is durable.
    assert 0 < result["before_first_attempt_s"] < result["wall_s"]
    assert 0 < result["after_last_record_s"] < result["wall_s"]
    # The engine alone and the yielding-environment run sleep the same rounds.
    assert result["engine_only_wall_over_ideal"] >= 1.0 and result["engine_only_us_per_attempt"] > 0
    assert result["yielding_env_wall_over_ideal"] >= 1.0
    # Each of the split's processes still sleeps its ceil(N/C) rounds.
    assert result["split_wall_over_ideal"] >= 1.0
    assert result["bare_trio_cpu_budget_us"] in (0.0, *map(float, scenarios._BUDGET_STEPS_US))


def test_memory(tmp_path: Path) -> None:
    result = scenarios.memory(tmp_path, **_kwargs("memory"))
    assert result["status"] == "timed_out"
    assert result["sessions_open_at_exit"] == 0
    assert result["rss_bytes_per_pending_task"] >= 0


def test_shutdown(tmp_path: Path) -> None:
    result = scenarios.shutdown(tmp_path, **_kwargs("shutdown"))
    assert result["status"] == "timed_out"
    assert result["opened"] == SMOKE["shutdown"]["active"]
    assert result["all_closed"]
    assert result["shutdown_s"] > 0


def test_reuse(tmp_path: Path) -> None:
    result = scenarios.reuse(tmp_path, **_kwargs("reuse"))
    assert result["status"] == "succeeded"
    # Only the new task runs; the finished ones are reused.
    assert result["attempts_run"] == result["new_tasks"] == 1
    assert result["first_attempt_s"] > 0


def test_open_rate(tmp_path: Path) -> None:
    result = scenarios.open_rate(tmp_path, **_kwargs("open_rate"))
    assert result["status"] == "succeeded"
    assert result["opens"] == SMOKE["open_rate"]["opens"]
    assert result["achieved_rate"] > 0


def test_report_rows() -> None:
    rows = targets(
        {
            "overhead": {"attempts_per_s": 2500.0, "cpu_us_per_attempt": 300.0},
            "overhead_k3": {"attempts_per_s": 2100.0, "k": 3},
            "latency": {
                "wall_over_ideal": 1.2,
                "bare_trio_wall_over_ideal": 1.05,
                "trio_thread_us_per_attempt": 400.0,
                "bare_trio_cpu_budget_us": 100.0,
                "yielding_env_wall_over_ideal": 1.5,
                "engine_only_wall_over_ideal": 1.2,
                "engine_only_us_per_attempt": 200.0,
                "before_first_attempt_s": 0.025,
                "after_last_record_s": 0.055,
                "split_processes": 2,
                "split_wall_over_ideal": 1.7,
            },
            "inspect": {"skipped": "no network"},
            "host": {"cpu_probe_ms": [12.0, 9.0, 15.0]},
        }
    )
    met = {(r["scenario"], r["metric"]): r["ok"] for r in rows}
    assert met[("overhead-bound", "attempts/s")] is True
    assert met[("overhead-bound", "CPU us/attempt, persistence included")] is True
    assert met[("latency-bound", "wall / ideal")] is False
    assert met[("overhead-bound", "x Inspect AI samples/s")] is None
    assert met[("latency-bound", "bare Trio loop wall / ideal")] is None
    assert met[("latency-bound", "wall / ideal, environment open yields once")] is None
    assert met[("latency-bound", "attempt engine alone (no scheduler, no store) wall / ideal")] is None
    assert met[("overhead-bound, k = 3", "attempts/s")] is None
    table = render_table(rows)
    assert "| latency-bound | ms from launch to the first attempt | 25 | (context) |  |" in table
    assert "| latency-bound | ms from the last record durable to return | 55 | (context) |  |" in table
    assert "| latency-bound | split over 2 processes (tasks and concurrency shared) wall / ideal | 1.700 |" in table
    assert "| overhead-bound | attempts/s | 2500 | >= 2000 | yes |" in table
    assert "| host | ms of CPU for a fixed Python loop, before each run (median) | 12.0 | (context) |  |" in table
    assert "| host | slowest / fastest of those | 1.67 | (context) |  |" in table


def test_main_writes_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "latest.json"
    assert main(["--smoke", "--repeat", "2", "--only", "open_rate", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["results"]["open_rate"]["repeats"] == 2
    # The host's speed is probed before each run, and kept with the run.
    probes = report["results"]["host"]["cpu_probe_ms"]
    assert len(probes) == 2 and all(p > 0 for p in probes)
    assert [run["cpu_probe_ms"] for run in report["results"]["open_rate"]["runs"]] == probes
    assert report["targets"][0]["scenario"] == "open rate"
    # The disk's state is measured first and shown last.
    assert report["results"]["disk"]["file_create_us"] > 0
    assert report["targets"][-1]["scenario"] == "disk"
    assert "| open rate |" in capsys.readouterr().out


@pytest.mark.serial  # its census counts every network namespace and cgroup on the host
def test_sandbox_open_close(tmp_path: Path) -> None:
    from agentcompass_sandbox import host_problem

    problem = host_problem()
    if problem is not None:
        pytest.skip(problem)
    result = scenarios.sandbox_open_close(tmp_path, **_kwargs("sandbox"))
    assert result["held_alive"] == 3 and result["held_errors"] == 0
    assert result["leftover"] == 0, (result["before"], result["after"])
    assert 0 < result["none_median_ms"] <= result["none_p95_ms"]
    assert 0 < result["full_median_ms"] <= result["full_p95_ms"]
    rows = {(r["scenario"], r["metric"]) for r in targets({"sandbox": result})}
    assert ("sandbox", "resources left after the run") in rows


def test_docker_report_rows() -> None:
    result = {
        "sessions": 100,
        "concurrency": 8,
        "execs": 200,
        "open_close_median_ms": 480.0,
        "open_close_p95_ms": 900.0,
        "exec_median_ms": 45.0,
        "cli_exec_median_ms": 160.0,
        "first_run_builds": 1,
        "second_run_builds": 0,
        "leftover": 0,
    }
    rows = targets({"docker": result})
    met = {(r["scenario"], r["metric"]): r["ok"] for r in rows}
    assert met[("docker open + close, built image (100 at concurrency 8)", "median ms, policy full")] is True
    assert met[("docker exec('true')", "median ms of 200 round trips")] is False
    assert met[("docker image", "builds: first run / second run")] is True
    rebuilt = targets({"docker": {**result, "second_run_builds": 1}})
    assert {(r["scenario"], r["ok"]) for r in rebuilt} >= {("docker image", False)}
    table = render_table(rows)
    assert "| docker exec CLI (same container) | median ms of `docker exec C true` | 160 | (context) |  |" in table
