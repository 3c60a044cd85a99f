"""The README stays short, cites only files the repository has, and its
embedding example runs as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
README = REPO / "README.md"


def test_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) < 250


def test_readme_links_exist() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links its docs"
    for link in local:
        assert (REPO / link).exists(), link
    assert not re.search(r"\bSPEC\b", text)  # not a document of this repository


def test_embedding_example_runs(tmp_path: Path) -> None:
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S) if "trio.run(main)" in b]
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    shutil.copytree(REPO / "benchmarks_data", tmp_path / "benchmarks_data")
    (tmp_path / "embed.py").write_text(snippet, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "embed.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first.startswith("succeeded ['runs/terminal-smoke-oracle/")
    assert second == "succeeded 1.0"


def test_config_example_validates_without_an_api_key(tmp_path: Path) -> None:
    # Saved in examples/ as the comment says; the oracle harness calls no model.
    [config] = [b for b in re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S) if "requests:" in b]
    (tmp_path / "examples").mkdir()
    shutil.copytree(REPO / "benchmarks_data", tmp_path / "benchmarks_data")
    (tmp_path / "examples" / "my_plugins.py").write_text("")
    (tmp_path / "examples" / "config.yaml").write_text(config, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "validate", "examples/config.yaml"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok: 1 request(s)"), proc.stderr
