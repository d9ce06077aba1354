"""Errors that end a command with a one-line message instead of a traceback."""


class GpufleetError(Exception):
    """A bad input or configuration: printed as one line, exit code ``exit_code``."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(GpufleetError):
    """A configuration file or option is invalid (exit 2)."""
