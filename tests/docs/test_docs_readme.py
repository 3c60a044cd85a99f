"""The README stays short, cites only files the repository has, its
embedding example runs as written, and so does every shell command in it
after ``make demo`` in a fresh clone."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

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


#: README shell commands the test does not run: the suite itself (this test is in it).
NOT_RUN = {
    "make test": "the whole test suite, which holds this test",
    # Both need root; their configs run in plugins/docker/tests/test_docker_terminal.py
    # and tests/harnesses/test_installed_agents.py.
    "make demo-docker": "a private Docker daemon",
    "make demo-installed": "sandboxes and the agent cache",
}


def _readme_commands() -> list[str]:
    """Every command line of the README's ``sh`` blocks, in order."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _fresh_clone(tmp_path: Path) -> Path:
    """The repository's files (tracked, or new and not ignored) in
    ``tmp_path/clone``, with a ``.venv`` of the one running this test,
    installed (its stamp newer than the sources, so ``make`` installs nothing)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs to run from a virtual environment (make test)")
    missing = [tool for tool in ("git", "make", "bash") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip("needs a git checkout")
    clone = tmp_path / "clone"
    for name in listed.stdout.decode().split("\0"):
        source = REPO / name
        if name and source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    venv = clone / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():
        if not entry.name.startswith("."):
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()
    return clone


def _user_env() -> dict[str, str]:
    """A shell's environment before ``source .venv/bin/activate``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "COMPASS_LOG_LEVEL")}
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return env


def _serve_until_ctrl_c(command: str, clone: Path, env: dict[str, str]) -> None:
    """A command that serves until Ctrl-C: it says where, answers there, and
    exits 0 on the Ctrl-C (SIGINT to its process group, as a terminal sends it)."""
    proc = subprocess.Popen(
        ["bash", "-c", command], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, f"{command}: said nothing in 120 s"
        line = proc.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert match, f"{command}: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        assert httpx.get(match.group(1), timeout=30).status_code == 200
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, f"{command}: {proc.stderr.read()}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_readme_commands_run_as_written_after_make_demo(tmp_path: Path) -> None:
    # A fresh clone: `make demo`, then every README shell command copied as
    # written, in order, in one shell (so `source .venv/bin/activate` holds for
    # the lines after it). Each must exit 0.
    clone = _fresh_clone(tmp_path)
    env = _user_env()
    commands = _readme_commands()
    assert commands[0].startswith("make demo ") and "source .venv/bin/activate" in " ".join(commands)

    demo = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # Right after it, the defaults find the demo's run (runs/demo/<request>/<run id>).
    [run_dir] = (clone / "runs" / "demo" / "terminal-smoke-oracle").iterdir()
    shown = subprocess.run(["bash", "-c", "source .venv/bin/activate\ncompass show"], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"Run:    {run_dir.relative_to(clone)}"

    prelude: list[str] = []
    ran = []
    for command in commands[1:]:
        name = command.split("#")[0].strip()
        if name in NOT_RUN:
            continue
        if name.startswith("source "):
            prelude.append(command)
            continue
        script = "\n".join([*prelude, command])
        if "Ctrl-C" in command:
            _serve_until_ctrl_c(script, clone, env)
        else:
            proc = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=300, check=False)
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        ran.append(name)
    assert {"compass show", "compass view", "compass launch examples/quickstart.yaml"} <= set(ran), ran
