"""The runtime's scopes (SPEC section 2): one module per scope.

``_launch`` (orchestration), ``_scheduler`` (worker pool and ordered
dispatch), ``_request`` (request), ``_task`` (task), ``_attempt`` (attempt),
``_try`` (try), with ``_session`` (one Environment session's life) and
``_issues`` (exception classification).
"""
