"""How many torch threads a layer's products get: chosen by the work, unless the user chose.

A layer's cost is its ``d_model``-long Gram products, ``(2 n_heads + n_kv_heads) · d_model · d_head²``
multiply-adds (:func:`layer_macs`). Small layers (SmolLM2-135M: 5·10⁷) finish in milliseconds, and torch's
intra-op threads only add barrier waits there — several times slower on a machine whose cores are busy
with other processes (a shared notebook server, a cluster node): measured by ``benchmarks/bench_threads.py``.
Big layers (Qwen3-235B: 9·10⁹) gain from every core. So :func:`threads_for` runs a layer below
:data:`SMALL_LAYER_MACS` on one thread and leaves bigger ones on torch's thread count.

The user's choice wins: nothing is changed when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set, or when
``torch.set_num_threads`` was called after this module was first imported (the count then differs from the
one recorded at import).

Bits: the closure (α, P, norms, ranks) is the same bit for bit at any thread count (measured on SmolLM2 and
MiniLM); the scramble's and the search's batched ``d_head``-sized products are not (their blocking depends
on the thread count): they agree to float64 rounding.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

__all__ = ["SMALL_LAYER_MACS", "explicit_threads", "layer_macs", "threads_for"]

#: Layers with fewer multiply-adds in their Gram products run on one thread. Calibrated by
#: ``benchmarks/bench_threads.py --load`` on 2 cores (2026-12-01, RESULTS.md): up to 1.1·10⁸ (Qwen2.5-0.5B)
#: two threads gained nothing quiet (0.96-1.03x) or loaded (0.85-1.06x); from 3.8·10⁸ (Gemma-3-270M) on they
#: were faster quiet (0.63-0.85x); loaded, Gemma's shape still gained (0.79x) and the 7B/235B shapes lost
#: (1.27-1.29x; a library cannot see other users' load, so big layers keep torch's count).
SMALL_LAYER_MACS = 200_000_000

#: torch's thread count when this module was first imported (the machine's default unless set before).
_DEFAULT_THREADS = torch.get_num_threads()
_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def explicit_threads() -> bool:
    """Whether the user chose the thread count (an environment variable, or ``torch.set_num_threads`` since
    this module was imported)."""
    return any(os.environ.get(k, "").strip() for k in _ENV) or torch.get_num_threads() != _DEFAULT_THREADS


def layer_macs(n_heads: int, n_kv_heads: int, d_model: int, d_head: int) -> int:
    """Multiply-adds of one layer's Gram products ``OᵀO``, ``VᵀV``, ``VᵀO``."""
    return (2 * int(n_heads) + int(n_kv_heads)) * int(d_model) * int(d_head) ** 2


@contextlib.contextmanager
def threads_for(macs: int) -> Iterator[int]:
    """Run the block on one torch thread when ``macs`` is below :data:`SMALL_LAYER_MACS` and the user has not
    chosen a thread count; yields the count in effect. The count is restored afterwards."""
    n = torch.get_num_threads()
    if macs >= SMALL_LAYER_MACS or n == 1 or explicit_threads():
        yield n
        return
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(n)
