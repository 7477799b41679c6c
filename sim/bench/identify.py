"""What a result file says about the server it measured: model, quantization, GPU, TP, max_model_len.

Why guess at all: `vllm bench serve` records the model id but not the server's flags, so a user
replaying many files at once would otherwise need one command per file. Each guess is used only
for a flag the user did not give, and only when it is unambiguous: the model id maps to a preset
(`-Instruct`, `-Instruct-v0.3` and a trailing `-FP8...` dropped, the latter meaning FP8 weights;
a release date stays: `-Instruct-2407` -> `-2407`), and names in
the path such as `2xH100-80GB-SXM/..._tp2_len2048.json` (LambdaLabsML/vllm-benchmark's layout)
give the GPU, TP and max_model_len. Anything else must come from flags.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_QUANT_SUFFIX = re.compile(r"-fp8(-dynamic)?$", re.IGNORECASE)


def model_from_id(model_id: str) -> tuple[str | None, str | None]:
    """(preset name, quantization) for a Hugging Face model id, or (None, None) when not a preset."""
    from sim.scenario.presets import canonical_model_name

    name = model_id.strip()
    quantization = None
    if _QUANT_SUFFIX.search(name):
        name, quantization = _QUANT_SUFFIX.sub("", name), "fp8"
    name = re.sub(r"-instruct(-v[\d.]+)?$", "", name, flags=re.IGNORECASE)
    name = re.sub(r"-instruct(-\d{4})$", r"\1", name, flags=re.IGNORECASE)  # Mistral's -Instruct-2407
    tail = name.split("/")[-1]
    candidates = [name, tail, f"meta-llama/{tail}", tail.replace("Meta-Llama", "Llama"), f"mistralai/{tail}"]
    for candidate in candidates:
        try:
            return canonical_model_name(candidate), quantization
        except (KeyError, ValueError):
            continue
    return None, None


def server_from_path(path: Path) -> dict[str, Any]:
    """GPU, TP and max_model_len from `<N>x<GPU>/<model>_tp<N>_len<L>.json`, the parts present."""
    from sim.scenario.presets import canonical_gpu_name

    found: dict[str, Any] = {}
    folder = re.fullmatch(r"(\d+)x(.+)", path.parent.name)
    if folder:
        gpu = folder.group(2)
        for candidate in (gpu, re.sub(r"-sxm\d*$", "", gpu, flags=re.IGNORECASE)):
            try:
                found["gpu"] = canonical_gpu_name(candidate)
                break
            except (KeyError, ValueError):
                continue
    tp = re.search(r"_tp(\d+)", path.stem)
    if tp:
        found["tensor_parallel_size"] = int(tp.group(1))
    length = re.search(r"_len(\d+)", path.stem)
    if length:
        found["max_model_len"] = int(length.group(1))
    return found
