"""Public contracts of AgentCompass (SPEC section 3 and 4).

This package imports nothing else of ``agentcompass``: the engine, the
store and the built-in components build on it, never the other way round
(``tests/test_exports.py`` walks its imports). The model client API is
:mod:`agentcompass.models`.
"""

from ._cleanup import DEFAULT_CLEANUP_GRACE_SECONDS as DEFAULT_CLEANUP_GRACE_SECONDS
from ._cleanup import cleanup_deadline as cleanup_deadline
from ._components import BaseAnalyzer as BaseAnalyzer
from ._components import BaseBenchmark as BaseBenchmark
from ._components import BaseEnvironment as BaseEnvironment
from ._components import BaseHarness as BaseHarness
from ._components import BaseRecipe as BaseRecipe
from ._components import EnvironmentSession as EnvironmentSession
from ._components import HarnessFreeBenchmark as HarnessFreeBenchmark
from ._errors import CompassError as CompassError
from ._errors import ComponentError as ComponentError
from ._errors import ConfigError as ConfigError
from ._errors import FileRefusedError as FileRefusedError
from ._errors import IssueError as IssueError
from ._errors import RunFailedError as RunFailedError
from ._executor import Executor as Executor
from ._executor import Grants as Grants
from ._executor import TaskJob as TaskJob
from ._executor import TaskReporter as TaskReporter
from ._files import DEFAULT_MAX_READ_BYTES as DEFAULT_MAX_READ_BYTES
from ._files import read_beneath as read_beneath
from ._files import split_beneath as split_beneath
from ._files import write_beneath as write_beneath
from ._output import OutputCallback as OutputCallback
from ._output import OutputStream as OutputStream
from ._output import OutputTail as OutputTail
from ._output import command_output as command_output
from ._output import exec_keeping_tails as exec_keeping_tails
from ._private_run import PRIVATE_INIT_SCRIPT as PRIVATE_INIT_SCRIPT
from ._private_run import PRIVATE_INPUT_MODE as PRIVATE_INPUT_MODE
from ._private_run import PRIVATE_MAX_ENTRIES as PRIVATE_MAX_ENTRIES
from ._private_run import PRIVATE_TMPFS_MIN_BYTES as PRIVATE_TMPFS_MIN_BYTES
from ._private_run import PRIVATE_TOPS as PRIVATE_TOPS
from ._private_run import PrivateHandover as PrivateHandover
from ._private_run import collect_private_files as collect_private_files
from ._private_run import private_directory_parts as private_directory_parts
from ._private_run import private_input_bytes as private_input_bytes
from ._private_run import private_input_groups as private_input_groups
from ._private_run import receive_private_ready as receive_private_ready
from ._private_run import send_private_config as send_private_config
from ._private_run import write_private_inputs as write_private_inputs
from ._public import publish as _publish
from ._results import AttemptRecord as AttemptRecord
from ._results import Evaluation as Evaluation
from ._results import ExecResult as ExecResult
from ._results import Issue as Issue
from ._results import OrchestrationResult as OrchestrationResult
from ._results import RequestResult as RequestResult
from ._results import RunBudget as RunBudget
from ._results import RunResult as RunResult
from ._results import TaskRecord as TaskRecord
from ._supervise import supervise_process as supervise_process
from ._values import NO_HARNESS as NO_HARNESS
from ._values import AttemptsSpec as AttemptsSpec
from ._values import ComponentRef as ComponentRef
from ._values import ExecutionPlan as ExecutionPlan
from ._values import ExecutionSpec as ExecutionSpec
from ._values import GatewaySpec as GatewaySpec
from ._values import Limits as Limits
from ._values import ModelSpec as ModelSpec
from ._values import NetworkOverrides as NetworkOverrides
from ._values import NetworkPolicy as NetworkPolicy
from ._values import Orchestration as Orchestration
from ._values import PreparedTask as PreparedTask
from ._values import Pricing as Pricing
from ._values import ProviderLimits as ProviderLimits
from ._values import RunRequest as RunRequest
from ._values import SandboxSpec as SandboxSpec
from ._values import Secret as Secret
from ._values import TaskSpec as TaskSpec

_publish(__name__, globals())
