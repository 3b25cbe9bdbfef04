"""What the orientation-only analyses share (SPEC 4b and 5): a head's singular values and
principal cosines, and P of an arbitrary orientation from ``d_head``-sized factors.

In principal coordinates a head is ``T = Q_O K Q_Vᵀ`` and ``T² = Q_O (K D K) Q_Vᵀ`` with
``D = diag(cos θ)`` (SPEC 3). For ``K = R₁ S R₂ᵀ`` (``S`` the singular values) and
``X = R₂ᵀ D R₁``, because the Q's are isometries::

    ⟨KDK, K⟩ = Σ_i s_i³ X_ii,     ‖KDK‖² = Σ_ij s_i² s_j² X_ij²,     ‖K‖² = Σ_i s_i²

so P of any orientation costs one ``r x r`` product. P does not depend on the scale of
``S``: :class:`Factors` keeps ``S`` rescaled by an exact power of two per head when its
size leaves ``[2^-16, 2^16]`` (``e_S``), so that ``s⁴`` never overflows; outputs in the
weights' units multiply back by ``2^-e_S``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import OptionError
from ..maths.closure import Closure, pow2_scale

__all__ = ["Factors", "P_from_Z", "P_of_K", "defined_for_orientation", "factors_of"]


@dataclass(frozen=True)
class Factors:
    """What the orientation-only controls need per head (flattened batch ``[b]``).

    Attributes:
        S: ``[b, r]`` singular values of K (= of T), descending, zeros beyond
            ``min(rank_O, rank_V)``, in units of ``2^e_S``.
        cos: ``[b, r]`` principal cosines (the closure's D).
        rank_O, rank_V: ``[b]`` numerical ranks.
        P: ``[b]`` trained P.
        K: ``[b, r, r]`` trained K (principal or raw coordinates, unscaled units of the caller).
        rtol: the rank tolerance.
        reason: ``[b]`` "" where the orientation analyses are defined, else why not.
        e_S: ``[b]`` int64 exponent: true singular values are ``S · 2^-e_S``.
    """

    S: Float[Tensor, "b r"]
    cos: Float[Tensor, "b r"]
    rank_O: Int[Tensor, " b"]
    rank_V: Int[Tensor, " b"]
    P: Float[Tensor, " b"]
    K: Float[Tensor, "b r r"]
    rtol: float
    reason: np.ndarray
    e_S: Int[Tensor, " b"]

    def unscale(self, x: Tensor, power: int = 1) -> Tensor:
        """``x · 2^(-power · e_S)`` per head (leading dim ``b``): back to the weights' units."""
        return pow2_scale(x, -power * self.e_S)


def factors_of(
    K: Float[Tensor, "*batch r r"],
    D: Float[Tensor, "*batch r"],
    rank_O: Int[Tensor, "*batch"],
    rank_V: Int[Tensor, "*batch"],
    c: Closure,
    e_K: Int[Tensor, "*batch"] | None = None,
) -> Factors:
    """:class:`Factors` from a head's K, D and ranks (any principal or raw coordinates; only
    the singular values of K and the cosines matter) and its closure (trained P, reasons).

    Args:
        K, D, rank_O, rank_V: as returned by ``principal_factors`` (or a factored Closure).
        c: the closure of the same heads (``P``, ``reason``, ``rtol``).
        e_K: power-of-two exponent ``K`` carries (``K = K_true · 2^e_K``), or None.

    Returns:
        :class:`Factors` with a flattened batch. Heads that are zero, nilpotent in every
        orientation (span(O) ⟂ span(V)) or have an undefined trained P get a reason.
    """
    r = K.shape[-1]
    K = K.reshape(-1, r, r)
    cos = D.reshape(-1, r)
    S = torch.linalg.svdvals(K)
    # K has rank <= min(rank_O, rank_V): singular values beyond are rounding noise; zero them so
    # every scrambled K~ = R1 S R2ᵀ stays exactly inside the rank blocks.
    k = torch.minimum(rank_O, rank_V).reshape(-1, 1)
    S = torch.where(torch.arange(r) < k, S, torch.zeros_like(S))
    e_S = torch.zeros(S.shape[0], dtype=torch.int64) if e_K is None else e_K.reshape(-1).to(torch.int64).clone()
    smax = S[:, 0]
    _, ex = torch.frexp(smax)
    outside = (smax > 0) & ((smax < 2.0**-16) | (smax > 2.0**16))
    if bool(outside.any()):
        extra = torch.where(outside, -ex.to(torch.int64), torch.zeros_like(e_S))
        S = pow2_scale(S, extra)
        e_S = e_S + extra
    P = c.P.reshape(-1)
    reason = np.asarray(c.reason, dtype=object).reshape(-1).copy()
    zero_S = S[:, 0] <= 0
    no_cos = cos.amax(-1) <= c.rtol
    for i in range(len(reason)):
        if reason[i] and str(reason[i]).startswith("zero head"):
            continue
        if bool(zero_S[i]):
            reason[i] = "zero head: K = 0"
        elif bool(no_cos[i]):
            reason[i] = "span(O) is orthogonal to span(V): every orientation is nilpotent (T^2 = 0)"
        elif reason[i]:
            # Trained head nilpotent: the orientation analyses are defined, the comparison is not.
            reason[i] = f"trained P undefined ({reason[i]})"
    return Factors(
        S=S,
        cos=cos,
        rank_O=rank_O.reshape(-1),
        rank_V=rank_V.reshape(-1),
        P=P,
        K=K,
        rtol=c.rtol,
        reason=reason,
        e_S=e_S,
    )


def factors_of_closure(c: Closure) -> Factors:
    """:class:`Factors` of a factored :class:`~tl_idempotence.maths.closure.Closure` (``factors=True``).

    Raises:
        OptionError: the closure has no K/D factors.
    """
    if c.K is None or c.D is None:
        raise OptionError(
            "The Closure has no K/D factors: compute it with tli.closure(..., factors=True) "
            "or closure_from_grams(g, factors=True)."
        )
    return factors_of(c.K, c.D, c.rank_O, c.rank_V, c)


def defined_for_orientation(reason: np.ndarray) -> np.ndarray:
    """Heads the orientation analyses (SPEC 4b, 5) run on: no reason, or only an undefined trained P.

    Args: reason: ``[b]`` object array of reasons. Returns: ``[b]`` bool.
    """
    return np.array([not str(x) or str(x).startswith("trained P undefined") for x in reason], dtype=bool)


def P_from_Z(s: Tensor, Z: Tensor, rtol: float) -> Tensor:
    """P (SPEC 3, 4b) of ``K = R₁ S R₂ᵀ`` from ``Z = diag(s) R₂ᵀ D R₁`` (module docstring):
    ``⟨KDK, K⟩ = Σ_i s_i² Z_ii`` and ``‖KDK‖² = Σ_ij Z_ij² s_j²``.

    Args:
        s: ``[..., r]`` singular values (broadcast against Z's leading dims).
        Z: ``[..., r, r]``.

    Returns:
        ``[...]`` P (dimensionless, [0, 1]), NaN where ``‖K D K‖ <= rtol ‖K‖²`` (a nilpotent orientation).
        ``s`` may be in any units: P is invariant to its scale.

    Raises:
        RuntimeError (torch): shapes that do not broadcast (internal).
    """
    s2 = s * s
    num = (s2 * Z.diagonal(dim1=-2, dim2=-1)).sum(-1)
    q = (torch.linalg.vector_norm(Z, dim=-2).square() * s2).sum(-1)  # Σ_j s_j² ‖Z[:, j]‖²
    z = s2.sum(-1)
    nil = q.sqrt() <= rtol * z
    P = (num * num / torch.where(nil, torch.ones_like(q), q * z)).clamp(0.0, 1.0)
    return torch.where(nil | (z <= 0), torch.full_like(P, float("nan")), P)


def P_of_K(K: Float[Tensor, "*b r r"], D: Float[Tensor, "*b r"]) -> Float[Tensor, "*b"]:
    """``P = ⟨KDK, K⟩² / (‖KDK‖² ‖K‖²)`` directly on ``r x r`` factors, float64 (SPEC 3).

    Used as the independent check of every searched or scrambled ``K``.

    Args:
        K: ``[*b, r, r]`` (any units; P is scale-invariant); D: ``[*b, r]`` principal cosines.

    Returns:
        ``[*b]`` float64 P in [0, 1]; NaN (0/0) for ``K = 0`` or a nilpotent ``K D K = 0``.
    """
    K = K.double()
    KDK = (K * D.double().unsqueeze(-2)) @ K
    inner = (KDK * K).sum((-1, -2))
    return inner**2 / ((KDK * KDK).sum((-1, -2)) * (K * K).sum((-1, -2)))
