"""Built-in benchmarks: ``terminal``."""
