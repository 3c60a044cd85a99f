"""The runtime's scopes (SPEC section 2): one module per scope.

``_launch`` (orchestration), ``_scheduler`` (concurrency limit and ordered
dispatch), ``_request`` (request; its state in ``_request_state``), ``_task``
(task), ``_attempt`` (attempt), ``_try`` (try), with ``_session`` (one
Environment session's life) and ``_issues`` (exception classification).
"""
