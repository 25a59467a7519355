"""What a command raises for a user error: main prints its message on one line and exits non-zero."""

from __future__ import annotations


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
