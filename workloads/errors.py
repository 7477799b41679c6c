"""The one error type of the workloads package: bad user input, reported on one line.

Why its own type and not sim.errors: data flows one way (workloads -> sim), so workloads must not
import sim. `sim.errors.user_error_types()` maps this class to exit code 2 in the CLI.
"""

from __future__ import annotations


class WorkloadError(ValueError):
    """A bad workload: a trace row, a column, a preset parameter or a flag.

    The message is one line: `<file>: row 17, field 'input_length': not a number ('abc')` for a
    file (row = 1-based line number in the file), or `field 'request_rate': must be > 0 (got -1)`
    for a parameter. The parts stay available as attributes for callers that want them.
    """

    def __init__(
        self, reason: str, *, file: str | None = None, row: int | None = None, field: str | None = None
    ):
        self.file = file
        self.row = row
        self.field = field
        self.reason = " ".join(str(reason).split())  # one line, whatever the reason contained
        super().__init__(self._message())

    def _message(self) -> str:
        where: list[str] = []
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        location = ", ".join(where)
        if self.file is not None:
            location = f"{self.file}: {location}" if location else str(self.file)
        return f"{location}: {self.reason}" if location else self.reason


def param_error(field: str, reason: str) -> WorkloadError:
    """An error about a parameter (no file, no row): names the field and what is allowed."""
    return WorkloadError(reason, field=field)
