"""The benchmarks of the original system, by their Harbor-format dataset
names (SPEC 12 "Datasets").

Each row names the dataset a registry must hold for it, the series the
``terminal`` benchmark reports for it and the values recorded when a task's
evaluation times out. A registry entry's ``metadata`` (``series``,
``evaluation_timeout_values``) wins over the row, and a dataset in no row
keeps ``terminal``'s own (``reward``, ``passed``).

Every series is derived from the verifier's reward: ``correct`` and
``passed`` are ``reward >= 1``; ``score`` and ``correctness`` are the reward.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["KNOWN_BENCHMARKS", "KnownBenchmark", "known_benchmark"]


@attrs.frozen
class KnownBenchmark:
    """A benchmark of the original system: its ``title``, the Harbor-format
    ``dataset`` (``NAME@VERSION``), its ``series`` and the values it records
    on evaluation timeout."""

    title: str
    dataset: str
    series: tuple[str, ...]
    evaluation_timeout_values: dict[str, Any]


_TB = (("correct", "reward", "passed"), {"correct": False, "reward": 0.0, "passed": False})
_SWE = (("correct", "reward"), {"correct": False})

#: The built-in table, in the order the original documentation lists them.
KNOWN_BENCHMARKS: tuple[KnownBenchmark, ...] = (
    KnownBenchmark("Terminal-Bench 2", "terminal-bench@2.0", *_TB),
    KnownBenchmark("Terminal-Bench 2.1", "terminal-bench@2.1", *_TB),
    KnownBenchmark("Terminal-Bench Verified", "terminal-bench-verified@1.0", *_TB),
    KnownBenchmark("SWE-bench Verified", "swe-bench-verified@1.0", *_SWE),
    KnownBenchmark("SWE-bench Multilingual", "swe-bench-multilingual@1.0", *_SWE),
    KnownBenchmark("SWE-bench Pro", "swe-bench-pro@1.0", *_SWE),
    KnownBenchmark("SWE-bench Pro Verified", "swe-bench-pro-verified@1.0", *_SWE),
    KnownBenchmark("DeepSWE", "deepswe@1.0", ("correct", "reward"), {"correct": False, "reward": 0.0}),
    KnownBenchmark("SkillsBench", "skillsbench@1.0", ("score", "passed"), {"score": 0.0, "passed": False}),
    KnownBenchmark("Frontier-SWE", "frontier-swe@1.0", ("score", "correctness"), {"score": 0.0, "correctness": 0.0}),
)


def known_benchmark(name: str, version: str) -> KnownBenchmark | None:
    """The row of dataset ``name@version`` (or of ``name`` at any version), if any."""
    spec = f"{name}@{version}"
    for row in KNOWN_BENCHMARKS:
        if row.dataset == spec:
            return row
    for row in KNOWN_BENCHMARKS:
        if row.dataset.partition("@")[0] == name:
            return row
    return None
