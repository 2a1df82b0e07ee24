"""The version, written once: the package metadata (pyproject reads it), `__version__`, the
User-Agent header and the telemetry instrumentation scope all take it from here."""

__version__ = "0.1.0"
