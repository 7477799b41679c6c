"""The correctness checks run before any timing: strong enough to catch an off-by-one, on every grid family.

Run on the NumPy stand-in for CuPy (tests/_gpu_fake_cupy.py), whose kernels are emulated in float32
like the CUDA ones; a planted bug in that emulation must make the checks fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from _gpu_helpers import fake_device  # noqa: F401 - fixture

from gpu.check import ATTN_REL_TOL, check_all, check_grid_families, per_sequence_rel_err, raise_on_failures
from gpu.errors import KernelCheckError
from gpu.layouts import fill_random_bits


def _arena(fake, nbytes: int, seed: int = 1):
    return fill_random_bits(
        fake.empty(nbytes // 2, dtype=np.uint16), np.random.default_rng(seed), "bf16", fake
    )


def test_correct_kernels_pass_with_float32_sized_errors(fake_device) -> None:  # noqa: F811
    from gpu.kernels import Kernels

    results = check_all(Kernels(fake_device), np.random.default_rng(0), num_sms=4)
    attention = [r for r in results if r.kernel == "attention"]
    assert len(results) == 80 and all(r.ok for r in results)
    assert max(r.rel_err for r in attention) < ATTN_REL_TOL / 30  # the headroom the docstring claims


def test_a_kernel_that_drops_the_last_token_fails_every_attention_check(fake_device, monkeypatch) -> None:  # noqa: F811
    from gpu.kernels import Kernels

    monkeypatch.setattr(fake_device, "PLANTED_DROP_LAST_TOKEN_ABOVE", 64)  # only "long" sequences
    results = check_all(Kernels(fake_device), np.random.default_rng(0), num_sms=4, raise_on_failure=False)
    attention = [r for r in results if r.kernel == "attention"]
    assert attention and not any(r.ok for r in attention)
    assert min(r.rel_err for r in attention) > 100 * ATTN_REL_TOL
    assert all(r.ok for r in results if r.kernel == "gather")  # the gather was not touched
    with pytest.raises(KernelCheckError, match="40 kernel check"):
        raise_on_failures(results)


def test_the_drop_is_caught_on_the_long_sequence_of_each_grid_family(fake_device, monkeypatch) -> None:  # noqa: F811
    from gpu.kernels import Kernels

    arena = _arena(fake_device, 64 * 2**20)
    monkeypatch.setattr(fake_device, "PLANTED_DROP_LAST_TOKEN_ABOVE", 500)  # only the long sequence
    results = check_grid_families(
        Kernels(fake_device), np.random.default_rng(0), 4, arena, heads=("gqa8",), block_sizes=(8,),
        long_tokens=600,
    )  # fmt: skip
    attention = [r for r in results if r.kernel == "attention"]
    assert len(attention) == 6 and not any(r.ok for r in attention)  # 3 layouts x 2 plans


def test_per_sequence_error_is_not_diluted_by_a_large_short_sequence() -> None:
    ref = np.zeros((3, 1, 4))
    ref[0] = 10.0  # a length-1 sequence with a large output
    ref[1] = 0.1  # a long sequence: small outputs
    got = ref.copy()
    got[1, 0, 0] += 0.01  # 10 % off on the long sequence, 0.1 % of the batch-wide maximum
    assert per_sequence_rel_err(got, ref) == pytest.approx(0.1)
    assert per_sequence_rel_err(np.full_like(ref, np.nan), ref) == float("inf")
    got = ref.copy()
    got[2, 0, 0] = 1e-3  # an empty sequence (reference 0) must give exactly 0
    assert per_sequence_rel_err(got, ref) == float("inf")


def test_every_grid_family_is_checked_on_a_replica_above_offset_zero(fake_device) -> None:  # noqa: F811
    from gpu.grid import BLOCK_SIZES, HEAD_CONFIGS
    from gpu.kernels import Kernels

    arena = _arena(fake_device, 48 * 2**20)
    results = check_grid_families(
        Kernels(fake_device), np.random.default_rng(2), 4, arena, block_sizes=(1, 32), long_tokens=300
    )
    assert results and all(r.ok for r in results), [r for r in results if not r.ok][:2]
    families = {r.family.split(" offset=")[0].rsplit(" ", 1)[0] for r in results}
    # every head config x layout (x the block sizes asked for) x both plans (device SMs and 1 SM)
    assert len(families) == len(HEAD_CONFIGS) * (1 + 2 + 2) * 2
    offsets = [int(r.family.split("offset=")[1].split("B")[0]) for r in results]
    assert min(offsets) > 0
    chunks = {int(r.family.split("chunk=")[1]) for r in results if r.kernel == "attention"}
    assert max(chunks) == 1024  # the plan for one SM reaches the largest attention chunk
    assert BLOCK_SIZES == (1, 8, 16, 32, 128)  # the device run checks all of these (the default)
