"""The Arithmetic example of ``docs/plugins.md`` runs end to end, as written.

The code blocks are taken from the page itself (a block whose first line is
``# arithmetic.py`` is that file), so the page cannot drift from what works.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
PAGE = REPO / "docs" / "plugins.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in _BLOCK.findall(PAGE.read_text(encoding="utf-8"))]


def _file_blocks() -> dict[str, str]:
    """Blocks that name their file on the first line (``# name.ext``)."""
    files = {}
    for _, body in _blocks():
        first = body.splitlines()[0] if body else ""
        match = re.fullmatch(r"# ([\w.-]+\.(?:py|yaml))", first)
        if match:
            files[match.group(1)] = body
    return files


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(cwd), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=180, check=False)


def test_arithmetic_example_scores(tmp_path: Path) -> None:
    files = _file_blocks()
    assert set(files) >= {"arithmetic.py", "arithmetic.yaml"}
    project = tmp_path / "project"
    project.mkdir()
    for name in ("arithmetic.py", "arithmetic.yaml"):
        (project / name).write_text(files[name], encoding="utf-8")

    validated = _run(tmp_path, "-m", "agentcompass._cli", "validate", "project/arithmetic.yaml")
    assert (validated.returncode, validated.stdout.strip()) == (0, "ok: 1 request(s)"), validated.stderr
    launched = _run(tmp_path, "-m", "agentcompass._cli", "launch", "project/arithmetic.yaml")
    assert launched.returncode == 0, launched.stderr

    [run_dir] = (project / "runs" / "arithmetic").iterdir()  # output_root resolves next to the config
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["evaluation_failed"] is False
    correct = metrics["series"]["correct"]
    assert (correct["value"], correct["evaluated"], correct["total"]) == (1.0, 10, 10)


def test_conformance_snippet_passes(tmp_path: Path) -> None:
    files = _file_blocks()
    (tmp_path / "arithmetic.py").write_text(files["arithmetic.py"], encoding="utf-8")
    [snippet] = [body for lang, body in _blocks() if lang == "python" and "check_environment(" in body]
    (tmp_path / "test_tmpdir.py").write_text(snippet, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    proc = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tmpdir.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
