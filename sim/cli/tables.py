"""Terminal tables that fit 80 columns without cutting a number (`kvsim compare`, `waste`, `presets`).

Why its own module: rich shrinks a table that is wider than the console by cutting cells with "…",
which turns `1,033,456` into `1,033,4…` (issue 20). Every command that prints a table builds it here:
numeric columns never wrap and are never narrower than their widest cell, text columns wrap at word
boundaries, and a table with too many value columns is printed as several tables that each repeat the
row labels (`print_column_chunks`). `--wide` prints everything in one table at its natural width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

# A classic terminal: what `kvsim` tables fit unless the user asks for `--wide`.
TERMINAL_WIDTH_COLUMNS = 80
# `--wide`: wide enough that no table of kvsim's is squeezed; rich still draws each at its natural width.
WIDE_WIDTH_COLUMNS = 1000
# rich's default box draws "│ " before and " │" after cells: each column costs its text plus 3.
_BORDER_COLUMNS_PER_CELL = 3


@dataclass(frozen=True)
class Column:
    """A table column: right-justified numbers (never wrapped) or text (wrapped unless `wrap=False`)."""

    header: str
    numeric: bool = True
    wrap: bool = True


def console(wide: bool) -> Console:
    """A console 80 columns wide, or (`--wide`) wide enough that nothing is squeezed."""
    return Console(width=WIDE_WIDTH_COLUMNS if wide else TERMINAL_WIDTH_COLUMNS)


def _cell_width_columns(text: str) -> int:
    return max((len(line) for line in str(text).splitlines()), default=0)


def column_width_columns(header: str, cells: Sequence[str]) -> int:
    """The width a column needs to show its header and every cell on one line."""
    return max([_cell_width_columns(header), *(_cell_width_columns(c) for c in cells)])


def make_table(
    title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]], borders: bool = True
) -> Table:
    """A rich table whose numeric columns keep their full width (rich may wrap only text columns).

    `borders=False`: a rule under the header and two spaces between columns, no outer padding (a
    column then costs 2 characters beside its text instead of 3), for lists of presets and rows.
    """
    if borders:
        table = Table(title=title, title_justify="left", box=box.SQUARE)
    else:
        table = Table(
            title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0)
        )
    for index, column in enumerate(columns):
        width = column_width_columns(column.header, [row[index] for row in rows])
        if column.numeric:
            table.add_column(column.header, justify="right", no_wrap=True, min_width=width)
        elif not column.wrap:
            table.add_column(column.header, justify="left", no_wrap=True, min_width=width)
        else:
            table.add_column(column.header, justify="left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def column_chunks(
    label_width_columns: int, value_widths_columns: Sequence[int], width_columns: int
) -> list[range]:
    """Consecutive groups of value columns such that each group, beside the label column, fits.

    A column wider than the page on its own still gets a group of its own (it is never cut).
    """
    chunks: list[range] = []
    start = 0
    used = 1 + label_width_columns + _BORDER_COLUMNS_PER_CELL
    for index, width in enumerate(value_widths_columns):
        needed = width + _BORDER_COLUMNS_PER_CELL
        if index > start and used + needed > width_columns:
            chunks.append(range(start, index))
            start = index
            used = 1 + label_width_columns + _BORDER_COLUMNS_PER_CELL
        used += needed
    if start < len(value_widths_columns):
        chunks.append(range(start, len(value_widths_columns)))
    return chunks


def print_column_chunks(
    out: Console,
    title: str,
    label_header: str,
    value_headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    wide: bool,
) -> None:
    """Rows of (label, value per column); split into side-by-side-readable tables that fit the console.

    Why split columns rather than shrink them: each cell of `kvsim compare` is a number a reader
    compares across allocators; splitting keeps every number whole and every row labelled.
    """
    labels = [row[0] for row in rows]
    label_width = column_width_columns(label_header, labels)
    widths = [column_width_columns(h, [row[i + 1] for row in rows]) for i, h in enumerate(value_headers)]
    chunks = [range(len(value_headers))] if wide else column_chunks(label_width, widths, out.width)
    for number, chunk in enumerate(chunks, start=1):
        part = f" ({number}/{len(chunks)})" if len(chunks) > 1 else ""
        columns = [Column(label_header, numeric=False), *(Column(value_headers[i]) for i in chunk)]
        table_rows = [[row[0], *(row[i + 1] for i in chunk)] for row in rows]
        table = make_table(title + part, columns, table_rows)
        table.columns[0].min_width = label_width
        table.columns[0].no_wrap = True
        # a single column wider than the page on its own is printed whole (a terminal wraps it)
        needed = 1 + sum(w + _BORDER_COLUMNS_PER_CELL for w in [label_width, *(widths[i] for i in chunk)])
        out.print(table, width=max(out.width, needed), crop=False)
