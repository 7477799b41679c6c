"""Old home of the output-path checks; they live in `sim.files` now (one module for all writing).

Kept so that existing imports (`from sim.output_paths import OutputPathError`) keep working.
"""

from __future__ import annotations

from sim.files import OutputPathError, check_output_dir, check_output_file, write_error

__all__ = ["OutputPathError", "check_output_dir", "check_output_file", "write_error"]
