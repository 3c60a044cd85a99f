"""The runtime's scopes (SPEC section 2): one module per scope.

``_launch`` (orchestration), ``_scheduler`` (concurrency limit and ordered
dispatch), ``_request`` (request; its state in ``_request_state``, one task's
life in it in ``_task_life``), ``_task`` (task), ``_attempt`` (attempt),
``_try`` (try; its steps in ``_try_steps``, what it produced in
``_try_outcome``), with ``_session`` (one Environment session's life) and
``_issues`` (exception classification).
"""
