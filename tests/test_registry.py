"""The component registry: register, resolve, build, plugins and entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import agentcompass
from agentcompass import _registry
from agentcompass.runtime._components import BaseBenchmark, BaseEnvironment, BaseHarness
from agentcompass.runtime._errors import ComponentError

REPO = Path(agentcompass.__file__).resolve().parents[1]


@_registry.register
class RegBenchmark(BaseBenchmark):
    id = "reg-bench"


@_registry.register
class RegHarness(BaseHarness):
    id = "reg-harness"


class Broken(BaseEnvironment):
    id = "reg-broken"

    def __init__(self, config: dict[str, Any]):
        raise RuntimeError("needs a url\nsecond line")


_registry.register(Broken)


def test_resolve_and_build() -> None:
    assert _registry.resolve("benchmark", "reg-bench") is RegBenchmark
    built = _registry.build("benchmark", "reg-bench", {"x": 1})
    assert isinstance(built, RegBenchmark)
    assert built.config == {"x": 1}


def test_registered_lists_kind_id_and_origin() -> None:
    rows = {(r.kind, r.id): r.origin for r in _registry.registered()}
    assert rows[("benchmark", "reg-bench")] == __name__
    assert rows[("harness", "reg-harness")] == __name__


def test_duplicate_id_is_an_error() -> None:
    class Other(BaseBenchmark):
        id = "reg-bench"

    with pytest.raises(ComponentError, match=r"benchmark id 'reg-bench' is already registered by .*test_registry"):
        _registry.register(Other)


def test_same_id_in_another_kind_is_fine() -> None:
    @_registry.register
    class SameIdEnvironment(BaseEnvironment):
        id = "reg-bench"

    assert _registry.resolve("environment", "reg-bench") is SameIdEnvironment


def test_reregistering_the_same_class_is_fine() -> None:
    assert _registry.register(RegBenchmark) is RegBenchmark


def test_reserved_id_none() -> None:
    class NoneHarness(BaseHarness):
        id = "none"

    with pytest.raises(TypeError, match="reserved"):
        _registry.register(NoneHarness)


def test_register_needs_a_component_with_an_id() -> None:
    class NotAComponent:
        id = "x"

    class NoId(BaseHarness):
        pass

    with pytest.raises(TypeError, match="not a component"):
        _registry.register(NotAComponent)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="'id'"):
        _registry.register(NoId)


def test_unknown_id_lists_registered_ids() -> None:
    with pytest.raises(ComponentError, match=r"unknown harness id 'reg-harnes' \(registered: .*reg-harness"):
        _registry.resolve("harness", "reg-harnes")


def test_wrong_kind_names_the_kind() -> None:
    with pytest.raises(ComponentError, match="'reg-harness' is a harness id, not a benchmark id"):
        _registry.resolve("benchmark", "reg-harness")


def test_build_failure_is_one_line_naming_the_component() -> None:
    with pytest.raises(ComponentError) as info:
        _registry.build("environment", "reg-broken", {})
    assert str(info.value) == "environment 'reg-broken' could not be built: needs a url second line"


PLUGIN = """
from agentcompass import register
from agentcompass.runtime._components import BaseRecipe

IMPORTS = globals().setdefault("IMPORTS", 0) + 1

@register
class {cls}(BaseRecipe):
    id = "{id}"
"""


def test_plugin_from_py_path_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "plugs").mkdir()
    plugin = tmp_path / "plugs" / "recipes_a.py"
    plugin.write_text(PLUGIN.format(cls="FileRecipe", id="reg-file-recipe"))
    _registry.load_plugins(["plugs/recipes_a.py"], tmp_path)
    _registry.load_plugins([str(plugin)], None)  # the same file named another way: imported once
    cls = _registry.resolve("recipe", "reg-file-recipe")
    assert sys.modules[cls.__module__].IMPORTS == 1
    origin = {r.id: r.origin for r in _registry.registered()}["reg-file-recipe"]
    assert origin == str(plugin)


def test_plugin_from_module_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "reg_plugin_mod.py").write_text(PLUGIN.format(cls="ModRecipe", id="reg-mod-recipe"))
    monkeypatch.syspath_prepend(str(tmp_path))
    _registry.load_plugins(["reg_plugin_mod"])
    assert _registry.resolve("recipe", "reg-mod-recipe").__module__ == "reg_plugin_mod"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("missing_file.py", "plugin file not found: missing_file.py"),
        ("reg_no_such_module", "plugin module 'reg_no_such_module' failed to import: No module named"),
        ("broken.py", "plugin broken.py failed to import: boom"),
    ],
)
def test_plugin_errors(tmp_path: Path, entry: str, message: str) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ComponentError, match=message):
        _registry.load_plugins([entry], tmp_path)


def _cli_env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _installed(tmp_path: Path, entry_point: str) -> Path:
    """A site directory holding a real (if minimal) installed distribution:
    a dist-info whose ``entry_points.txt`` names ``entry_point`` (``name = value``)."""
    site = tmp_path / "site"
    dist = site / "reg_dist_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: reg-dist-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[agentcompass.plugins]\n{entry_point}\n")
    return site


def test_compass_list_shows_an_installed_entry_point_plugin(tmp_path: Path) -> None:
    site = _installed(tmp_path, "mine = reg_dist_plugin_mod")
    (site / "reg_dist_plugin_mod.py").write_text(PLUGIN.format(cls="DistRecipe", id="reg-dist-recipe"))
    proc = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "list"],
        check=False, capture_output=True, text=True, env=_cli_env(site), cwd=tmp_path, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert ["recipe", "reg-dist-recipe", "reg_dist_plugin_mod"] in rows
    assert rows[0] == ["KIND", "ID", "ORIGIN"]


BROKEN_ENTRY_POINT = """
from agentcompass import _registry
from agentcompass.runtime._errors import ComponentError

for _ in range(2):  # not marked as loaded: the second call reports it again
    try:
        _registry.load_builtins()
    except ComponentError as exc:
        print(exc)
"""


def test_broken_entry_point_is_a_component_error(tmp_path: Path) -> None:
    site = _installed(tmp_path, "ep0 = reg_no_such_ep_module")
    proc = subprocess.run(
        [sys.executable, "-c", BROKEN_ENTRY_POINT],
        check=False, capture_output=True, text=True, env=_cli_env(site), cwd=tmp_path, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    for line in lines:
        assert line.startswith("plugin entry point 'ep0' (reg_no_such_ep_module) failed to import"), line


def test_compass_list_with_a_plugin_file(tmp_path: Path) -> None:
    plugin = tmp_path / "extra.py"
    plugin.write_text(textwrap.dedent(PLUGIN.format(cls="CliRecipe", id="reg-cli-recipe")))
    proc = subprocess.run(
        [sys.executable, "-m", "agentcompass._cli", "list", "--plugin", "extra.py"],
        check=False, capture_output=True, text=True, env=_cli_env(), cwd=tmp_path, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert ["recipe", "reg-cli-recipe", str(plugin)] in [line.split() for line in proc.stdout.splitlines()]
