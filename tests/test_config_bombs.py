"""Config bombs: YAML alias bombs and deep nesting are refused while parsing.

A "billion laughs" document in ``model.params`` and a 3,000-deep nesting
(block or flow style, in the file, a ``--set`` value or a ``--*-config`` JSON
flag) end in one line naming the limit, exit 2, in well under a second and a
few tens of MB: ``compass validate`` is run as a real process with its CPU
time and address space capped by the kernel, and its own peak RSS and CPU
time read back from ``wait4``.
"""

from __future__ import annotations

import itertools
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import agentcompass
from agentcompass._config import (
    MAX_ALIAS_VALUES,
    MAX_NESTING,
    apply_override,
    build_orchestration,
    check_nesting,
    load_config,
)
from agentcompass.runtime._errors import ConfigError

REPO = Path(agentcompass.__file__).resolve().parents[1]

#: A request that validates, with ``model.params`` (indented 8) left to each test.
HEAD = f"""\
requests:
  - name: smoke
    benchmark: {{id: terminal, config: {{path: {REPO / "benchmarks_data" / "terminal-smoke"}}}}}
    harness: {{id: react}}
    environment: {{id: local}}
    model:
      name: m
      base_url: http://127.0.0.1:9/v1
      params:
"""
#: The collections around a value of ``model.params``: the file, requests, the request, model, params.
PARAMS_DEPTH = 5


def billion_laughs(levels: int = 9) -> str:
    """``model.params`` keys a..i, each a list of nine aliases of the one before:
    ~400 bytes that write out to 9**9 (~387 million) strings."""
    names = "abcdefghi"[:levels]
    lines = [f"        a: &a [{', '.join(['lol'] * 9)}]"]
    for prev, name in itertools.pairwise(names):
        lines.append(f"        {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return HEAD + "\n".join(lines) + "\n"


def laughs_flow(levels: int) -> str:
    """``&a [1, ...], &b [*a, ...], ...``: ``levels`` lists of ten, 10**levels values written out."""
    items = [f"&a [{', '.join(['1'] * 10)}]"]
    items += [f"&{name} [{', '.join([f'*{prev}'] * 10)}]" for prev, name in itertools.pairwise("abcdefghij"[:levels])]
    return ", ".join(items)


def deep_flow(n: int) -> str:
    """``model.params.p`` nested ``n`` lists deep, flow style: ``[[[...]]]``."""
    return HEAD + "        p: " + "[" * n + "1" + "]" * n + "\n"


def deep_block(n: int) -> str:
    """``model.params.k0.k1...kn``: ``n`` mappings nested in params, block style."""
    lines = [" " * (8 + i) + f"k{i}:" for i in range(n + 1)]
    return HEAD + "\n".join(lines) + " 1\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- load_config


def test_billion_laughs_is_refused_at_load(tmp_path: Path) -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as info:
            load_config(write(tmp_path, billion_laughs()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("invalid YAML in ")
    assert f"aliases expand to more than {MAX_ALIAS_VALUES} values" in message
    assert "@ requests[0].model.params." in message
    assert peak < 20 * 2**20  # the document is never written out


@pytest.mark.parametrize("make", [deep_flow, deep_block], ids=["flow", "block"])
def test_3000_deep_nesting_is_refused_at_load(tmp_path: Path, make: Any) -> None:
    with pytest.raises(ConfigError) as info:  # not a RecursionError
        load_config(write(tmp_path, make(3000)))
    message = str(info.value)
    assert "\n" not in message
    assert f"nesting deeper than {MAX_NESTING} levels" in message
    assert "@ requests[0].model.params." in message
    assert len(message) < 300  # the path to the value is cut short
    assert " line 1" in message  # line 10 (flow) or 10x (block): where the limit was crossed


@pytest.mark.parametrize("make", [deep_flow, deep_block], ids=["flow", "block"])
def test_nesting_limit_is_exact(tmp_path: Path, make: Any) -> None:
    at_limit = MAX_NESTING - PARAMS_DEPTH
    orchestration = load_config(write(tmp_path, make(at_limit)))
    params = orchestration.requests[0].model.params  # type: ignore[union-attr]
    depth = 0
    while isinstance(params, (dict, list)):
        params = params["p"] if isinstance(params, dict) and "p" in params else next(iter(_values(params)))
        depth += 1
    assert depth == at_limit + 1  # params itself and the lists (or mappings) in it
    with pytest.raises(ConfigError, match=f"nesting deeper than {MAX_NESTING} levels"):
        load_config(write(tmp_path, make(at_limit + 1)))


def _values(container: Any) -> list[Any]:
    return list(container.values()) if isinstance(container, dict) else list(container)


def test_shared_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    text = HEAD.replace("    model:\n", "    model: &model\n") + textwrap.indent(
        textwrap.dedent("""\
                  temperature: 0
                  stop: &stop ["</s>", "\\n\\n"]
            - name: second
              benchmark: {id: terminal}
              harness: {id: react}
              environment: {id: local}
              model: {<<: *model, name: m2, params: {stop: *stop}}
        """),
        "  ",
    )
    orchestration = load_config(write(tmp_path, text))
    first, second = orchestration.requests
    assert first.model is not None and second.model is not None
    assert first.model.params == {"temperature": 0, "stop": ["</s>", "\n\n"]}
    assert (second.model.name, second.model.base_url) == ("m2", first.model.base_url)
    assert second.model.params == {"stop": ["</s>", "\n\n"]}


def test_alias_budget_is_values_written_out(tmp_path: Path) -> None:
    # One anchored list of 999 values (1000 with the list) used n times adds 1000 * n.
    def text(uses: int) -> str:
        return HEAD + f"        a: &a [{', '.join(['1'] * 999)}]\n        b: [{', '.join(['*a'] * uses)}]\n"

    under = MAX_ALIAS_VALUES // 1000
    orchestration = load_config(write(tmp_path, text(under)))
    assert len(orchestration.requests[0].model.params["b"]) == under  # type: ignore[union-attr]
    with pytest.raises(
        ConfigError, match=r"aliases expand to more than \d+ values .* @ requests\[0\]\.model\.params\.b\["
    ):
        load_config(write(tmp_path, text(under + 1)))


def test_alias_counts_toward_nesting(tmp_path: Path) -> None:
    # Each half is within the limit as written; together, through the alias, they are not.
    half = (MAX_NESTING - PARAMS_DEPTH) // 2 + 1
    text = HEAD + "        a: &a " + "[" * half + "]" * half + "\n        b: " + "[" * half + "*a" + "]" * half + "\n"
    with pytest.raises(ConfigError, match=f"nesting deeper than {MAX_NESTING} levels through alias \\*a"):
        load_config(write(tmp_path, text))


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"recursive alias \*r .*@ requests\[0\]\.model\.params\.self\.again"):
        load_config(write(tmp_path, HEAD + "        self: &r {again: *r}\n"))


# ---------------------------------------------------------------- --set, JSON and SDK data


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[" * 3000 + "]" * 3000, f"nesting deeper than {MAX_NESTING} levels @ model.params.x[0]"),
        (
            "[" + laughs_flow(6) + "]",
            f"aliases expand to more than {MAX_ALIAS_VALUES} values",
        ),
    ],
    ids=["deep", "bomb"],
)
def test_override_values_are_bounded(value: str, expected: str) -> None:
    data: dict[str, Any] = {"requests": [{"name": "a", "model": {"name": "m", "params": {}}}]}
    with pytest.raises(ConfigError) as info:
        apply_override(data, f"model.params.x={value}")
    message = str(info.value)
    assert message.startswith("invalid override 'model.params.x=")
    assert expected in message
    assert len(message) < 300  # the override is quoted cut short


def test_override_value_depth_counts_its_key() -> None:
    data: dict[str, Any] = {"requests": [{"name": "a", "model": {"name": "m", "params": {}}}]}
    room = MAX_NESTING - PARAMS_DEPTH  # x sits in as many collections as a params value in the file
    apply_override(data, "model.params.x=" + "[" * room + "]" * room)
    with pytest.raises(ConfigError, match=f"nesting deeper than {MAX_NESTING} levels"):
        apply_override(data, "model.params.x=" + "[" * (room + 1) + "]" * (room + 1))


def test_override_key_depth_is_bounded() -> None:
    data: dict[str, Any] = {"requests": [{"name": "a"}]}
    with pytest.raises(ConfigError, match=f"key nested deeper than {MAX_NESTING} levels") as info:
        apply_override(data, "model.params." + ".".join(["k"] * 3000) + "=1")
    assert len(str(info.value)) < 300


def _nested(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return value


def test_deep_data_is_refused_by_build_orchestration() -> None:
    # What JSON flags and SDK callers pass: deeper than the stack would allow later walks.
    data = {"requests": [{"name": "a", "benchmark": {"id": "b", "config": {"x": _nested(5000)}}}]}
    with pytest.raises(
        ConfigError, match=rf"^config nested deeper than {MAX_NESTING} levels @ requests\[0\]\.benchmark\.config\.x"
    ):
        build_orchestration(data)


def test_recursive_data_is_refused_by_build_orchestration() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_NESTING} levels"):
        build_orchestration({"requests": [{"name": "a", "benchmark": {"id": "b", "config": {"x": loop}}}]})


def test_shared_data_is_walked_once_per_level() -> None:
    # 60 levels of [x, x]: 2**60 paths, 60 distinct lists; refused or not, it returns at once.
    value: Any = 1
    for _ in range(60):
        value = [value, value]
    check_nesting({"requests": [{"name": "a", "benchmark": {"id": "b", "config": {"x": value}}}]})
    for _ in range(60):
        value = [value, value]
    with pytest.raises(ConfigError, match="nested deeper"):
        check_nesting({"x": value})


# ---------------------------------------------------------------- the real CLI, measured


def compass(tmp_path: Path, *args: str) -> tuple[int, list[str], resource.struct_rusage]:
    """Run ``compass ARGS`` in ``tmp_path`` capped at 30 s of CPU and 2 GB of
    address space (the unbounded bombs took 90 s and 3.9 GB); return its exit
    code, stderr lines and its own resource usage."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (30, 30))
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(  # files, not pipes: a 3,000-line traceback must not block it
            [sys.executable, "-m", "agentcompass._cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            cwd=tmp_path,
            env=env,
            preexec_fn=limits,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, err.read_text().splitlines(), usage


def assert_refused_quickly(code: int, stderr: list[str], usage: resource.struct_rusage, expected: str) -> None:
    assert (code, len(stderr)) == (2, 1), "\n".join(stderr[-5:])
    assert stderr[0].startswith("error: invalid ") and expected in stderr[0]
    assert usage.ru_utime + usage.ru_stime < 10  # unbounded: 90 s
    assert usage.ru_maxrss < 300 * 1024  # KiB; unbounded: 3.9 GB


def test_cli_refuses_billion_laughs_in_model_params(tmp_path: Path) -> None:
    result = compass(tmp_path, "validate", str(write(tmp_path, billion_laughs())))
    assert_refused_quickly(*result, f"aliases expand to more than {MAX_ALIAS_VALUES} values")
    assert "@ requests[0].model.params." in result[1][0]


@pytest.mark.parametrize("make", [deep_flow, deep_block], ids=["flow", "block"])
def test_cli_refuses_3000_deep_nesting(tmp_path: Path, make: Any) -> None:
    result = compass(tmp_path, "validate", str(write(tmp_path, make(3000))))
    assert_refused_quickly(*result, f"nesting deeper than {MAX_NESTING} levels @ requests[0].model.params.")


def test_cli_refuses_a_deep_set_value(tmp_path: Path) -> None:
    config = write(tmp_path, deep_flow(1))
    result = compass(tmp_path, "validate", str(config), "--set", "model.params.x=" + "[" * 3000 + "]" * 3000)
    assert_refused_quickly(*result, f"nesting deeper than {MAX_NESTING} levels @ model.params.x")


@pytest.mark.parametrize("depth", [500, 3000], ids=["beyond-the-limit", "beyond-json-recursion"])
def test_cli_refuses_deep_json_config_flag(tmp_path: Path, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    result = compass(
        tmp_path,
        "run",
        "--benchmark", "terminal",
        "--environment", "local",
        "--benchmark-config", f'{{"x": {deep}}}',
    )  # fmt: skip
    code, stderr, usage = result
    assert (code, len(stderr)) == (2, 1), "\n".join(stderr[-5:])
    assert f"nested deeper than {MAX_NESTING} levels" in stderr[0]
    assert usage.ru_utime + usage.ru_stime < 10
    assert not (tmp_path / "runs").exists()  # refused before anything runs


def test_cli_validates_a_config_near_the_limits(tmp_path: Path) -> None:
    text = deep_flow(MAX_NESTING - PARAMS_DEPTH).rstrip("\n") + "\n"
    text += f"        a: &a [{', '.join(['1'] * 999)}]\n        b: [{', '.join(['*a'] * (MAX_ALIAS_VALUES // 1000))}]\n"
    code, stderr, usage = compass(tmp_path, "validate", str(write(tmp_path, text)))
    assert code == 0, "\n".join(stderr[-5:])
    assert usage.ru_maxrss < 300 * 1024
