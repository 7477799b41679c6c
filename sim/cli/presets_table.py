"""`kvsim presets`'s tables: each model's attention and KV layout in words a reader can tell apart.

Why its own module: "kv heads 128, head dim 192" for DeepSeek-V3 reads as a KV of 128 x 192 per
layer, while MLA caches one latent of kv_lora_rank + qk_rope_head_dim (576) per token per layer;
and Mistral-7B vs Mistral-7B-v0.1 differ only by v0.1's 4,096-token sliding window (issue 20). The
cells say what KV memory depends on: MHA / GQA / MQA heads x head dim, MLA's latent, the window and
the layers it applies to. The default table fits 80 columns; `--wide` adds every preset field.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console

from sim.cli.tables import Column, make_table

# Printed under the default table so that the compact cells need no guessing.
ATTENTION_LEGEND = (
    "attention: MHA heads×head dim; GQA query/KV heads×head dim; MQA one KV head; MLA one latent of "
    "kv_lora_rank+rope dims per token per layer. window: sliding-window tokens, on all layers or "
    "on N/M of them (the others attend to the whole context)."
)


def attention_cell(row: Mapping[str, object]) -> str:
    """The attention kind and what its KV holds per layer: 'GQA 32/8×128', 'MLA 512+64'."""
    heads, kv_heads, head_dim = int(row["num_attention_heads"]), int(row["num_kv_heads"]), row["head_dim"]
    if int(row.get("kv_lora_rank") or 0) > 0:
        return f"MLA {row['kv_lora_rank']}+{row['qk_rope_head_dim']}"
    if kv_heads == heads:
        return f"MHA {heads}×{head_dim}"
    if kv_heads == 1:
        return f"MQA {heads}/1×{head_dim}"
    return f"GQA {heads}/{kv_heads}×{head_dim}"


def window_cell(row: Mapping[str, object]) -> str:
    """'4,096 all' (every layer slides), '1,024 52/62' (52 of 62 layers), '–' (no window)."""
    window = row.get("sliding_window_tokens")
    window_layers = int(row.get("num_window_layers") or 0)
    if window is None or window_layers == 0:
        return "–"
    layers = int(row["num_layers"])
    where = "all" if window_layers == layers else f"{window_layers}/{layers}"
    return f"{int(window):,} {where}"


def _kib(value: object) -> str:
    return f"{int(value) / 1024:,.0f} KiB"


def _billions(value: object) -> str:
    return "–" if value is None else f"{int(value) / 1e9:.1f}"


def _context_cell(value: object) -> str:
    """'131,072'; a million tokens or more in millions ('1.02M', Mistral-Nemo's 1,024,000), so the
    compact table keeps its 80 columns (`--wide` prints every digit)."""
    tokens = int(value)  # type: ignore[call-overload]
    return f"{tokens:,}" if tokens < 1_000_000 else f"{tokens / 1e6:.2f}M"


def _experts_cell(row: Mapping[str, object]) -> str:
    experts = int(row.get("num_experts") or 0)
    return "–" if experts == 0 else f"{row['experts_per_token']} of {experts}"


def model_table_rows(rows: list[dict[str, object]], wide: bool) -> tuple[list[Column], list[list[str]]]:
    """The models table's columns and cells (key columns, or every preset field with `wide`)."""
    if not wide:
        columns = [
            Column("name", numeric=False, wrap=False),
            Column("layers"),
            Column("attention", numeric=False, wrap=False),
            Column("window", numeric=False, wrap=False),
            Column("params\n(B)"),
            Column("context"),
            Column("KV/token"),
        ]
        cells = [
            [
                str(row["name"]),
                str(row["num_layers"]),
                attention_cell(row),
                window_cell(row),
                _billions(row["num_params"]),
                _context_cell(row["max_context_tokens"]),
                _kib(row["kv_bytes_per_token"]),
            ]
            for row in rows
        ]
        return columns, cells
    headers = (
        "layers",
        "heads",
        "kv heads",
        "head dim",
        "attention",
        "kv_lora_rank",
        "rope dim",
        "window",
        "window layers",
        "params (B)",
        "active (B)",
        "experts",
        "weights (GiB)",
        "max context",
        "KV/token",
    )
    columns = [Column("name", numeric=False, wrap=False), *(Column(h) for h in headers)]
    cells = []
    for row in rows:
        is_mla = int(row.get("kv_lora_rank") or 0) > 0
        window = row.get("sliding_window_tokens")
        cells.append(
            [
                str(row["name"]),
                str(row["num_layers"]),
                str(row["num_attention_heads"]),
                # MLA has no K/V heads in the cache: the latent is one "head" per token (vLLM's MLA spec)
                "– (MLA)" if is_mla else str(row["num_kv_heads"]),
                str(row["head_dim"]),
                attention_cell(row),
                str(row["kv_lora_rank"]) if is_mla else "–",
                str(row["qk_rope_head_dim"]) if is_mla else "–",
                "–" if window is None else f"{int(window):,}",
                str(row.get("num_window_layers") or 0),
                _billions(row["num_params"]),
                _billions(row.get("active_params")),
                _experts_cell(row),
                f"{int(row['weight_bytes']) / 1024**3:,.1f}",
                f"{row['max_context_tokens']:,}",
                _kib(row["kv_bytes_per_token"]),
            ]
        )
    return columns, cells


def gpu_table_rows(rows: list[dict[str, object]]) -> tuple[list[Column], list[list[str]]]:
    """The GPUs table: memory, HBM bandwidth, dense BF16 FLOP/s, host link."""
    columns = [
        Column("name", numeric=False, wrap=False),
        Column("memory"),
        Column("HBM (TB/s)"),
        Column("dense BF16 (TFLOP/s)"),
        Column("PCIe (GB/s)"),
    ]
    cells = [
        [
            str(row["name"]),
            f"{int(row['memory_bytes']) / 1024**3:.0f} GiB",
            f"{float(row['hbm_bandwidth_bytes_per_s']) / 1e12:.2f}",
            f"{float(row['peak_flops']) / 1e12:.0f}",
            f"{float(row['pcie_bandwidth_bytes_per_s']) / 1e9:.0f}",
        ]
        for row in rows
    ]
    return columns, cells


def print_presets(out: Console, wide: bool) -> None:
    """Both preset tables (models, then GPUs), with the attention legend under the compact one."""
    from sim.scenario.presets import gpu_rows, model_rows

    columns, cells = model_table_rows(model_rows(), wide)
    out.print(make_table("models", columns, cells, borders=False))
    if not wide:
        out.print(ATTENTION_LEGEND)
    columns, cells = gpu_table_rows(gpu_rows())
    out.print(make_table("GPUs", columns, cells, borders=False))
