"""Edits of a head's OV circuit that keep or remove its closure, for a causal test (SPEC 2, 3, 13).

Every edit is an ``r x r`` map ``N`` (``r = d_head``) applied to the head's ``z`` (TransformerLens's
``blocks.{l}.attn.hook_z``, row form): ``z <- z Nᵀ``. In the paper's column form ``z = Vᵀ x`` (attention-weighted)
and the head writes ``O z``, so the edited head's operator is

    T' = O N Vᵀ            (T = O Vᵀ is N = I)

with ``V`` the head's kv group's value read on GQA/MQA (each query head has its own ``N``). Nothing
``d_model x d_model`` is formed: ``N`` is built from ``M = Vᵀ O`` and the principal-coordinate factors.

**Closure-only** (:func:`closure_only_edits`). ``N = α M⁻¹`` with ``α`` the head's closure scale (SPEC 2,
``⟨T², T⟩ / ‖T‖²``), so ``T_c = O (α M⁻¹) Vᵀ``. Then ``T_c² = O α M⁻¹ (Vᵀ O) α M⁻¹ Vᵀ = α T_c`` exactly: ``T_c / α``
is the (oblique) projection onto ``range(T) = span(O)`` along ``ker(T) = span(V)^⊥``, the same range and kernel as
``T``. A head with ``M = αI`` (exactly closed) has ``N = I``: ``T_c = T``. Refused (NaN ``N`` and a ``reason``)
when ``α`` is zero or undefined (a nilpotent or zero head) or ``M`` is singular or ill-conditioned:
``σ_min(M) <= CLOSURE_ONLY_RCOND · σ_max(M)`` (:data:`CLOSURE_ONLY_RCOND` = 1e-6; ``M⁻¹`` would amplify the
weights' rounding by more than 1e6).

**Closure-free** (:func:`closure_free_edits`). In principal coordinates (SPEC 3: thin QR ``O = Q_O R_O``,
``V = Q_V R_V``, the SVD ``Q_Vᵀ Q_O = U Σ Wᵀ`` and the rotation ``Q_O <- Q_O W``, ``Q_V <- Q_V U``, ``R_O <- Wᵀ R_O``,
``R_V <- Uᵀ R_V``) ``T = Q_O K Q_Vᵀ`` with ``K = R_O R_Vᵀ`` and ``D = Σ`` diagonal. Keeping ``Q_O``, ``Q_V`` and
``D``, the closure-free version is the nearest ``K'`` (Frobenius; ``‖T - T'‖ = ‖K - K'‖`` since the ``Q`` are
isometries) on the surface

    g(K') = ⟨K' D K', K'⟩ = tr(K'ᵀ K' D K') = 0            (so ⟨T'², T'⟩ = 0: α = P = 0)

with ``∇g = K D K + K Kᵀ D + D Kᵀ K``. ``g`` is homogeneous of degree 3, so ``{g = 0}`` is a cone and the nearest
point is ``⟨K, Y⟩ Y`` for the unit ``Y`` on the cone that maximizes ``⟨K, Y⟩`` (:func:`nearest_closure_free`):
Riemannian conjugate gradients on ``{‖Y‖ = 1, g(Y) = 0}`` (Polak-Ribière+, Armijo backtracking; the tangent
space is orthogonal to ``Y`` and ``∇g(Y)``), each step retracted onto the cone by Newton steps along ``∇g``
(``|g(Y)| <= FREE_G_TOL`` with ``‖Y‖ = 1``, i.e. ``|g(K')| <= 1e-13 ‖K‖³``) and renormalized (``g`` is
homogeneous, so the norm does not move it off the cone). It stops when the Riemannian gradient's norm is
``<= FREE_GRADIENT_TOL`` (1e-6, relative to ``‖K‖``: the distance is then exact to about 1e-12 relative; the
rounding floor of the gradient is 1e-8 to 3e-7 on SmolLM2's closed heads, d_head = 64). The start is the best of
the Newton retraction of ``K`` and the nearest roots of ``g`` on 8 seeded lines through ``K``; the point found is a
local nearest point (a Gauss-Newton projection alone, ``K_{n+1} = K - μ_n ∇g(K_n)``, does not converge for closed
heads: the constraint's curvature matters there). On SmolLM2's 13 closed heads it takes 100-650 steps (~2 s a
head on a loaded 2-core CPU) and changes ``T`` by 51-53 % (``‖T - T_f‖/‖T‖``). Not converged in
``FREE_MAX_ITER`` steps: refused.
Mapped back: ``T' = Q_O K' Q_Vᵀ = O R_O⁻¹ K' R_V⁻ᵀ Vᵀ``, so ``N = R_O⁻¹ K' R_V⁻ᵀ`` (``K' = K`` gives ``N = I``).
Heads whose ``O`` or ``V`` is rank-deficient (numerical rank below ``d_head``, the tolerance of
:func:`~tl_idempotence.core.factors.rank_rtol`) are refused: ``R_O`` or ``R_V`` has no inverse and the principal
frame of the missing directions is arbitrary.

Both report ``rel_change = ‖T - T'‖_F / ‖T‖_F`` (r x r form: ``‖O A Vᵀ‖² = tr(Aᵀ G_O A G_V)`` with
``A = I - N``) and the edited head's ``α'`` and ``P'`` (:func:`~tl_idempotence.maths.closure.closure` of the pair
``(V, (O N)ᵀ)``, a check: ``α' = α`` and ``P' = 1`` for closure-only, ``α' = P' = 0`` for closure-free).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ..core.factors import rank_rtol
from ..core.heads import LayerHeads
from ..errors import OptionError
from .closure import Closure, closure

__all__ = [
    "CLOSURE_ONLY_RCOND",
    "FREE_GRADIENT_TOL",
    "FREE_G_TOL",
    "FREE_MAX_ITER",
    "FreeSolution",
    "OVEdits",
    "PrincipalFrame",
    "closure_free_edits",
    "closure_only_edits",
    "edit_change",
    "nearest_closure_free",
    "principal_frame",
]

#: ``M = Vᵀ O`` with ``σ_min <= CLOSURE_ONLY_RCOND · σ_max`` has no closure-only version (module docstring).
CLOSURE_ONLY_RCOND = 1e-6
#: ``|g(Y)|`` at which the retraction stops, for ``‖Y‖ = 1`` (so ``|g(K')| <= FREE_G_TOL ‖K‖³``).
FREE_G_TOL = 1e-13
#: Riemannian gradient norm (relative to ``‖K‖``) at which the closure-free search stops.
FREE_GRADIENT_TOL = 1e-6
#: Conjugate-gradient steps before the closure-free search gives up (the head is refused).
FREE_MAX_ITER = 5000
_NEWTON_STEPS = 60
#: Lines from ``K`` searched for a first point of the cone (fixed seed 0).
_START_LINES = 8


@dataclass(frozen=True)
class OVEdits:
    """The edits of one layer's heads (module docstring). Heads refused have NaN ``N`` and a ``reason``.

    Attributes:
        variant: ``"closure_only"`` or ``"closure_free"``.
        layer: the layer.
        N: ``[n_heads, d_head, d_head]`` float64, CPU: the map ``z <- z Nᵀ`` (``T' = O N Vᵀ``).
        rel_change: ``[n_heads]`` ``‖T - T'‖_F / ‖T‖_F`` (dimensionless; NaN where refused).
        alpha: ``[n_heads]`` the head's closure scale α (SPEC 2; the weights' units).
        alpha_after, P_after: ``[n_heads]`` α and P of ``T'`` (computed from ``O N`` and ``V``).
        iterations: ``[n_heads]`` int64 steps of the closure-free search (0 for closure-only).
        reason: ``[n_heads]`` object: "" where ``N`` is defined, otherwise why not.
    """

    variant: str
    layer: int
    N: Float[Tensor, "n_heads r r"]
    rel_change: Float[Tensor, " n_heads"]
    alpha: Float[Tensor, " n_heads"]
    alpha_after: Float[Tensor, " n_heads"]
    P_after: Float[Tensor, " n_heads"]
    iterations: np.ndarray
    reason: np.ndarray


@dataclass(frozen=True)
class PrincipalFrame:
    """One head's principal-coordinate factors (SPEC 3), float64: ``O = Q_O R_O``, ``V = Q_V R_V``,
    ``K = R_O R_Vᵀ`` (``[r, r]``), ``D`` (``[r]``, cosines of the principal angles, descending), the numerical
    ranks of ``O`` and ``V``. ``Q_O``, ``Q_V`` are not kept (``d_model x r``; only tests form them)."""

    R_O: Float[Tensor, "r r"]
    R_V: Float[Tensor, "r r"]
    K: Float[Tensor, "r r"]
    D: Float[Tensor, " r"]
    rank_O: int
    rank_V: int


@dataclass(frozen=True)
class FreeSolution:
    """:func:`nearest_closure_free`'s answer: ``K_free`` ``[r, r]`` (NaN when not converged), the steps, the last
    Riemannian gradient norm (relative to ``‖K‖``), ``g(K_free) / ‖K‖³``, and ``reason`` ("" when converged)."""

    K_free: np.ndarray
    iterations: int
    gradient_norm: float
    g_rel: float
    reason: str


def principal_frame(O: Float[Tensor, "d r"], V: Float[Tensor, "d r"]) -> PrincipalFrame:
    """Principal-coordinate factors of one head (module docstring; SPEC 3), by thin QR in float64.

    Args:
        O, V: ``[d_model, d_head]`` column-form output write and value read (any float dtype).

    Returns:
        :class:`PrincipalFrame`. Ranks use :func:`~tl_idempotence.core.factors.rank_rtol` on the singular values of
        ``R_O`` and ``R_V`` (those of ``O`` and ``V``).

    Raises:
        Nothing of its own (the caller checked the weights).
    """
    O64, V64 = O.detach().to("cpu", torch.float64), V.detach().to("cpu", torch.float64)
    Q_O, R_O = torch.linalg.qr(O64)
    Q_V, R_V = torch.linalg.qr(V64)
    U, S, Wh = torch.linalg.svd(Q_V.T @ Q_O)  # Q_Vᵀ Q_O = U S Wh, W = Whᵀ
    R_O, R_V = Wh @ R_O, U.T @ R_V
    rtol = rank_rtol(O.shape[0], O.shape[1])
    ranks = []
    for R in (R_O, R_V):
        s = torch.linalg.svdvals(R)
        ranks.append(int(((s > rtol * s.max()) & (s.max() > 0)).sum()))
    return PrincipalFrame(R_O=R_O, R_V=R_V, K=R_O @ R_V.T, D=S, rank_O=ranks[0], rank_V=ranks[1])


def _g(K: np.ndarray, d: np.ndarray) -> float:
    """``⟨K D K, K⟩`` for ``D = diag(d)``."""
    return float(np.sum(((K * d) @ K) * K))


def _grad(K: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``∇g = K D K + K Kᵀ D + D Kᵀ K``."""
    return (K * d) @ K + (K @ K.T) * d[None, :] + d[:, None] * (K.T @ K)


def _retract(Y: np.ndarray, d: np.ndarray) -> np.ndarray | None:
    """Newton steps on ``g`` along ``∇g`` until ``|g| <= FREE_G_TOL ‖Y‖³``, then ``Y / ‖Y‖``; None when they do not
    converge (the step is too long)."""
    for _ in range(_NEWTON_STEPS):
        n = float(np.linalg.norm(Y))
        if not np.isfinite(n) or n == 0:
            return None
        gv = _g(Y, d)
        if abs(gv) <= FREE_G_TOL * n**3:
            return Y / n
        G = _grad(Y, d)
        Y = Y - (gv / float(np.sum(G * G))) * G
    return None


def _tangent(Y: np.ndarray, d: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``X`` projected onto the tangent space of ``{‖Y‖ = 1, g = 0}`` at ``Y`` (orthogonal to ``Y`` and ``∇g(Y)``;
    the two are orthogonal on the cone: ``⟨∇g(Y), Y⟩ = 3 g(Y) = 0``)."""
    G = _grad(Y, d)
    X = X - float(np.sum(X * Y)) * Y
    gg = float(np.sum(G * G))
    return X - (float(np.sum(X * G)) / gg) * G if gg > 0 else X


def _line_roots(Y: np.ndarray, X: np.ndarray, d: np.ndarray) -> list[float]:
    """The real roots ``t`` of the cubic ``g(Y + t X) = g(Y) + t ⟨∇g(Y), X⟩ + t² ⟨∇g(X), Y⟩ + t³ g(X)``."""
    coef = [_g(X, d), float(np.sum(_grad(X, d) * Y)), float(np.sum(_grad(Y, d) * X)), _g(Y, d)]
    if not np.isfinite(coef).all() or not any(coef[:3]):
        return []
    roots = np.roots(np.trim_zeros(np.asarray(coef), "f"))
    return [float(t.real) for t in roots if abs(t.imag) <= 1e-9 * max(1.0, abs(t))]


def _start(Kn: np.ndarray, d: np.ndarray) -> np.ndarray | None:
    """A unit point of the cone near the unit ``Kn`` to start the search from: the best (largest ``⟨Kn, Y⟩``) of
    the Newton retraction of ``Kn`` and the nearest roots of ``g`` on lines from ``Kn`` along
    :data:`_START_LINES` directions orthogonal to it (fixed seed), each polished by the retraction. The lines
    matter where the retraction fails: ``K = a I`` with ``D = I`` (an exactly closed, orthogonal head) has
    ``∇g ∝ K``, and Newton steps along it only shrink ``K`` towards 0."""
    cands = []
    Y = _retract(Kn.copy(), d)
    if Y is not None:
        cands.append(Y)
    rng = np.random.default_rng(0)
    for _ in range(_START_LINES):
        X = rng.standard_normal(Kn.shape)
        X -= float(np.sum(X * Kn)) * Kn
        X /= float(np.linalg.norm(X))
        for t in sorted(_line_roots(Kn, X, d), key=abs)[:2]:
            Y = _retract(Kn + t * X, d)
            if Y is not None:
                cands.append(Y)
    if not cands:
        return None
    cands = [Y if float(np.sum(Y * Kn)) >= 0 else -Y for Y in cands]  # g is odd: -Y is on the cone too
    return max(cands, key=lambda Y: float(np.sum(Y * Kn)))


def nearest_closure_free(K: np.ndarray, D: np.ndarray, max_iter: int = FREE_MAX_ITER) -> FreeSolution:
    """The nearest ``K'`` to ``K`` (Frobenius) with ``⟨K' D K', K'⟩ = 0`` (module docstring: a cone; Riemannian
    conjugate gradients for the unit ``Y`` maximizing ``⟨K, Y⟩``, then ``K' = ⟨K, Y⟩ Y``).

    Args:
        K: ``[r, r]`` principal-coordinate transport (SPEC 3), float64.
        D: ``[r]`` the diagonal of ``D``.
        max_iter: steps before giving up.

    Returns:
        :class:`FreeSolution` (``K_free`` ``= K`` when ``g(K)`` is already zero to :data:`FREE_G_TOL`).

    Raises:
        OptionError: ``K`` not square, ``D`` of another length, or ``K`` zero or not finite.
    """
    K = np.asarray(K, dtype=np.float64)
    d = np.asarray(D, dtype=np.float64)
    if K.ndim != 2 or K.shape[0] != K.shape[1] or d.shape != (K.shape[0],):
        raise OptionError(f"nearest_closure_free needs K [r, r] and D [r]; got {K.shape} and {d.shape}.")
    nK = float(np.linalg.norm(K))
    if not np.isfinite(nK) or nK == 0 or not np.isfinite(d).all():
        raise OptionError("nearest_closure_free needs a finite, nonzero K and a finite D.")
    Kn = K / nK
    nan = np.full_like(K, np.nan)
    Y = _start(Kn, d)
    if Y is None:
        return FreeSolution(nan, 0, float("nan"), float("nan"), "no point of g = 0 was found near K")
    G = _tangent(Y, d, Kn)
    P = G.copy()
    step, gn, it = 1.0, float(np.linalg.norm(G)), 0
    for it in range(max_iter):  # noqa: B007 - the count is reported
        gn = float(np.linalg.norm(G))
        if gn <= FREE_GRADIENT_TOL:
            break
        f, slope = float(np.sum(Kn * Y)), float(np.sum(G * P))
        if slope <= 0:  # not an ascent direction: restart from the gradient
            P, slope = G.copy(), gn * gn
        while True:
            Yn = _retract(Y + step * P, d)
            if Yn is not None and float(np.sum(Kn * Yn)) >= f + 1e-4 * step * slope:
                break
            step *= 0.5
            if step < 1e-14:
                # no ascent left at float64's resolution: stationary as far as can be told
                Yn = None
                break
        if Yn is None:
            break
        Gn = _tangent(Yn, d, Kn)
        beta = max(0.0, float(np.sum(Gn * (Gn - _tangent(Yn, d, G)))) / (gn * gn))
        P = Gn + beta * _tangent(Yn, d, P)
        Y, G, step = Yn, Gn, min(2 * step, 1e3)
    else:
        gn = float(np.linalg.norm(G))
    if gn > FREE_GRADIENT_TOL:
        return FreeSolution(
            nan, it, gn, float("nan"),
            f"the closure-free search did not converge (gradient norm {gn:.2g} > {FREE_GRADIENT_TOL:g} after "
            f"{it} steps)",
        )  # fmt: skip
    X = float(np.sum(Kn * Y)) * Y * nK
    return FreeSolution(X, it, gn, _g(X, d) / nK**3, "")


def edit_change(
    O: Float[Tensor, "d r"], V: Float[Tensor, "d r"], N: Float[Tensor, "r r"]
) -> tuple[float, float, float]:
    """``(‖T - T'‖_F / ‖T‖_F, α', P')`` of ``T' = O N Vᵀ`` against ``T = O Vᵀ`` (r x r form; module docstring).

    Raises:
        Nothing of its own: a zero ``T`` gives NaN.
    """
    O64, V64, N64 = (x.detach().to("cpu", torch.float64) for x in (O, V, N))
    G_O, G_V = O64.T @ O64, V64.T @ V64
    A = torch.eye(N64.shape[0], dtype=torch.float64) - N64
    nT2 = float((G_O * G_V).sum())
    diff2 = float(torch.trace(A.T @ G_O @ A @ G_V))
    rel = float(np.sqrt(max(diff2, 0.0) / nT2)) if nT2 > 0 else float("nan")
    c = closure((V64, (O64 @ N64).T), factors=False)
    return rel, float(c.alpha), float(c.P)


def _begin_edits(lh: LayerHeads, heads: list[int] | None, variant: str) -> tuple[list[int], Closure, dict]:
    """The layer's weights checked, the heads asked, its closure, and the fields of its :class:`OVEdits` before any
    head is edited (every head NaN with reason ``"not asked"``). Raises what ``check_finite`` and ``_heads`` do."""
    lh.check_finite()
    hs = _heads(lh, heads)
    c = closure(lh, factors=False)
    n, r = lh.n_heads, lh.d_head
    out = {
        "variant": variant,
        "layer": lh.layer,
        "N": torch.full((n, r, r), float("nan"), dtype=torch.float64),
        "rel_change": torch.full((n,), float("nan"), dtype=torch.float64),
        "alpha": c.alpha.clone(),
        "alpha_after": torch.full((n,), float("nan"), dtype=torch.float64),
        "P_after": torch.full((n,), float("nan"), dtype=torch.float64),
        "iterations": np.zeros(n, dtype=np.int64),
        "reason": np.full(n, "not asked", dtype=object),
    }
    return hs, c, out


def _finish(out: dict, lh: LayerHeads, h: int, N: Tensor) -> None:
    O, V = lh.O[h], lh.V[int(lh.kv_head_of[h])]
    rel, a2, p2 = edit_change(O, V, N)
    out["N"][h], out["rel_change"][h], out["alpha_after"][h], out["P_after"][h] = N, rel, a2, p2


def _heads(lh: LayerHeads, heads: list[int] | None) -> list[int]:
    hs = list(range(lh.n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in hs if not 0 <= h < lh.n_heads]
    if bad:
        raise OptionError(f"heads {bad} are not heads of layer {lh.layer} (it has {lh.n_heads}).")
    return hs


def closure_only_edits(lh: LayerHeads, heads: list[int] | None = None) -> OVEdits:
    """``N = α M⁻¹`` for each head of a layer (module docstring, closure-only; SPEC 2).

    Args:
        lh: the layer (column form; GQA: each query head with its kv head's ``V``).
        heads: the heads to edit (None: all); the others are NaN with reason ``"not asked"``.

    Returns:
        :class:`OVEdits` (``variant="closure_only"``).

    Raises:
        OptionError: a head outside the layer. WeightError: non-finite weights (names the head).
    """
    hs, c, out = _begin_edits(lh, heads, "closure_only")
    for h in hs:
        alpha = float(c.alpha[h])
        if not np.isfinite(alpha) or alpha == 0:
            out["reason"][h] = f"α = {alpha:g} ({c.reason[h] or 'nilpotent head'}): no closure-only version"
            continue
        O = lh.O[h].detach().to("cpu", torch.float64)
        V = lh.V[int(lh.kv_head_of[h])].detach().to("cpu", torch.float64)
        M = V.T @ O
        s = torch.linalg.svdvals(M)
        if not bool(s[-1] > CLOSURE_ONLY_RCOND * s[0]):
            out["reason"][h] = (
                f"M = VᵀO is singular or ill-conditioned (σ_min/σ_max = {float(s[-1] / s[0]):.3g} <= "
                f"{CLOSURE_ONLY_RCOND:g}): no closure-only version"
            )
            continue
        out["reason"][h] = ""
        _finish(out, lh, h, alpha * torch.linalg.inv(M))
    return OVEdits(**out)


def closure_free_edits(lh: LayerHeads, heads: list[int] | None = None, max_iter: int = FREE_MAX_ITER) -> OVEdits:
    """``N = R_O⁻¹ K' R_V⁻ᵀ`` with ``K'`` the nearest closure-free transport, for each head of a layer (module
    docstring, closure-free; SPEC 3).

    Args:
        lh: the layer (column form; GQA: each query head with its kv head's ``V``).
        heads: the heads to edit (None: all); the others are NaN with reason ``"not asked"``.
        max_iter: steps of :func:`nearest_closure_free` before a head is refused.

    Returns:
        :class:`OVEdits` (``variant="closure_free"``; ``iterations`` the search's steps).

    Raises:
        OptionError: a head outside the layer. WeightError: non-finite weights (names the head).
    """
    hs, _, out = _begin_edits(lh, heads, "closure_free")
    r = lh.d_head
    for h in hs:
        fr = principal_frame(lh.O[h], lh.V[int(lh.kv_head_of[h])])
        if min(fr.rank_O, fr.rank_V) < r:
            out["reason"][h] = (
                f"rank-deficient head (rank O = {fr.rank_O}, rank V = {fr.rank_V} < d_head = {r}): the closure-free "
                "version is defined for full-rank heads only"
            )
            continue
        sol = nearest_closure_free(fr.K.numpy(), fr.D.numpy(), max_iter=max_iter)
        out["iterations"][h] = sol.iterations
        if sol.reason:
            out["reason"][h] = sol.reason
            continue
        out["reason"][h] = ""
        Kf = torch.from_numpy(sol.K_free)
        A = torch.linalg.solve(fr.R_O, Kf)  # R_O⁻¹ K'
        N = torch.linalg.solve(fr.R_V, A.T).T  # (R_O⁻¹ K') R_V⁻ᵀ
        _finish(out, lh, h, N)
    return OVEdits(**out)
