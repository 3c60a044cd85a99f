"""The original system's benchmarks by their Harbor-format dataset names:
each records its own values when a task's evaluation times out, and a
registry entry's metadata may declare others."""

from __future__ import annotations

from pathlib import Path

import pytest
from _common import read_json
from _dataset_support import commit, compass, entry, make_swe_task, make_task, new_repo, write_registry

from agentcompass.datasets import KNOWN_BENCHMARKS, declared

SLOW_TEST = 'sleep 30\necho 1 > "${LOGS_DIR:-/logs}/verifier/reward.txt"\n'


def _slow_task(root: Path, name: str, shape: str) -> None:
    """A task of ``shape`` whose verifier outlives its 1 s timeout."""
    if shape == "swe":
        task = make_swe_task(root, name, verifier_sleep=30)
        toml = (
            (task / "task.toml").read_text().replace("[verifier]\ntimeout_sec = 60.0", "[verifier]\ntimeout_sec = 1.0")
        )
        (task / "task.toml").write_text(toml)
    else:
        task = make_task(root, name, test_sh=SLOW_TEST)
        (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 1.0\n')


def test_the_table_covers_the_original_systems_benchmarks() -> None:
    titles = {row.title for row in KNOWN_BENCHMARKS}
    assert titles == {
        "Terminal-Bench 2", "Terminal-Bench 2.1", "Terminal-Bench Verified", "SWE-bench Verified",
        "SWE-bench Multilingual", "SWE-bench Pro", "SWE-bench Pro Verified", "DeepSWE", "SkillsBench", "Frontier-SWE",
    }  # fmt: skip
    for row in KNOWN_BENCHMARKS:
        assert set(row.evaluation_timeout_values) <= set(row.series), row.title


@pytest.mark.parametrize("row", KNOWN_BENCHMARKS, ids=lambda row: row.dataset)
def test_each_benchmark_records_its_values_on_evaluation_timeout(tmp_path: Path, row: object) -> None:
    name, version = row.dataset.split("@")  # type: ignore[attr-defined]
    shape = "swe" if "swe" in name else "terminal"
    repo = new_repo(tmp_path / "repo")
    _slow_task(repo / "tasks", "only", shape)
    pinned = commit(repo)
    registry = write_registry(tmp_path / "registry.json", [entry(name, version, repo, pinned, ["only"])])
    (tmp_path / "work").mkdir()
    env = {"AGENTCOMPASS_DATASET_CACHE": str(tmp_path / "cache"), "AGENTCOMPASS_REGISTRY": str(registry)}
    proc = compass(
        tmp_path / "work", "run", "-d", row.dataset, "-a", "oracle", "-e", "local", "--name", "r",  # type: ignore[attr-defined]
        "--output-root", "out", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [run_dir] = (tmp_path / "work" / "out" / "r").iterdir()
    [record_file] = (run_dir / "details" / "error").glob("*.json")
    [attempt] = read_json(record_file)["attempts"]
    assert [i["code"] for i in attempt["issues"]] == ["evaluation_timeout"]
    assert attempt["values"] == row.evaluation_timeout_values  # type: ignore[attr-defined]
    metrics = read_json(run_dir / "metrics.json")
    assert list(metrics["series"]) == list(row.series)  # type: ignore[attr-defined]


def test_a_registry_entry_declares_its_series_and_timeout_values(tmp_path: Path) -> None:
    repo = new_repo(tmp_path / "repo")
    _slow_task(repo / "tasks", "only", "terminal")
    pinned = commit(repo)
    metadata = {"series": ["score", "reward"], "evaluation_timeout_values": {"score": -1.0}}
    registry = write_registry(
        tmp_path / "registry.json", [entry("terminal-bench", "2.0", repo, pinned, ["only"], metadata=metadata)]
    )
    assert declared("terminal-bench@2.0", str(registry)) == (("score", "reward"), {"score": -1.0})
    # Without the registry at hand, the built-in table answers; an unknown name keeps terminal's own.
    assert declared("terminal-bench@2.0", str(tmp_path / "gone.json"))[0] == ("correct", "reward", "passed")
    assert declared("my-set@1.0", str(tmp_path / "gone.json")) == (None, None)
