"""Built-in Environment providers: ``local``."""
