"""Test support for AgentCompass: scriptable fakes, a provider conformance kit,
and small pytest-trio helpers.

Importing this package registers six fake components:

=================== ===================== ==========================================
id                  kind                  scriptable phases
=================== ===================== ==========================================
``fake-env``        Environment           open, exec, read_file, write_file,
                                          set_network_policy, close, reap
``fake-bench``      Benchmark             load_tasks, prepare, collect, evaluate
``fake-free-bench`` HarnessFreeBenchmark  load_tasks, prepare, run, collect, evaluate
``fake-harness``    Harness               start_session, run, close_session
``fake-recipe``     Recipe                none (config ``set``)
``fake-analyzer``   Analyzer              none (config ``fail``, ``applies``)
=================== ===================== ==========================================

The runtime builds components from their config, one instance per request,
so the fakes keep everything a test inspects in a module-level
:class:`CallLog` named by their ``log`` config key (default ``"default"``).
Every :class:`Call` carries its Trio time (``at``, exact under ``MockClock``)
and its place among the calls of every log (``order``, see
:func:`all_calls`), so a test can assert on timings and interleavings. A ``script`` config key makes the n-th call of a phase for a task do
something other than succeed::

    from agentcompass import ExecutionSpec
    from agentcompass.testing import call_log, fake_request

    request = fake_request(
        benchmark={"tasks": 2, "values": {"*": {"score": [0.0, 1.0]}}},
        environment={"script": {"t001": {"open": ["fatal", "ok"]}}},
        harness={"script": {"*": {"run": ["harness_timeout"]}}},
        execution=ExecutionSpec(max_retries=1),
    )
    # ... run it, then look at what happened:
    log = call_log()
    assert log.count("open", "t001") == 2     # the FATAL open was retried
    assert all(n == 1 for n in log.closed_sessions().values())
    assert not log.live_sessions()            # nothing leaked

Actions: ``ok``, ``fatal``, ``error``, ``fatal:<code>``, ``error:<code>``
(raise :class:`IssueError`), ``warning`` (adds a WARNING issue to a returned
``RunResult`` / ``Evaluation``), ``raise`` (unclassified ``RuntimeError``),
``hang``, ``sleep:<seconds>``, ``harness_timeout`` (``run`` only). Past the
end of a list the action is ``ok``; a task's own entry replaces ``"*"`` for
that phase; counts continue across component instances (retries). Use
``autojump_clock`` for ``hang`` and ``sleep``, and call :func:`reset_logs`
between tests. The fakes' state is per process: in-process executor only.

:mod:`agentcompass.testing.model_server` is a real OpenAI-compatible HTTP
server on 127.0.0.1 with scripted replies, for the model path.

Provider authors check their Environment with :func:`check_environment`
(or :func:`environment_conformance_tests` for one pytest test per check);
one whose sessions are isolated from the host's files also with
:func:`check_exposed_directory`, :func:`check_exposed_socket` and
:func:`check_sweep_detaches_exposures`.
A test that needs a provider of its own builds its sessions on
:class:`MemorySession` (files in a dict, every command exits 0). Components
that run in another process (a ``compass`` subprocess, a Ray worker) report
to the test with :func:`append_line`, one line per event in a file.
"""

from agentcompass.runtime._public import publish as _publish

from ._benchmark import FakeBenchmark as FakeBenchmark
from ._benchmark import FakeHarnessFreeBenchmark as FakeHarnessFreeBenchmark
from ._calls import Call as Call
from ._calls import CallLog as CallLog
from ._calls import all_calls as all_calls
from ._calls import call_log as call_log
from ._calls import live_sandboxes as live_sandboxes
from ._calls import reset_logs as reset_logs
from ._conformance import DEFAULT_POLICIES as DEFAULT_POLICIES
from ._conformance import EnvironmentConformance as EnvironmentConformance
from ._conformance import check_environment as check_environment
from ._conformance import environment_conformance_tests as environment_conformance_tests
from ._environment import FakeEnvironment as FakeEnvironment
from ._environment import FakeSession as FakeSession
from ._expose_checks import check_exposed_directory as check_exposed_directory
from ._expose_checks import check_exposed_socket as check_exposed_socket
from ._expose_checks import check_sweep_detaches_exposures as check_sweep_detaches_exposures
from ._harness import FakeHarness as FakeHarness
from ._harness import FakeHarnessSession as FakeHarnessSession
from ._helpers import HangGuard as HangGuard
from ._helpers import fake_plan as fake_plan
from ._helpers import fake_request as fake_request
from ._helpers import hang_guard as hang_guard
from ._journal import append_line as append_line
from ._memory import MemorySession as MemorySession
from ._recipe import FakeAnalyzer as FakeAnalyzer
from ._recipe import FakeRecipe as FakeRecipe

_publish(__name__, globals())
