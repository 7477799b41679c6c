"""Fast trace reading with pyarrow's CSV and JSON readers: only the kept columns, parsed in C++.

Why a fast path and a line-level path: the line-level readers (`common.py`) report a bad row by its
line in the file, which Arrow cannot (it drops blank lines and stops at the first parse error without
a line number), but they cost ~70 us and ~500 bytes per row (issue 23 item 10: a 1M-row CSV took 68 s
and 528 MB). So every read first tries Arrow, which parses only the columns kept, and accepts its
result only when the file is clean: every kept value parsed, no nulls, and every request-table rule
holds. Anything else -- a parse error, a null, a rule broken, `on_bad_row="skip"` with a row to skip
-- returns None and the caller reads the file again line by line, which produces exactly the table
or the one-line error (file, row, field) it always did. A clean file gives the same table either way
(tests/workloads/test_trace_arrow.py checks both on random files).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from workloads.errors import WorkloadError
from workloads.readers.common import TraceRead, finish, object_column
from workloads.readers.source import is_utf8

# Arrow parses the file in blocks of this size (its default), on its threads: the unit of transient memory.
BLOCK_BYTES = 1 << 20


def csv_header(head: bytes) -> list[str] | None:
    """The header's column names from the file's first bytes, or None when Arrow would read it differently.

    The line-level reader strips names, skips blank lines before the header and refuses duplicates;
    Arrow takes names as written from the first line. Only a header both read the same way is taken.
    """
    text = head.decode("utf-8-sig", errors="replace")
    first, newline, _ = text.partition("\n")
    if not newline or not first.strip():
        return None
    names = next(csv.reader([first.rstrip("\r")]), [])
    if any(name != name.strip() or not name for name in names) or len(set(names)) != len(names):
        return None
    return names


def read_csv_columns(path: str | os.PathLike[str], types: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The `types` columns of a CSV file as NumPy arrays, or None unless every value parsed, none null."""
    import pyarrow as pa
    from pyarrow import csv as pa_csv

    if not is_utf8(path):
        return None
    try:
        with open(path, "rb") as handle:  # a handle, not the path: pyarrow cannot encode a non-UTF-8 name
            table = pa_csv.read_csv(
                handle,
                read_options=pa_csv.ReadOptions(block_size=BLOCK_BYTES),
                convert_options=pa_csv.ConvertOptions(include_columns=list(types), column_types=dict(types)),
            )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    return _columns(table, types)


def read_json_columns(
    path: str | os.PathLike[str], types: Mapping[str, Any]
) -> tuple[dict[str, np.ndarray], Any] | None:
    """The `types` fields of a JSON-lines file (NumPy arrays; list fields stay Arrow), or None if unclean."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import json as pa_json

    if not is_utf8(path):
        return None
    schema = pa.schema([(name, kind) for name, kind in types.items()])
    try:
        with open(path, "rb") as handle:  # a handle, not the path: pyarrow cannot encode a non-UTF-8 name
            table = pa_json.read_json(
                handle,
                read_options=pa_json.ReadOptions(block_size=BLOCK_BYTES),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=schema, unexpected_field_behavior="ignore"
                ),
            )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    scalars = {name: kind for name, kind in types.items() if not pa.types.is_list(kind)}
    columns = _columns(table, scalars)
    lists = {name: table.column(name) for name in types if name not in scalars}
    if columns is None or any(
        column.null_count or pc.list_flatten(column).null_count for column in lists.values()
    ):  # a null list, or a null inside one ([1, null])
        return None
    return columns, lists


def _columns(table: Any, types: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """NumPy copies of the `types` columns (None on a null); Arrow's pool then hands back its blocks.

    Why the release: Arrow's allocator keeps freed blocks for reuse, which would keep the parse
    buffers resident beside the table built from them.
    """
    import pyarrow as pa

    if table.num_rows == 0 or any(table.column(name).null_count for name in types):
        return None
    columns = {name: table.column(name).to_numpy() for name in types}
    pa.default_memory_pool().release_unused()
    return columns


def shared_int_lists(column: Any) -> np.ndarray:
    """An Arrow list<int64> column as an object array of Python lists, equal ids sharing one int object.

    Why shared: a trace's block ids repeat across requests (that is what a shared prefix is), so one
    Python int per distinct id instead of one per occurrence keeps the column's memory close to a
    pointer per id. Arrow's hash-based dictionary encoding finds the distinct ids without a sort.
    """
    import pyarrow.compute as pc

    chunks = column.chunks if hasattr(column, "chunks") else [column]
    lists: list[list[int]] = []
    for chunk in chunks:
        encoded = pc.dictionary_encode(chunk.flatten())
        objects = np.empty(len(encoded.dictionary), dtype=object)
        objects[:] = encoded.dictionary.to_pylist()
        shared = objects[encoded.indices.to_numpy(zero_copy_only=False)].tolist()
        bounds = (chunk.offsets.to_numpy() - chunk.offsets[0].as_py()).tolist()
        lists += [shared[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return object_column(lists)


def accept(
    table: pd.DataFrame, file: str, field_names: Mapping[str, str], attrs: dict[str, Any], *, first_line: int
) -> TraceRead | None:
    """The TraceRead of a clean table (every request-table rule holds), or None to read line by line.

    Rows are numbered from `first_line` as if the file had no blank lines: only a clean table is
    returned, and no message ever names one of its rows.
    """
    rows = np.arange(first_line, len(table) + first_line, dtype=np.int64)
    try:
        return finish(table, [], rows, file, field_names, "error", attrs)
    except WorkloadError:
        return None
