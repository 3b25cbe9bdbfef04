"""The paper's null controls (SPEC section 4): orientation scramble and matched O/V mismatch.

Orientation scramble (SPEC 4b)
------------------------------
In principal coordinates a head is ``T = Q_O K Q_Vᵀ`` and ``T² = Q_O (K D K) Q_Vᵀ``
with ``D = diag(cos θ)`` (SPEC 3). Write the SVD ``K = U S Wᵀ``. The scramble keeps
``Q_O, Q_V, D`` and ``S`` and replaces the orientation: ``K~ = R₁ S R₂ᵀ`` with
independent Haar-random ``R₁ ∈ O(rank_O)`` (acting on the O-side principal
coordinates) and ``R₂ ∈ O(rank_V)`` (V side). So singular values, ``‖T‖``, the factor
spans and the principal angles are all unchanged; only the orientation moves.

Because the Q's are isometries, ``P(T~)`` needs only ``S``, the cosines and
``X = R₂ᵀ D R₁`` (``r x r``)::

    ⟨K~DK~, K~⟩ = Σ_i s_i³ X_ii
    ‖K~DK~‖²    = Σ_ij s_i² s_j² X_ij²
    ‖K~‖²       = Σ_i s_i²

so one draw costs one ``r x r`` matrix product (plus its share of the Haar sampling).

Haar sampler: ``torch.linalg.qr`` of a standard Gaussian matrix with the sign fix
``Q ← Q · diag(sign(diag R))`` (Mezzadri 2007, "How to generate random matrices from
the classical compact groups"); without the sign fix QR is not Haar. float64.

Draw design (documented choice, ours): for every layer and every rank pair
``(rank_O, rank_V)`` present in it, a pool of ``n_draws`` Haar matrices for each side
is sampled once; head ``h`` uses draws ``j = 1..n`` with ``R₁ = pool_O[j]`` and
``R₂ = pool_V[σ_h(j)]`` for a random permutation ``σ_h`` per head. For one head the n
pairs are therefore i.i.d. Haar x Haar (exact null, exact p-values); different heads
re-pair the same pools, which costs ``O(n)`` QRs per layer instead of ``O(n_heads · n)``
(with independent draws per head the QRs, not the products, dominate: ~4x slower). Everything is seeded by
``(seed, layer)`` through :func:`layer_generator`, so a layer's numbers do not
depend on which other layers were run, and are the same on any machine with the
same torch version.

Matched O/V mismatch (SPEC 4a)
------------------------------
``T_ig = O_i V_gᵀ`` for every query head ``i`` and every kv head ``g ≠ kv(i)`` of the
same layer: each distinct product once (MHA: ``n(n-1)`` ordered pairs; GQA: pairs
only across kv groups; MQA: none). Computed factored from the Gram products
(``G_O``, ``G_V`` per kv head, ``V_gᵀ O_i``), never forming ``d_model x d_model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .heads import LayerHeads, head_source
from .linalg import Closure, Grams, closure_from_grams, layer_grams

if TYPE_CHECKING:  # pragma: no cover
    import plotly.graph_objects as go

    from .report import IdempotenceReport

__all__ = [
    "MismatchResult",
    "Scramble",
    "haar_orthogonal",
    "layer_generator",
    "mismatch",
    "mismatch_layer",
    "mismatch_pairs",
    "orientation_scramble",
    "paper_table",
    "scramble_figures",
    "scramble_layer",
    "summarize_controls",
]

#: Elements per batched tensor chunk ([heads, draws, r, r]); bounds memory at ~32 MB a tensor.
_CHUNK_ELEMS = 1 << 22

_TAGS = {"scramble": 1, "search": 2}


# --------------------------------------------------------------------------- sampling


def layer_generator(seed: int, layer: int | None, tag: str = "scramble", *extra: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``(seed, layer, tag, *extra)``.

    The 64-bit seed comes from ``numpy.random.SeedSequence`` (a documented,
    platform-independent hash), so the same arguments give the same stream on any
    machine; Python's ``hash`` is not used.

    Args:
        seed: the user's seed (non-negative int).
        layer: layer index, or ``None`` outside a model (treated as -1).
        tag: which analysis ("scramble" or "search"), so they never share a stream.
        extra: more non-negative ints to mix in (e.g. a rank pair).

    Raises:
        ValueError: negative seed.
    """
    if int(seed) < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}.")
    entropy = [int(seed), 0 if layer is None else int(layer) + 1, _TAGS[tag], *[int(e) for e in extra]]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    s = (int(state[0]) << 31) ^ int(state[1])
    return torch.Generator(device="cpu").manual_seed(s & ((1 << 63) - 1))


def haar_orthogonal(n: int, r: int, gen: torch.Generator, dtype: torch.dtype = torch.float64) -> Float[Tensor, "n r r"]:
    """``n`` independent Haar-distributed matrices in ``O(r)``.

    QR of a standard Gaussian ``r x r`` matrix with the sign fix
    ``Q ← Q diag(sign(diag R))`` (Mezzadri 2007), batched (one LAPACK call).

    Args:
        n: number of matrices (>= 0).
        r: size (>= 1).
        gen: CPU generator (see :func:`layer_generator`).

    Returns:
        ``[n, r, r]`` orthogonal matrices, ``dtype`` (float64 default).
    """
    Z = torch.randn(n, r, r, generator=gen, dtype=dtype)
    Q, R = torch.linalg.qr(Z)
    d = R.diagonal(dim1=-2, dim2=-1)
    sign = torch.where(d < 0, -torch.ones_like(d), torch.ones_like(d))
    return Q * sign.unsqueeze(-2)


def _embed(Q: Tensor, r: int) -> Tensor:
    """Embed ``[n, k, k]`` orthogonal matrices as ``blockdiag(Q, I_{r-k})``."""
    n, k, _ = Q.shape
    if k == r:
        return Q
    out = torch.eye(r, dtype=Q.dtype).expand(n, r, r).clone()
    out[:, :k, :k] = Q
    return out


# --------------------------------------------------------------------------- factors


@dataclass(frozen=True)
class _Factors:
    """What the orientation-only controls need per head (flattened batch)."""

    S: Tensor  # [b, r] singular values of K (= of T), descending, zeros beyond rank
    cos: Tensor  # [b, r] principal cosines (closure's D)
    rank_O: Tensor  # [b]
    rank_V: Tensor  # [b]
    P: Tensor  # [b] trained P
    K: Tensor  # [b, r, r] trained K (principal coordinates)
    rtol: float
    reason: np.ndarray  # [b] "" where the scramble is defined


def _factors(c: Closure) -> _Factors:
    if c.K is None or c.D is None:
        raise ValueError("The Closure has no K/D factors: compute it with closure_from_grams(g, factors=True) "
                         "or tli.closure(..., factors=True).")
    r = c.K.shape[-1]
    K = c.K.reshape(-1, r, r)
    cos = c.D.reshape(-1, r)
    S = torch.linalg.svdvals(K)
    # K has rank <= min(rank_O, rank_V): singular values beyond are rounding noise; zero them so
    # every scrambled K~ = R1 S R2ᵀ stays exactly inside the rank blocks.
    k = torch.minimum(c.rank_O, c.rank_V).reshape(-1, 1)
    S = torch.where(torch.arange(r) < k, S, torch.zeros_like(S))
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
            # Trained head nilpotent: the scramble is defined, the comparison is not.
            reason[i] = f"trained P undefined ({reason[i]})"
    return _Factors(S=S, cos=cos, rank_O=c.rank_O.reshape(-1), rank_V=c.rank_V.reshape(-1), P=P, K=K,
                    rtol=c.rtol, reason=reason)


def _factors_from_grams(g: Grams, c: Closure, need_K: bool = False) -> _Factors:
    """:class:`_Factors` straight from the Gram products (no eigenvalues of M, no full SVD
    unless ``need_K``): the same principal-coordinate construction as
    :func:`~tl_idempotence.linalg.closure_from_grams`, with ``c``'s tolerance and P."""
    from .linalg import principal_factors

    rtol = c.rtol
    K, D, rank_O, rank_V = principal_factors(g, rtol, principal_K=need_K)
    cf = Closure(alpha=c.alpha, P=c.P, norm=c.norm, norm_T2=c.norm_T2, inner=c.inner, rank_O=rank_O,
                 rank_V=rank_V, rtol=rtol, reason=c.reason, K=K, D=D)
    return _factors(cf)


def _P_from_X(s: Tensor, X: Tensor, rtol: float) -> Tensor:
    """P of ``K = R₁ S R₂ᵀ`` from ``X = R₂ᵀ D R₁`` (see module docstring).

    Args:
        s: ``[..., r]`` singular values (broadcast against X's leading dims).
        X: ``[..., r, r]``.

    Returns:
        ``[...]`` P, NaN where ``‖K D K‖ <= rtol ‖K‖²`` (nilpotent orientation).
    """
    return _P_from_Z(s, s.unsqueeze(-1) * X, rtol)


def _P_from_Z(s: Tensor, Z: Tensor, rtol: float) -> Tensor:
    """Same as :func:`_P_from_X` from ``Z = diag(s) X``:
    ``⟨KDK, K⟩ = Σ_i s_i² Z_ii`` and ``‖KDK‖² = Σ_ij Z_ij² s_j²``."""
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
    """
    K = K.double()
    KDK = (K * D.double().unsqueeze(-2)) @ K
    inner = (KDK * K).sum((-1, -2))
    return inner**2 / ((KDK * KDK).sum((-1, -2)) * (K * K).sum((-1, -2)))


# --------------------------------------------------------------------------- scramble core


def _scramble_draws(
    f: _Factors, n_draws: int, seed: int, layer: int | None, return_K: bool
) -> tuple[Tensor, Tensor | None]:
    """P of ``n_draws`` scrambled orientations per head -> ``([b, n], K~ [b, n, r, r] or None)``."""
    b, r = f.S.shape
    P = torch.full((b, n_draws), float("nan"), dtype=torch.float64)
    Kd = torch.zeros((b, n_draws, r, r), dtype=torch.float64) if return_K else None
    ok = np.array([not str(x) or str(x).startswith("trained P undefined") for x in f.reason])
    if not ok.any():
        return P, Kd
    pairs = torch.stack([f.rank_O, f.rank_V], -1)
    groups = sorted({tuple(p) for p in pairs[torch.from_numpy(ok)].tolist()})
    for rO, rV in groups:
        idx = ((pairs[:, 0] == rO) & (pairs[:, 1] == rV) & torch.from_numpy(ok)).nonzero().flatten()
        gen = layer_generator(seed, layer, "scramble", rO, rV)
        pool_O = _embed(haar_orthogonal(n_draws, rO, gen), r)  # R1 ∈ O(rank_O) ⊕ I
        pool_V = _embed(haar_orthogonal(n_draws, rV, gen), r)  # R2 ∈ O(rank_V) ⊕ I
        # Head h pairs R1 = pool_O[j] with R2 = pool_V[perm_h[j]]: i.i.d. Haar pairs for each head.
        perm_V = torch.rand(len(idx), n_draws, generator=gen, dtype=torch.float64).argsort(-1)
        pool_Vt = pool_V.transpose(-1, -2).contiguous()
        hc = max(1, _CHUNK_ELEMS // (n_draws * r * r))
        for a in range(0, len(idx), hc):
            sel = idx[a : a + hc]
            s = f.S[sel]  # [hc, r]
            # Z = diag(s) R2ᵀ D R1 = diag(s) X  (one product per draw; R1 broadcast, not copied)
            L = pool_Vt[perm_V[a : a + hc]]  # [hc, n, r, r] = R2ᵀ
            L.mul_((s.unsqueeze(-1) * f.cos[sel].unsqueeze(-2)).unsqueeze(1))
            Z = torch.matmul(L, pool_O)
            del L
            P[sel] = _P_from_Z(s.unsqueeze(1), Z, f.rtol)
            if return_K:
                R2 = pool_V[perm_V[a : a + hc]]
                Kd[sel] = (pool_O * s.unsqueeze(1).unsqueeze(-2)) @ R2.transpose(-1, -2)
                del R2
            del Z
    return P, Kd


def _summarize_draws(P_trained: Tensor, Pd: Tensor) -> dict[str, np.ndarray]:
    Pd_np = Pd.numpy()
    Pt = P_trained.numpy()
    valid = np.isfinite(Pd_np)
    n_valid = valid.sum(-1)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(Pd_np, axis=-1)
            q95 = np.nanquantile(Pd_np, 0.95, axis=-1)
        ge = (np.where(valid, Pd_np, -np.inf) >= Pt[:, None]).sum(-1)
        p = (1.0 + ge) / (n_valid + 1.0)
    defined = np.isfinite(Pt) & (n_valid > 0)
    p = np.where(defined, p, np.nan)
    beats = defined & (Pt > np.nan_to_num(med, nan=np.inf))
    return {
        "P_scrambled_median": med,
        "P_scrambled_q95": q95,
        "p_value": p,
        "beats_scramble": beats,
        "n_scramble_draws": n_valid.astype(np.int64),
    }


@dataclass(frozen=True)
class Scramble:
    """Orientation-scramble draws for a batch of heads (SPEC 4b). float64, CPU.

    Attributes:
        P: trained P, ``[*batch]``.
        P_draws: P of each scrambled orientation, ``[*batch, n_draws]`` (NaN for a
            nilpotent draw or an undefined head).
        P_scrambled_median, P_scrambled_q95: per head, ``[*batch]``.
        p_value: ``(1 + #{P~ >= P}) / (n + 1)`` over the defined draws, ``[*batch]``.
        beats_scramble: ``P > P_scrambled_median``, ``[*batch]`` bool (False when undefined).
        S: singular values of K (= of T), ``[*batch, r]``, kept by every draw.
        D: principal cosines, ``[*batch, r]``, kept by every draw.
        rank_O, rank_V: numerical ranks; ``R₁`` acts on the first ``rank_O`` O-side
            principal coordinates, ``R₂`` on the first ``rank_V`` V-side ones.
        K_draws: ``[*batch, n_draws, r, r]`` scrambled ``K~ = R₁ S R₂ᵀ`` in principal
            coordinates (``T~ = Q_O K~ Q_Vᵀ`` with ``Q_Vᵀ Q_O = diag(D)``), or ``None``.
        reason: ``[*batch]`` object array, "" where everything is defined.
    """

    P: Tensor
    P_draws: Tensor
    P_scrambled_median: Tensor
    P_scrambled_q95: Tensor
    p_value: Tensor
    beats_scramble: Bool[Tensor, "*batch"]
    S: Tensor
    D: Tensor
    rank_O: Int[Tensor, "*batch"]
    rank_V: Int[Tensor, "*batch"]
    K_draws: Tensor | None
    reason: np.ndarray

    def table(self) -> pd.DataFrame:
        """One row per head (flattened batch) with the per-head summary columns."""
        return pd.DataFrame(
            {
                "P": self.P.reshape(-1).numpy(),
                "P_scrambled_median": self.P_scrambled_median.reshape(-1).numpy(),
                "P_scrambled_q95": self.P_scrambled_q95.reshape(-1).numpy(),
                "p_value": self.p_value.reshape(-1).numpy(),
                "beats_scramble": self.beats_scramble.reshape(-1).numpy(),
                "scramble_reason": self.reason.reshape(-1).astype(str),
            }
        )


def _closure_of(x: Any, compute_dtype: torch.dtype = torch.float64) -> tuple[Closure, int | None]:
    """A factored Closure from a Closure / LayerHeads / (W_V, W_O) / FactoredMatrix."""
    if isinstance(x, Closure):
        return x, None
    if isinstance(x, LayerHeads):
        return closure_from_grams(layer_grams(x.O, x.V, x.kv_head_of, compute_dtype=compute_dtype), factors=True), x.layer
    from .linalg import closure

    return closure(x, factors=True, compute_dtype=compute_dtype), None


def orientation_scramble(
    x: Any,
    n_draws: int = 64,
    seed: int = 0,
    *,
    layer: int | None = None,
    return_K: bool = True,
) -> Scramble:
    """Orientation-scramble null for a batch of heads (SPEC 4b; paper: trained median P
    0.336 vs scrambled 1.04e-4 over 7,304 heads).

    Args:
        x: a :class:`~tl_idempotence.linalg.Closure` with factors (``tli.closure(...)``),
            a :class:`~tl_idempotence.heads.LayerHeads`, a TransformerLens
            ``FactoredMatrix`` (``model.OV``) or a ``(W_V, W_O)`` pair in TL row form
            (``[*batch, d_model, d_head]`` / ``[*batch, d_head, d_model]``).
        n_draws: Haar draws per head (>= 1).
        seed: non-negative seed; with ``layer`` it seeds the generator (see
            :func:`layer_generator`). A LayerHeads supplies its own layer.
        layer: layer index mixed into the seed (``None`` when not from a model).
        return_K: also return the scrambled ``K~`` (``[*batch, n, r, r]`` float64).

    Returns:
        :class:`Scramble`.

    Raises:
        ValueError: ``n_draws < 1``, negative seed, a Closure without factors, bad shapes.
        TypeError: an unsupported input.
    """
    if int(n_draws) < 1:
        raise ValueError(f"n_draws must be >= 1, got {n_draws}.")
    c, lay = _closure_of(x)
    layer = lay if layer is None else layer
    f = _factors(c)
    Pd, Kd = _scramble_draws(f, int(n_draws), seed, layer, return_K)
    summ = _summarize_draws(f.P, Pd)
    shape = tuple(c.P.shape)
    r = f.S.shape[-1]

    def sh(a: Any, *tail: int) -> Tensor:
        return torch.as_tensor(np.asarray(a) if not isinstance(a, Tensor) else a).reshape(*shape, *tail)

    return Scramble(
        P=sh(f.P),
        P_draws=sh(Pd, int(n_draws)),
        P_scrambled_median=sh(summ["P_scrambled_median"]),
        P_scrambled_q95=sh(summ["P_scrambled_q95"]),
        p_value=sh(summ["p_value"]),
        beats_scramble=sh(summ["beats_scramble"]),
        S=sh(f.S, r),
        D=sh(f.cos, r),
        rank_O=sh(f.rank_O),
        rank_V=sh(f.rank_V),
        K_draws=None if Kd is None else Kd.reshape(*shape, int(n_draws), r, r),
        reason=f.reason.reshape(shape),
    )


def scramble_layer(lh: LayerHeads, g: Grams, c: Closure, n_draws: int, seed: int, threshold: float) -> pd.DataFrame:
    """Per-head scramble columns for one layer (report contract, SPEC 4b).

    Args:
        lh: the layer's heads (only ``lh.layer`` is used: the generator is seeded by
            ``(seed, layer)``).
        g: the layer's Gram products (batch ``[n_heads]``).
        c: the layer's closure (with or without factors; recomputed with factors
            from ``g`` if needed).
        n_draws: Haar draws per head (>= 1).
        seed: non-negative seed.
        threshold: P threshold; adds ``frac_scrambled_closed`` (fraction of draws >= it).

    Returns:
        DataFrame, one row per query head in order: ``P_scrambled_median,
        P_scrambled_q95, p_value, beats_scramble, n_scramble_draws,
        frac_scrambled_closed, scramble_reason``.
    """
    if int(n_draws) < 1:
        raise ValueError(f"n_draws must be >= 1, got {n_draws}.")
    f = _factors(c) if c.K is not None else _factors_from_grams(g, c)
    Pd, _ = _scramble_draws(f, int(n_draws), seed, lh.layer, return_K=False)
    summ = _summarize_draws(f.P, Pd)
    Pd_np = Pd.numpy()
    with np.errstate(invalid="ignore"):
        frac = np.where(np.isfinite(Pd_np), Pd_np >= threshold, False).sum(-1) / np.maximum(summ["n_scramble_draws"], 1)
    df = pd.DataFrame(summ)
    df["frac_scrambled_closed"] = frac
    df["scramble_reason"] = f.reason.astype(str)
    return df


# --------------------------------------------------------------------------- mismatch


def mismatch_pairs(
    lh: LayerHeads, compute_dtype: torch.dtype = torch.float64, g: Grams | None = None
) -> tuple[pd.DataFrame, str]:
    """Every distinct mismatched product ``T_ig = O_i V_gᵀ``, ``g ≠ kv(i)``, of one layer (SPEC 4a).

    Args:
        lh: the layer's heads (``O [n_heads, d_model, d_head]``, unexpanded ``V [n_kv, ...]``).
        compute_dtype: dtype of the ``d_model``-long products (float64 default).
        g: the layer's :class:`~tl_idempotence.linalg.Grams` if already computed (reuses
            ``G_O`` and ``G_V``; only the cross products ``V_gᵀ O_i`` are new).

    Returns:
        ``(table, note)``: one row per pair with ``layer, head, kv_head, v_head, alpha,
        P, norm, reason`` (``head`` = i, ``kv_head`` = kv(i), ``v_head`` = g), ordered by
        ``v_head`` then ``head``; ``note`` is "" or why there is no valid pair.

    Cost: one GEMM ``[n_kv·r, d] @ [d, n·r]`` (chunked over query heads), i.e. ``2 d r²``
    flops per (query head, kv head), plus ``r x r`` algebra per pair.
    """
    kv = lh.kv_head_of.long()
    cols = ["layer", "head", "kv_head", "v_head", "alpha", "P", "norm", "reason"]
    if lh.n_kv_heads < 2:
        note = "no valid pair: one kv head (MQA), every query head reads the same V"
        return pd.DataFrame({k: [] for k in cols}), note
    n, d, r, nkv = lh.n_heads, lh.d_model, lh.d_head, lh.n_kv_heads
    Vc = lh.V.to(compute_dtype)
    if g is not None:
        G_O = g.G_O
        first = torch.stack([(kv == gk).nonzero().flatten()[0] for gk in range(nkv)])
        G_V = g.G_V[first]
    else:
        Oc = lh.O.to(compute_dtype)
        G_O = (Oc.transpose(-1, -2) @ Oc).to(torch.float64)
        G_V = (Vc.transpose(-1, -2) @ Vc).to(torch.float64)
        del Oc
    input_dtype = torch.promote_types(lh.O.dtype, lh.V.dtype)
    Vt = Vc.transpose(-1, -2).reshape(nkv * r, d)
    M = torch.empty(nkv, n, r, r, dtype=torch.float64)  # M[g, i] = V_gᵀ O_i
    hc = max(1, _CHUNK_ELEMS // (d * r))
    for a in range(0, n, hc):
        Of = lh.O[a : a + hc].to(compute_dtype).permute(1, 0, 2).reshape(d, -1)
        M[:, a : a + hc] = (Vt @ Of).reshape(nkv, r, -1, r).permute(0, 2, 1, 3).to(torch.float64)
        del Of
    gi, hi = (kv.unsqueeze(0) != torch.arange(nkv).unsqueeze(1)).nonzero(as_tuple=True)  # ordered by g, then head
    cl = closure_from_grams(
        Grams(G_O=G_O[hi], G_V=G_V[gi], M=M[gi, hi], d_model=d, input_dtype=input_dtype)
    )
    tab = pd.DataFrame(
        {
            "layer": lh.layer,
            "head": hi.numpy(),
            "kv_head": kv[hi].numpy(),
            "v_head": gi.numpy(),
            "alpha": cl.alpha.numpy(),
            "P": cl.P.numpy(),
            "norm": cl.norm.numpy(),
            "reason": cl.reason.astype(str),
        }
    )
    return tab, ""


def _mismatch_summary(tab: pd.DataFrame, note: str, threshold: float) -> dict[str, Any]:
    P = tab["P"].to_numpy(dtype=float)
    fin = P[np.isfinite(P)]
    return {
        "n_mismatch_pairs": int(len(tab)),
        "mismatch_P_max": float(fin.max()) if fin.size else float("nan"),
        "mismatch_P_median": float(np.median(fin)) if fin.size else float("nan"),
        "n_mismatch_closed": int((fin >= threshold).sum()),
        "mismatch_note": note,
    }


def mismatch_layer(
    lh: LayerHeads, threshold: float, compute_dtype: torch.dtype = torch.float64, g: Grams | None = None
) -> dict[str, Any]:
    """Per-layer matched O/V mismatch summary (report contract, SPEC 4a). ``g``: the layer's
    Gram products if already computed (reused, see :func:`mismatch_pairs`).

    Returns:
        dict with ``n_mismatch_pairs, mismatch_P_max, mismatch_P_median,
        n_mismatch_closed`` (pairs with P >= threshold) and ``mismatch_note``
        ("" or why there is no pair, e.g. MQA).
    """
    tab, note = mismatch_pairs(lh, compute_dtype=compute_dtype, g=g)
    return _mismatch_summary(tab, note, threshold)


@dataclass(frozen=True)
class MismatchResult:
    """Result of :func:`mismatch`: ``pairs`` (one row per mismatched product, with
    ``closed``) and ``layers`` (one row per layer, the :func:`mismatch_layer` dict)."""

    pairs: pd.DataFrame
    layers: pd.DataFrame
    threshold: float


def mismatch(
    x: Any,
    threshold: float = 0.9,
    *,
    layers: list[int] | None = None,
    compute_dtype: torch.dtype = torch.float64,
    **source_kwargs: Any,
) -> MismatchResult:
    """Matched within-layer O/V mismatch control (SPEC 4a; paper: no mismatched pair reaches P >= 0.9).

    Args:
        x: a :class:`~tl_idempotence.heads.LayerHeads` or anything
            :func:`~tl_idempotence.heads.head_source` accepts (TransformerLens model,
            ``transformers`` model, checkpoint path, HeadSource).
        threshold: P threshold in [0, 1].
        layers: restrict to these layers (default: all attention layers).
        compute_dtype: dtype of the ``d_model``-long products.

    Returns:
        :class:`MismatchResult`.

    Raises:
        ValueError: threshold outside [0, 1], unknown layer.
        TypeError: unsupported ``x``.
    """
    if not (0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"threshold must be in [0, 1]; got {threshold}.")
    if isinstance(x, LayerHeads):
        lhs = [x]
    else:
        src = head_source(x, **source_kwargs)
        all_layers = list(src.layers())
        todo = all_layers if layers is None else list(layers)
        bad = [l for l in todo if l not in all_layers]
        if bad:
            raise ValueError(f"Unknown layer index {bad}: attention layers are {all_layers}.")
        lhs = (src.layer_heads(l) for l in todo)
    tabs, rows = [], []
    for lh in lhs:
        tab, note = mismatch_pairs(lh, compute_dtype=compute_dtype)
        tabs.append(tab)
        rows.append({"layer": lh.layer, **_mismatch_summary(tab, note, threshold)})
    pairs = pd.concat(tabs, ignore_index=True) if tabs else pd.DataFrame()
    if len(pairs):
        pairs["closed"] = np.nan_to_num(pairs["P"].to_numpy(dtype=float), nan=-1.0) >= threshold
    return MismatchResult(pairs=pairs, layers=pd.DataFrame(rows), threshold=float(threshold))


# --------------------------------------------------------------------------- report integration


def _nanmedian(a: Any) -> float:
    a = np.asarray(a, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else float("nan")


def summarize_controls(rep: "IdempotenceReport") -> None:
    """Add the controls' headline numbers to ``rep.summary`` (in place).

    Keys: ``median_P_trained``, ``median_P_scrambled`` (median over heads of each
    head's scramble median), ``n_heads_beating_scramble``, ``frac_beats_scramble``
    (over heads where the comparison is defined), ``n_layers_trained_wins``,
    ``layers_trained_loses``, ``n_mismatch_pairs``, ``n_mismatch_closed``,
    ``mismatch_P_max``; with ``search=True`` also ``n_feasible_layers`` and
    ``infeasible_layers``.
    """
    h, L, s = rep.heads, rep.layers, rep.summary
    if "feasible" in L.columns:
        feas = L["feasible"].to_numpy(dtype=bool)
        s["n_feasible_layers"] = int(feas.sum())
        s["infeasible_layers"] = [int(l) for l in L.loc[~feas, "layer"]]
    if "P_scrambled_median" not in h.columns:
        return
    defined = np.isfinite(h["p_value"].to_numpy(dtype=float))
    s["n_scramble_draws"] = int(rep.options.get("nulls", 0) or 0)
    s["median_P_trained"] = _nanmedian(h["P"])
    s["median_P_scrambled"] = _nanmedian(h["P_scrambled_median"])
    s["n_heads_compared"] = int(defined.sum())
    s["n_heads_beating_scramble"] = int(h["beats_scramble"].to_numpy(dtype=bool)[defined].sum())
    s["frac_beats_scramble"] = s["n_heads_beating_scramble"] / s["n_heads_compared"] if defined.any() else float("nan")
    if "trained_wins" in L.columns:
        wins = L["trained_wins"].to_numpy(dtype=bool)
        s["n_layers_trained_wins"] = int(wins.sum())
        s["layers_trained_loses"] = [int(l) for l in L.loc[~wins, "layer"]]
    if "n_mismatch_pairs" in L.columns:
        s["n_mismatch_pairs"] = int(L["n_mismatch_pairs"].sum())
        s["n_mismatch_closed"] = int(L["n_mismatch_closed"].sum())
        s["mismatch_P_max"] = _nanmax(L["mismatch_P_max"])
        notes = sorted({str(n) for n in L["mismatch_note"] if str(n)})
        if notes:
            s["mismatch_notes"] = notes


def _nanmax(a: Any) -> float:
    a = np.asarray(a, dtype=float)
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else float("nan")


def scramble_figures(rep: "IdempotenceReport") -> list["go.Figure"]:
    """Plotly figures of trained P vs the scramble null (log P axis).

    1. per head (x = heads in layer order): trained P, the scramble median and q95;
    2. per layer: median trained P vs median scrambled P.

    Raises:
        ValueError: the report has no scramble columns (run with ``nulls=True``).
    """
    import plotly.graph_objects as go

    h = rep.heads
    if "P_scrambled_median" not in h.columns:
        raise ValueError("This report has no scramble columns: run idempotence_report(model, nulls=True).")
    label = [f"L{l}H{k}" for l, k in zip(h["layer"], h["head"])]
    x = np.arange(len(h))
    hover = "%{text}<br>%{y:.3g}<extra>%{fullData.name}</extra>"
    f1 = go.Figure()
    f1.add_trace(go.Scatter(x=x, y=h["P_scrambled_q95"], mode="lines", name="scrambled q95",
                            line={"color": "rgba(150,150,150,0.9)", "width": 1}, text=label, hovertemplate=hover))
    f1.add_trace(go.Scatter(x=x, y=h["P_scrambled_median"], mode="lines", name="scrambled median",
                            line={"color": "gray", "width": 1.5}, text=label, hovertemplate=hover))
    f1.add_trace(go.Scatter(x=x, y=h["P"], mode="markers", name="trained P", marker={"size": 5, "color": "crimson"},
                            text=label, hovertemplate=hover))
    f1.add_hline(y=rep.threshold, line_dash="dot", annotation_text=f"P = {rep.threshold}")
    s = rep.summary
    f1.update_layout(
        title=(f"Trained P vs orientation scramble per head ({s.get('n_scramble_draws', '')} Haar draws): "
               f"{100 * s.get('frac_beats_scramble', float('nan')):.2f}% of heads beat their scramble median"),
        xaxis_title="head (layer order)", yaxis_title="P", yaxis_type="log", height=420,
    )
    L = rep.layers
    f2 = go.Figure()
    f2.add_trace(go.Scatter(x=L["layer"], y=L["median_P"], mode="lines+markers", name="median trained P"))
    f2.add_trace(go.Scatter(x=L["layer"], y=L["median_P_scrambled"], mode="lines+markers", name="median scrambled P"))
    if "mismatch_P_max" in L.columns:
        f2.add_trace(go.Scatter(x=L["layer"], y=L["mismatch_P_max"], mode="markers", name="max mismatch P",
                                marker={"symbol": "x"}))
    if "feasible_P" in L.columns:
        f2.add_trace(go.Scatter(x=L["layer"], y=L["feasible_P"], mode="markers", name="feasible P (search)",
                                marker={"symbol": "triangle-up"}))
    f2.update_layout(title="Per layer: trained vs scrambled median P (log scale)", xaxis_title="layer",
                     yaxis_title="P", yaxis_type="log", height=380)
    return [f1, f2]


def paper_table(rep: "IdempotenceReport") -> pd.DataFrame:
    """Headline quantities of the paper's abstract for this model (SPEC 4-5).

    Rows: fraction of heads with P >= threshold (paper: 3.98-8.00 % per model at 0.9),
    mismatched O/V pairs reaching the threshold (paper: none), median P trained vs
    scrambled (paper: 0.336 vs 1.04e-4), fraction of heads whose trained orientation
    beats its scramble median (paper: 98.64 %), layers where the trained orientation
    wins (paper: all), layers where high closure is feasible by constructive search
    (paper: all surveyed; "not run" unless ``search=True``).

    Returns:
        DataFrame with columns ``quantity``, ``this model``, ``paper``.

    Raises:
        ValueError: the report has no control columns (made without ``nulls``).
    """
    s, h, L = rep.summary, rep.heads, rep.layers
    if "P_scrambled_median" not in h.columns or "median_P_scrambled" not in s:
        raise ValueError(
            "paper_table() needs the paper's controls, which this report did not run: make it with "
            "model.idempotence_report(nulls=True) (orientation scramble + O/V mismatch), and search=True "
            "for the feasibility row."
        )
    t = rep.threshold
    n = int(s["n_heads"])
    n_layers = int(len(L))
    rows = [
        ("fraction of heads with P >= %g" % t, f"{100 * s['frac_closed']:.2f} % ({s['n_closed']}/{n})",
         "3.98-8.00 % (P >= 0.9, per model)"),
    ]
    if s.get("n_mismatch_pairs", 0):
        mm = f"{s['n_mismatch_closed']} of {s['n_mismatch_pairs']} pairs (max P {s['mismatch_P_max']:.3g})"
    else:
        mm = "no valid pair (" + "; ".join(s.get("mismatch_notes", ["MQA"])) + ")"
    rows.append(("matched O/V mismatch pairs reaching P >= %g" % t, mm, "none"))
    rows.append(("median P, trained vs scrambled",
                 f"{s['median_P_trained']:.3g} vs {s['median_P_scrambled']:.3g}", "0.336 vs 1.04e-4"))
    rows.append(("heads whose trained orientation beats the scramble median",
                 f"{100 * s['frac_beats_scramble']:.2f} % ({s['n_heads_beating_scramble']}/{s['n_heads_compared']})",
                 "98.64 %"))
    rows.append(("layers where the trained orientation wins (median P)",
                 f"{s.get('n_layers_trained_wins', 0)}/{n_layers}"
                 + ("" if not s.get("layers_trained_loses") else f" (loses: {s['layers_trained_loses']})"), "all"))
    if "n_feasible_layers" in s:
        feas = f"{s['n_feasible_layers']}/{n_layers}" + (
            "" if not s.get("infeasible_layers") else f" (not: {s['infeasible_layers']})")
    else:
        feas = "not run (idempotence_report(..., search=True))"
    rows.append(("layers where P >= %g is feasible (constructive search)" % t, feas, "all surveyed"))
    return pd.DataFrame(rows, columns=["quantity", "this model", "paper"])
