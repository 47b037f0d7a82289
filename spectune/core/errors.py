"""The one exception type for user errors, shared by every spectune package.

It lives in ``spectune.core``, below every layer, so that ``loadgen``, ``backends`` and ``spectune``'s packages can
raise it without importing upwards. Only the CLI edge (``spectune.cli.main``) catches it: it prints the message on one
line and exits with ``exit_code``.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: bad input, a missing file, an unreachable endpoint.

    Args:
        message: one line naming the problem and the fix, e.g.
            ``"unknown dataset 'mtbench': use one of mt-bench, humaneval, sharegpt, ..."``.
        exit_code: process exit status at the CLI edge (2 for bad input, the default).
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
