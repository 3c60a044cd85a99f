"""AgentCompass: a Trio runtime that evaluates LLM agents and models on benchmarks.

The public surface is exactly what this module re-exports; everything else
lives in private modules. The contracts (``agentcompass.runtime``) load with
the package; the engine (``launch``, ``run_evaluation``, ``load_config``,
``Planner``, ``register``) loads on first use, so a command that needs none
of it (``compass --help``) starts fast.
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

from .runtime import NO_HARNESS as NO_HARNESS
from .runtime import AttemptRecord as AttemptRecord
from .runtime import AttemptsSpec as AttemptsSpec
from .runtime import BaseAnalyzer as BaseAnalyzer
from .runtime import BaseBenchmark as BaseBenchmark
from .runtime import BaseEnvironment as BaseEnvironment
from .runtime import BaseHarness as BaseHarness
from .runtime import BaseRecipe as BaseRecipe
from .runtime import CompassError as CompassError
from .runtime import ComponentError as ComponentError
from .runtime import ComponentRef as ComponentRef
from .runtime import ConfigError as ConfigError
from .runtime import EnvironmentSession as EnvironmentSession
from .runtime import Evaluation as Evaluation
from .runtime import ExecResult as ExecResult
from .runtime import ExecutionPlan as ExecutionPlan
from .runtime import ExecutionSpec as ExecutionSpec
from .runtime import Executor as Executor
from .runtime import FileRefusedError as FileRefusedError
from .runtime import GatewaySpec as GatewaySpec
from .runtime import HarnessFreeBenchmark as HarnessFreeBenchmark
from .runtime import Issue as Issue
from .runtime import IssueError as IssueError
from .runtime import Limits as Limits
from .runtime import ModelSpec as ModelSpec
from .runtime import NetworkOverrides as NetworkOverrides
from .runtime import NetworkPolicy as NetworkPolicy
from .runtime import Orchestration as Orchestration
from .runtime import OrchestrationResult as OrchestrationResult
from .runtime import PreparedTask as PreparedTask
from .runtime import Pricing as Pricing
from .runtime import ProviderLimits as ProviderLimits
from .runtime import RequestResult as RequestResult
from .runtime import RunBudget as RunBudget
from .runtime import RunFailedError as RunFailedError
from .runtime import RunRequest as RunRequest
from .runtime import RunResult as RunResult
from .runtime import SandboxSpec as SandboxSpec
from .runtime import Secret as Secret
from .runtime import TaskRecord as TaskRecord
from .runtime import TaskSpec as TaskSpec
from .runtime._public import publish as _publish

_publish(__name__, globals())

if _typing.TYPE_CHECKING:
    from ._config import load_config as load_config
    from ._orchestration._launch import launch as launch
    from ._orchestration._launch import run_evaluation as run_evaluation
    from ._planner import Planner as Planner
    from ._registry import build_component as build_component
    from ._registry import register as register
    from ._stored import StoredRun as StoredRun
    from ._stored import read_run as read_run

# name -> the private module that defines it
_ENGINE = {
    "launch": "._orchestration._launch",
    "run_evaluation": "._orchestration._launch",
    "load_config": "._config",
    "Planner": "._planner",
    "build_component": "._registry",
    "register": "._registry",
    "read_run": "._stored",
    "StoredRun": "._stored",
}


def __getattr__(name: str) -> _typing.Any:
    module = _ENGINE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    _publish(__name__, globals(), [name])
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENGINE})
