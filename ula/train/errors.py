"""Errors of a bad argument or input to `ula demo`, `ula train`, `ula generate` and `ula bench`.

Each message is one line naming the argument, what it got and what it needs; the `ula` command prints
it as `ula <command>: error: <message>` and exits with 2, with no traceback."""


class UsageError(ValueError):
    """A bad argument or input: the message is for the user, the traceback is not."""


class ConfigError(UsageError):
    """Arguments out of range, or that do not fit together (a model that cannot be built of them)."""


class OutputError(UsageError):
    """An output folder or file that cannot be written."""
