"""The stored per-head tables of tl_idempotence 0.1 (``tests/data/v0_1``), compared bit for bit.

Float64 products round differently on CPUs whose BLAS kernels differ (MKL picks its code path by
instruction set; the blocking of a batched product also depends on the thread count): the same code
gives a few ulp apart there (measured: 15 of SmolLM2's 270 α on an AVX-512/AMX Xeon vs the machine
that wrote 0.1's tables; the searched P, a gradient ascent ended by a tolerance, up to 1.3e-4).

So each table is kept once per *kernel signature*: :func:`kernel_signature` hashes the bits of a
fixed set of float64 products like the report's (Gram products of SmolLM2's sizes, a reduction, eigh,
svd, qr) at this process's thread count. ``tests/data/v0_1/`` holds the tables as 0.1 wrote them;
``tests/data/v0_1/kernels/<signature>/`` the same tables computed by **main at ffe9f41** (the code CI had
verified bit-identical to 0.1 on 0.1's machine) on a machine of that signature. :func:`assert_same_bits`
then demands every bit:

* of the signature's own tables when this machine's signature is recorded;
* else of 0.1's tables, when they match bit for bit (the machine that wrote them);
* else, on a CPU no table was recorded on, agreement to float64 rounding (``rtol`` 1e-9; the scramble's
  batched products 1e-6; the search, a tolerance-ended optimizer, 1e-3) with a warning that bits were
  not checked here. Record that machine's tables only from a commit whose numbers are known good.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

REF = Path(__file__).resolve().parent / "data" / "v0_1"

#: Columns of the constructive search (SPEC 5): an optimizer ended by a tolerance.
SEARCH_COLUMNS = (
    "P_searched",
    "feasible_P",
    "search_iters",
    "search_best_restart",
    "feasible_head",
    "search_stopped_on",
    "n_search_budget_stops",
    "n_heads_feasible",
    "feasible",
)


@functools.cache
def kernel_signature() -> str:
    """16 hex digits of sha256 over the bits of fixed float64 products like the report's, at the thread count the
    report uses for these models' layers (``tl_idempotence.core.threads``: one thread for small layers unless the
    user chose a count)."""
    from tl_idempotence.core.threads import layer_macs, threads_for

    with threads_for(layer_macs(9, 3, 576, 64)):  # SmolLM2's layers (MiniLM's are smaller)
        return _signature()


def _signature() -> str:
    g = torch.Generator().manual_seed(1234)
    A = torch.randn(3, 576, 64, generator=g, dtype=torch.float64)
    B = torch.randn(3, 576, 64, generator=g, dtype=torch.float64)
    outs = [
        A.mT @ A,
        A.mT @ B,
        (A.mT @ A) @ (B.mT @ B),
        (A * B).sum((-1, -2)),
        torch.linalg.eigvalsh(A.mT @ A),
        torch.linalg.svdvals(A.mT @ B),
        torch.linalg.qr(A[0]).R,
    ]
    h = hashlib.sha256()
    for o in outs:
        h.update(o.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if b.dtype.kind == "f":
        a, b = a.astype(np.float64), b.astype(np.float64)
        return bool(
            np.array_equal(a.view(np.int64), b.view(np.int64))
            or (np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b)))
        )
    return [str(x) for x in a] == [str(x) for x in b]


def _table_equal(got: pd.DataFrame, ref: pd.DataFrame) -> list[str]:
    return [c for c in ref.columns if not _same_bits(got[c].to_numpy(), ref[c].to_numpy())]


def assert_same_bits(got: pd.DataFrame, stem: str, columns: list[str] | None = None) -> None:
    """``got`` equals the stored table ``stem`` bit for bit (see the module docstring for which one);
    ``columns``: only these columns of it."""
    got = got.reset_index(drop=True)
    ref = pd.read_parquet(REF / f"{stem}.parquet", columns=columns)
    missing = [c for c in ref.columns if c not in got.columns]
    assert not missing, f"{stem}: columns of 0.1 missing now: {missing}"
    assert len(got) == len(ref), stem
    sig = kernel_signature()
    mine = REF / "kernels" / sig / f"{stem}.parquet"
    if mine.exists():
        bad = _table_equal(got, pd.read_parquet(mine, columns=columns))
        assert not bad, f"{stem}: columns {bad} differ from the tables recorded for kernel signature {sig}"
        return
    bad = _table_equal(got, ref)
    if not bad:
        return
    # A CPU whose kernels no table was recorded on: float64 rounding, not bits.
    for c in ref.columns:
        a, b = got[c].to_numpy(), ref[c].to_numpy()
        if c in SEARCH_COLUMNS:
            if b.dtype.kind == "f" and c.endswith("P"):
                np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=0, atol=1e-3, err_msg=f"{stem}.{c}")
            continue
        if b.dtype.kind == "f":
            rtol = 1e-6 if "scrambl" in c or c == "p_value" else 1e-9
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=rtol, atol=1e-300, err_msg=f"{stem}.{c}")
        else:
            assert [str(x) for x in a] == [str(x) for x in b], f"{stem}: column {c} differs"
    warnings.warn(
        f"{stem}: bits not checked on this CPU (kernel signature {sig} has no recorded tables; columns {bad} "
        "differ from 0.1's by float64 rounding only)",
        UserWarning,
        stacklevel=2,
    )
