"""Built-in benchmarks: ``terminal``, ``qa``."""
