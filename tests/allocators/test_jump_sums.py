"""The jump integral's float sums in typed loops are NumPy's, bit for bit.

Why: `seq_kernels.jump_terms` computes the jump integral's suffix sums of the durations, its
internal-waste products and their sum in one C loop, where jump_integral.py had called
`np.add.accumulate`, `np.multiply` and `np.add.reduce` (pairwise summation); and jump_integral.py
calls `ndarray.dot` where it had `@`. Results must stay identical, so each is checked against the NumPy
expression it replaced, on values of mixed signs and magnitudes (where any other summation order
shows), compiled where the core is built, through the shim (NumPy branches) and as loops in Python.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_seq_kernels import KERNELS, LOOPS

from allocators import seq_kernels

FLOATS = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)


def _wide(rng: np.random.Generator, size: int) -> np.ndarray:
    """Positive doubles spread over 12 decades: sums of them depend on the order of the additions."""
    return rng.random(size) * 10.0 ** rng.integers(-6, 6, size)


@KERNELS
@settings(max_examples=200, deadline=None)
@given(values=st.lists(FLOATS, max_size=700), seed=st.integers(0, 2**32 - 1), size=st.integers(0, 1100))
def test_pairwise_sum_is_numpys(kernels: ModuleType, values: list[float], seed: int, size: int) -> None:
    """Sizes across NumPy's cases: < 8 (plain loop), 8..128 (eight accumulators), > 128 (halves)."""
    for array in (np.array(values, dtype=np.float64), _wide(np.random.default_rng(seed), size)):
        expected = np.add.reduce(array)
        got = kernels.pairwise_sum(array)
        assert isinstance(got, float)
        assert np.float64(got).tobytes() == expected.tobytes()


def test_pairwise_sum_signed_zeros() -> None:
    for kernels in (seq_kernels, LOOPS):
        for values in ([], [-0.0], [-0.0] * 9, [-0.0, 0.0]):
            array = np.array(values, dtype=np.float64)
            assert np.float64(kernels.pairwise_sum(array)).tobytes() == np.add.reduce(array).tobytes()


@st.composite
def jumps(draw: st.DrawFn) -> dict:
    """A paged allocator's per-sequence state for a decode batch (up to 300 sequences, so the products'
    sum takes NumPy's halving path too) and the durations of a jump."""
    block_size = draw(st.sampled_from([1, 2, 16]))
    rows = draw(st.integers(1, 300))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, 200, rows)
    num_blocks = -(-lengths // block_size) + rng.integers(0, 2, rows) * draw(st.integers(0, 2))
    final = lengths + rng.integers(0, draw(st.sampled_from([10, 300])), rows)
    tail = -final % block_size
    ids = rng.permutation(rows)[: draw(st.integers(1, rows))].astype(np.int64)
    steps = draw(st.integers(2, 90))
    return {
        "bs": block_size,
        "lengths": lengths.astype(np.int64),
        "num_blocks": num_blocks.astype(np.int64),
        "final": final.astype(np.int64),
        "tail": tail.astype(np.int64),
        "block_from": (final + tail - block_size + 1).astype(np.int64),
        "ids": ids,
        "steps": steps,
        "durations": _wide(rng, steps),
    }


@KERNELS
@settings(max_examples=200, deadline=None)
@given(jump=jumps())
def test_jump_terms_are_the_numpy_expressions(kernels: ModuleType, jump: dict) -> None:
    """As jump_integral.py computed them before: jump_scan, then np.add.accumulate of the reversed
    durations, final_block_terms' products and np.add.reduce of them."""
    bs, ids, steps, durations = jump["bs"], jump["ids"], jump["steps"], jump["durations"]
    arrays = (jump["lengths"], jump["final"], jump["num_blocks"], jump["block_from"])
    want_appended = np.full(steps, np.nan)
    want_remaining, all_small, want_start = seq_kernels.jump_scan(
        *arrays, ids, bs, steps, np.zeros(bs, dtype=np.int64), want_appended
    )
    got_appended = np.full(steps, np.nan)
    scratch = np.full(steps + 1 + ids.size, np.nan)
    got = kernels.jump_terms(
        *arrays,
        jump["tail"],
        ids,
        bs,
        steps,
        durations,
        np.full(bs, 7, dtype=np.int64),
        got_appended,
        kernels.float_view(scratch),
    )
    assert int(got[0]) == int(want_remaining)
    if want_remaining < steps - 1:  # the caller steps instead
        return
    assert got_appended.tobytes() == want_appended.tobytes()
    assert int(got[1]) == min(int(want_start), steps)
    if want_start >= steps:
        assert (float(got[2]), int(got[3])) == (0.0, 0)
        return
    suffix_s = np.zeros(steps + 1)
    np.add.accumulate(durations[::-1], out=suffix_s[-2::-1])
    products = np.empty(ids.size)
    never = seq_kernels.final_block_terms(
        *arrays, jump["tail"], ids, bs, steps, all_small, suffix_s, products
    )
    assert np.float64(got[2]).tobytes() == np.add.reduce(products).tobytes()  # bit for bit
    assert int(got[3]) == int(never)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(2, 400), arange=st.booleans())
def test_ndarray_dot_is_matmul(seed: int, size: int, arange: bool) -> None:
    """jump_integral.py's `durations.dot(x)` is the `durations @ x` it replaced: both DOUBLE_dot (BLAS
    ddot) for 1-D float64, below and above the BLAS kernels' unrolled block sizes."""
    rng = np.random.default_rng(seed)
    durations = _wide(rng, size)
    other = np.arange(size, dtype=np.float64) if arange else _wide(rng, size) * rng.choice([-1.0, 1.0], size)
    assert np.float64(durations.dot(other)).tobytes() == np.float64(durations @ other).tobytes()
