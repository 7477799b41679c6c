"""`kvsim waste`: the static waste calculator (sim/planning/static_waste.py) as a rich table or JSON.

Why a command: "how much of my KV cache would these sequences waste under each allocator?" is the
first question of the vLLM paper and of every capacity planner, and needs no simulation.
"""

from __future__ import annotations

import json

import typer

from sim.planning.static_waste import (
    DEFAULT_BYTES_PER_TOKEN_PER_LAYER,
    DEFAULT_PAGE_BYTES,
    parse_lengths,
    request_limits,
    static_waste,
)


def register(app: typer.Typer) -> None:
    @app.command("waste")
    def waste(
        lengths: list[str] = typer.Argument(
            ..., help="Sequence lengths: TOKENS or PROMPT+OUTPUT, one per sequence."
        ),
        max_model_len: int = typer.Option(
            ..., "--max-model-len", help="Model context (contiguous slab size)."
        ),
        max_tokens: int | None = typer.Option(
            None,
            "--max-tokens",
            help="Client output limit for every row (request_limit:limit reserves prompt + it); "
            "default: that row uses the client default 2048 and the others run sequences to the end.",
        ),
        block_size: int = typer.Option(16, "--block-size", help="Paged block size in tokens."),
        page_bytes: int = typer.Option(
            DEFAULT_PAGE_BYTES, "--page-bytes", help="virtual: physical page size."
        ),
        bytes_per_token_per_layer: int = typer.Option(
            DEFAULT_BYTES_PER_TOKEN_PER_LAYER,
            "--bytes-per-token-per-layer",
            help="virtual: kv_heads x head_dim x dtype bytes (default: Llama-2-7B fp16).",
        ),
        placement: str = typer.Option("first_fit", "--placement", help="first_fit, best_fit or buddy."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table."),
        wide: bool = typer.Option(False, "--wide", help="Do not wrap the table to 80 columns."),
    ) -> None:
        """Used vs reserved KV slots and waste % per allocator family, for sequences run to completion."""
        sequences = parse_lengths(lengths)
        rows = static_waste(
            sequences,
            max_model_len=max_model_len,
            max_tokens=max_tokens,
            block_size=block_size,
            page_bytes=page_bytes,
            bytes_per_token_per_layer=bytes_per_token_per_layer,
            placement=placement,
        )
        if as_json:
            typer.echo(json.dumps([row.as_dict() for row in rows], indent=2))
            return
        from sim.cli.tables import Column, console, make_table

        columns = [
            Column("allocator", numeric=False, wrap=False),
            Column("used\nslots"),
            Column("reserved\nslots"),
            Column("waste"),
            Column("how it reserves", numeric=False),
        ]
        cells = [
            [
                row.allocator,
                f"{row.used_tokens:,}",
                f"{row.reserved_tokens:,}",
                f"{row.waste_pct:.2f} %",
                row.note,
            ]
            for row in rows
        ]
        out = console(wide)
        title = f"KV waste for {len(lengths)} sequences (max_model_len {max_model_len})"
        out.print(make_table(title, columns, cells, borders=False))
        client_limit, limits = request_limits(sequences, max_model_len, max_tokens)
        truncated = sum(1 for seq, limit in zip(sequences, limits, strict=True) if seq.output_tokens > limit)
        # one line each, as before the 80-column table (scripts grep them); the terminal wraps prose
        if truncated and max_tokens is not None:
            typer.echo(
                f"{truncated} sequence(s) stop at --max-tokens {max_tokens}; used counts what they hold."
            )
        elif truncated:
            typer.echo(
                f"{truncated} sequence(s) stop at the default client limit {client_limit} in the "
                "request_limit:limit row; used counts what they hold."
            )
