"""Fitted step-time coefficients per GPU: its linear-layer fit and the all-reduce table its TP group uses.

Why in the cost layer and not with the GPU presets: these numbers are outputs of the cost model's fits
(`benchmarks/cost_fit.py`, `sim.cost.fit`), keyed by the GPU preset's name; the presets
(sim/scenario/presets.py) describe hardware from datasheets. Keeping them here means the scenario
layer never imports the cost layer (the cost model reads the scenario, not the other way round), a
direction `lint-imports` checks.
"""

from __future__ import annotations

from sim.cost.linear import LinearFit

# Fitted linear-layer coefficients per GPU (docs/cost_model.md "Fitted coefficients"): the literals
# `python benchmarks/cost_fit.py` prints for the measured GPUs (Vidur's files in ../shared/profiles;
# tests/test_cost_fit.py refits and compares). GPUs without a measured file take a measured sibling's
# fractions (same chip, applied to their own datasheet bandwidth and FLOP/s) or, with no sibling, the
# mean of the measured GPUs (UNMEASURED_LINEAR_FIT).
_A100_FIT = LinearFit(
    hbm_fraction=0.7689,
    flops_fraction=0.6941,
    smooth_p=1.704,
    fixed_s=3.535e-05,
    source="Vidur a100_Llama-2-70b-hf, a100_Llama-2-7b-hf, a100_Meta-Llama-3-8B",
    mape_pct=3.95,
)
_H100_FIT = LinearFit(
    hbm_fraction=0.949,
    flops_fraction=0.6967,
    smooth_p=1.443,
    fixed_s=3.844e-05,
    source="Vidur h100_Llama-2-70b-hf, h100_Llama-2-7b-hf",
    mape_pct=5.4,
)
UNMEASURED_LINEAR_FIT = LinearFit(
    hbm_fraction=round((_A100_FIT.hbm_fraction + _H100_FIT.hbm_fraction) / 2, 4),
    flops_fraction=round((_A100_FIT.flops_fraction + _H100_FIT.flops_fraction) / 2, 4),
    smooth_p=round((_A100_FIT.smooth_p + _H100_FIT.smooth_p) / 2, 4),
    fixed_s=round((_A100_FIT.fixed_s + _H100_FIT.fixed_s) / 2, 9),
    source="no measured file: mean of the A100-80GB and H100-80GB fits",
)
GPU_LINEAR_FITS: dict[str, LinearFit] = {
    "A100-80GB": _A100_FIT,
    "A100-40GB": LinearFit(
        _A100_FIT.hbm_fraction, _A100_FIT.flops_fraction, _A100_FIT.smooth_p, _A100_FIT.fixed_s,
        source="no measured file: the A100-80GB fit (same GA100 chip and clocks)",
    ),
    "H100-80GB": _H100_FIT,
    "H200-141GB": LinearFit(
        _H100_FIT.hbm_fraction, _H100_FIT.flops_fraction, _H100_FIT.smooth_p, _H100_FIT.fixed_s,
        source="no measured file: the H100-80GB fit (same GH100 chip, HBM3e)",
    ),
    "H100-PCIe-80GB": LinearFit(
        _H100_FIT.hbm_fraction, _H100_FIT.flops_fraction, _H100_FIT.smooth_p, _H100_FIT.fixed_s,
        source="no measured file: the H100-80GB fit (same GH100 chip, HBM2e, PCIe board)",
    ),
    "L4": UNMEASURED_LINEAR_FIT,
}  # fmt: skip

# Which measured all-reduce table (sim/cost/network.py) a GPU's TP group uses, and a time scale for
# GPUs whose links are slower than that node's: H200 boards use the H100's NVLink 4 / NVSwitch; the
# L4 has no NVLink, so its PCIe Gen4 x16 (32 GB/s one way) is taken as 300/32 = 9.375x slower than
# the A100's NVLink 3 (300 GB/s one way), a rough estimate of the bandwidth regime. The H100 PCIe
# board has no NVLink by default (an optional bridge joins pairs only; NVIDIA H100 datasheet), so the
# same rule: PCIe Gen5 x16 (64 GB/s one way) is 300/64 = 4.6875x slower than NVLink 3. A scale other
# than 1 also turns off vLLM's custom all-reduce (sim/cost/network.py `CustomAllReduceModel.applies`)
# for every group size. vLLM turns it off on PCIe-only groups of more than two GPUs and keeps it for
# two (vllm/distributed/device_communicators/custom_all_reduce.py: "not supported on more than two
# PCIe-only GPUs"); a PCIe pair is modelled with NCCL's table scaled instead, a simplification with
# no measured PCIe all-reduce to check it. No published row uses TP > 1 on these GPUs.
GPU_NETWORKS: dict[str, tuple[str, float]] = {
    "A100-40GB": ("a100_dgx", 1.0),
    "A100-80GB": ("a100_dgx", 1.0),
    "H100-80GB": ("h100_dgx", 1.0),
    "H200-141GB": ("h100_dgx", 1.0),
    "H100-PCIe-80GB": ("a100_dgx", 300 / 64),
    "L4": ("a100_dgx", 9.375),
}
UNMEASURED_NETWORK: tuple[str, float] = ("a100_dgx", 1.0)


def _base_gpu_name(name: str) -> str:
    """A preset's name for `<preset>-custom` GPUs (one number changed with a dotted override)."""
    return name.removesuffix("-custom")


def gpu_linear_fit(name: str) -> LinearFit:
    """The fitted (or derived) linear-layer coefficients of a GPU; the unmeasured default otherwise."""
    return GPU_LINEAR_FITS.get(_base_gpu_name(name), UNMEASURED_LINEAR_FIT)


def gpu_network(name: str) -> tuple[str, float]:
    """(all-reduce table name, time scale) of a GPU; the A100 node's table for unknown GPUs."""
    return GPU_NETWORKS.get(_base_gpu_name(name), UNMEASURED_NETWORK)
