"""Dense float64 reference (test-only): materializes T = O Vᵀ and T² (column form).

Every test that checks a factored computation compares against these functions.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch


def dense_T(O: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """T = O Vᵀ, [..., d_model, d_model], float64."""
    return O.double() @ V.double().transpose(-1, -2)


def dense_closure(O: torch.Tensor, V: torch.Tensor) -> dict:
    """alpha, P, norms from materialized T and T² (SPEC section 2)."""
    T = dense_T(O, V)
    T2 = T @ T
    inner = (T2 * T).sum((-1, -2))
    nT = T.pow(2).sum((-1, -2)).sqrt()
    nT2 = T2.pow(2).sum((-1, -2)).sqrt()
    alpha = inner / nT**2
    P = inner**2 / (nT2**2 * nT**2)
    return {"alpha": alpha, "P": P, "norm": nT, "norm_T2": nT2, "inner": inner, "T": T, "T2": T2}


def principal_cosines(O: torch.Tensor, V: torch.Tensor) -> np.ndarray:
    """Cosines of principal angles between span(V) and span(O), descending (scipy)."""
    ang = scipy.linalg.subspace_angles(V.double().numpy(), O.double().numpy())
    return np.sort(np.cos(ang))[::-1]


def oblique_projection(d: int, r: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, V) with O Vᵀ = A (B A)^{-1} B, an exact oblique projection (P = 1, α = 1)."""
    A = torch.randn(d, r, generator=gen, dtype=torch.float64)
    B = torch.randn(r, d, generator=gen, dtype=torch.float64)
    O = A @ torch.linalg.inv(B @ A)
    V = B.T.contiguous()
    return O, V
