"""``python -m bench.view --smoke``: the viewer's bench still runs. It checks
what the bench reports, never how fast: timings belong to the bench."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentcompass._view._browser import browser_missing

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import view as bench_view  # noqa: E402


def test_bench_view_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = browser_missing()
    if missing:
        pytest.skip(f"headless Chromium unavailable: {missing}")
    out = tmp_path / "report.json"
    assert bench_view.main(["--smoke", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["filter_result"] == "10 of 60 tasks"  # task-000010 .. task-000019
    assert report["rows_in_dom"] < 60
    assert report["scroll_reached_message"] == 2 + 2 * 700 - 1 and report["scroll_back_at_message"] == 0
    assert report["scroll_max_dom_elements"] < 1000 and report["layout"] == "split"
    assert report["search_near_end_ms"] > 0
    assert report["static_out_files"] < 20  # 60 tasks in one bundle
    assert "served warm no slower than the static copy" in capsys.readouterr().out
