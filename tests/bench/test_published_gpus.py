"""The H100 PCIe preset and which GPU each published gpustack row ran on (issue 21).

gpustack's Qwen3-8B/14B pages say "1x H100 SXM"; the Qwen3-32B page says only "1x H100", and its
numbers are a ~2 TB/s part's (sim/bench/published_set.py `published_gpu`): those rows run on the
H100 PCIe preset, with the SXM part's vllm-v1 server terms (same chip, kernels and vLLM build).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.bench.published_set import BOARD_FLOP_SCALES, published_gpu, published_scenario
from sim.cost.gpu_fits import GPU_LINEAR_FITS, gpu_linear_fit, gpu_network
from sim.cost.server import SHIPPED_TERMS, shipped_terms
from sim.scenario.presets import gpu_preset
from sim.scenario.quantization import FP8_GEMM_SPEEDUP

MiB = 1024**2
SHARED_CSV = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "published.csv"


def test_h100_pcie_preset_has_its_datasheet_numbers() -> None:
    """NVIDIA H100 datasheet, PCIe column: HBM2e 2.0 TB/s, 756 TFLOP/s dense BF16 (1,513 sparse),
    PCIe Gen5 x16 (64 GB/s one way); 81,559 MiB as nvidia-smi shows the 80 GB parts."""
    gpu = gpu_preset("h100-pcie")
    assert gpu.name == "H100-PCIe-80GB"
    assert gpu.memory_bytes == 81559 * MiB == gpu_preset("H100-80GB").memory_bytes
    assert gpu.hbm_bandwidth_bytes_per_s == 2.0e12
    assert gpu.peak_flops == 756e12
    assert gpu.pcie_bandwidth_bytes_per_s == 64e9
    # W8A8 on the same Hopper kernels as the SXM: its rate, not the datasheet's 1,513 / 756
    assert FP8_GEMM_SPEEDUP["H100-PCIe-80GB"] == FP8_GEMM_SPEEDUP["H100-80GB"] < 1513 / 756


def test_h100_pcie_takes_the_sxm_fits_and_terms() -> None:
    """Same GH100 chip: the H100 SXM's linear-layer fractions and vllm-v1 front-end terms, and a FLOP
    scale of the board's own (fitted on its rows by the A100's rule, inside BOARD_FLOP_SCALES); no
    NVLink: PCIe all-reduce (slowed table, so no custom all-reduce)."""
    fit, sxm = gpu_linear_fit("H100-PCIe-80GB"), GPU_LINEAR_FITS["H100-80GB"]
    assert (fit.hbm_fraction, fit.flops_fraction, fit.smooth_p, fit.fixed_s) == (
        sxm.hbm_fraction,
        sxm.flops_fraction,
        sxm.smooth_p,
        sxm.fixed_s,
    )
    assert gpu_network("H100-PCIe-80GB") == ("a100_dgx", 300 / 64)
    pcie_entry, sxm_entry = (
        SHIPPED_TERMS[("vllm-v1", "H100-PCIe-80GB")],
        SHIPPED_TERMS[("vllm-v1", "H100-80GB")],
    )
    assert {**pcie_entry, "flops_efficiency_scale": None} == {**sxm_entry, "flops_efficiency_scale": None}
    assert pcie_entry["flops_efficiency_scale"] in BOARD_FLOP_SCALES
    pcie, sxm_terms = shipped_terms("vllm-v1", "H100-PCIe-80GB"), shipped_terms("vllm-v1", "H100-80GB")
    assert {**pcie.values(), "flops_efficiency_scale": 0} == {
        **sxm_terms.values(),
        "flops_efficiency_scale": 0,
    }


@pytest.mark.parametrize(
    ("gpus", "preset"),
    [("1x H100 SXM", "H100-80GB"), ("1x H100", "H100-PCIe-80GB"), ("1x A100 (80GB)", "A100-80GB")],
)
def test_published_gpu_names(gpus: str, preset: str) -> None:
    assert published_gpu({"gpus": gpus}) == preset


def test_h100_pcie_gets_vllm_v1s_large_defaults() -> None:
    """vllm/engine/arg_utils.py: >= 70 GiB and not an A100 -> 8,192 batched tokens, 1,024 sequences."""
    row = {"model": "Qwen/Qwen3-32B", "gpus": "1x H100", "extra_server_flags": ""}
    scenario = published_scenario(row)
    assert scenario.gpu_spec().name == "H100-PCIe-80GB"
    assert (scenario.max_num_batched_tokens, scenario.max_num_seqs) == (8192, 1024)


@pytest.mark.skipif(not SHARED_CSV.is_file(), reason="shared bench files not found")
def test_published_rows_map_to_their_gpus() -> None:
    """The 9 "H100 SXM" rows (Qwen3-8B, 14B) on the SXM preset, the 5 bare "H100" rows (Qwen3-32B)
    on the PCIe one, the 10 A100 rows on the A100-80GB."""
    import csv

    with open(SHARED_CSV, newline="") as handle:
        rows = list(csv.DictReader(handle))
    by_gpu: dict[str, list[str]] = {}
    for row in rows:
        by_gpu.setdefault(published_scenario(row).gpu_spec().name, []).append(row["id"])
    assert {gpu: len(ids) for gpu, ids in by_gpu.items()} == {
        "H100-80GB": 9,
        "A100-80GB": 10,
        "H100-PCIe-80GB": 5,
    }
    assert all(i.startswith("q32-h100") for i in by_gpu["H100-PCIe-80GB"])
