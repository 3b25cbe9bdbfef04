"""The orientation-scramble null (SPEC 4b; paper: median P 0.336 trained vs 1.04e-4 scrambled).

Write the SVD ``K = U S Wᵀ`` of a head's principal-coordinate transport. The scramble keeps
``Q_O, Q_V, D`` and ``S`` and replaces the orientation: ``K~ = R₁ S R₂ᵀ`` with
independent Haar-random ``R₁ ∈ O(rank_O)`` (O-side principal coordinates) and
``R₂ ∈ O(rank_V)`` (V side). Singular values, ``‖T‖``, the factor spans and the principal
angles are unchanged; only the orientation moves. One draw costs one ``r x r`` product
(:mod:`.orientation`).

Haar sampler: QR of a Gaussian matrix with the sign fix (Mezzadri 2007;
:func:`~tl_idempotence.core.random.haar_orthogonal`), float64.

Draw design (documented choice, ours): for every layer and every rank pair
``(rank_O, rank_V)`` present in it, a pool of ``nulls`` Haar matrices for each side is
sampled once; head ``h`` uses draws ``j = 1..n`` with ``R₁ = pool_O[j]`` and
``R₂ = pool_V[σ_h(j)]`` for a random permutation ``σ_h`` per head. For one head the n
pairs are therefore i.i.d. Haar x Haar (exact null, exact p-values); different heads
re-pair the same pools, which costs ``O(n)`` QRs per layer instead of ``O(n_heads · n)``; their
draws are therefore not exactly independent of each other (two identical heads: Spearman ρ ≈ 0.08
between their j-th draws at n = 4000; tests/unit/analyses/test_scramble_statistics.py), which a joint
statement across heads (BH q-values) should read as weak positive dependence.
Everything is seeded by ``(seed, layer)``, so a layer's numbers do not depend on which
other layers ran. The batched products run on the options' device; the pools are drawn
on the CPU generator (so the draws are the same on every device).

Per head (report columns): ``P_scrambled_median``, ``P_scrambled_q95``, ``p_value``
``= (1 + #{P~ >= P}) / (n + 1)``, ``beats_scramble`` (``P > P_scrambled_median``),
``n_scramble_draws``, ``frac_scrambled_closed``, ``scramble_effect`` (:func:`scramble_effect`),
``scramble_reason``. The p-value tests "trained orientation vs Haar-scrambled orientation with the same spectra",
not "closed" (P >= the threshold is closure; almost every trained head beats its scramble, paper: 98.64 %), and with
n draws it cannot go below ``1/(n + 1)``; ``scramble_effect = log10(P / P_scrambled_median)`` ranks heads within
that floor. Across every measured head of a report (:func:`bh_q_values`, added by the report's assembly, not per
layer): ``q_value``, the Benjamini-Hochberg q-value of ``p_value`` (NaN where ``p_value`` is NaN: the head's
``scramble_reason`` says why).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..core.defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, default_of
from ..core.frozen import frozen
from ..core.heads import LayerHeads
from ..core.kwargs import warn_at_caller
from ..core.option_specs import GeneralOptions
from ..core.options import check_bool, check_compute_dtype, check_device, check_int, check_seed, strict_kwargs
from ..core.paper import FDR_LEVEL
from ..core.random import embed_orthogonal, haar_orthogonal, layer_generator
from ..core.tables import ImmutableResult
from ..errors import OptionError
from ..maths.closure import Closure, closure, flat_fields
from ..views.results import DrawnResult
from .base import LayerContext, LayerResult, nan_median
from .orientation import Factors, P_from_Z, defined_for_orientation, factors_of, factors_of_closure
from .threshold import fractions_closed

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import DeviceLike, DtypeLike, HeadWeightsLike, IntLike

__all__ = [
    "EFFECT_ZERO_NULL",
    "EFFECT_ZERO_P",
    "Scramble",
    "ScrambleAnalysis",
    "bh_q_values",
    "orientation_scramble",
    "scramble_draws",
    "scramble_effect",
]

#: :func:`orientation_scramble`'s draws per head by default (:mod:`tl_idempotence.core.defaults` says why).
SCRAMBLE_NULLS = default_of("tli.orientation_scramble", "nulls")
#: Elements per batched tensor chunk ([heads, draws, r, r]); bounds memory at ~32 MB a tensor.
CHUNK_ELEMS = 1 << 22
#: Most draws per head :func:`orientation_scramble` takes (a count, not a memory bound: see MAX_POOL_BYTES).
MAX_NULLS = 1 << 24
#: Refuse Haar pools (2 · nulls · r² float64 per rank pair) above this many bytes.
MAX_POOL_BYTES = 8 << 30


def bh_q_values(p_values: Any) -> np.ndarray:
    """Benjamini-Hochberg q-values of per-head p-values, the family being every head with a finite p-value.

    ``q_(i) = min_{k >= i} min(1, m p_(k) / k)`` over the ``m`` finite p-values sorted ascending (scipy's
    ``false_discovery_control(method="bh")``). A NaN p-value (a head without a defined scramble: its
    ``scramble_reason`` says why) is not part of the family and gets a NaN q-value. Valid under independence and
    under positive regression dependence (PRDS), which is how the scramble's re-paired pools make different
    heads' draws depend on each other (module docstring; docs/definitions.md).

    Args:
        p_values: ``[n]`` p-values in (0, 1] or NaN (array-like).

    Returns:
        ``[n]`` float64 q-values (NaN where the p-value is NaN).
    """
    from scipy.stats import false_discovery_control

    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    q = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        q[ok] = false_discovery_control(p[ok], method="bh")
    return q


#: ``scramble_reason`` of a head with a defined p-value whose ``scramble_effect`` is NaN because its trained P is 0.
EFFECT_ZERO_P = "trained P = 0, so scramble_effect = log10(P / scramble median) is -inf: written as NaN"
#: ``scramble_reason`` of a head with a defined p-value whose ``scramble_effect`` is NaN because its null median is 0.
EFFECT_ZERO_NULL = (
    "the median of the head's scrambled P is 0 (at least half its draws have P = 0), so scramble_effect = "
    "log10(P / 0) is undefined: written as NaN"
)


def scramble_effect(P: Any, null_median: Any) -> tuple[np.ndarray, np.ndarray]:
    """The effect size that ranks heads within the scramble p's floor (docs/definitions.md, "scramble effect"):
    ``scramble_effect = log10(P / m)``, ``m`` the median of the head's own scrambled P draws (``P_scrambled_median``).

    Dimensionless, in decades: 0 when the trained orientation sits at its null's median, 2 when its P is 100 times
    the median. ``m`` estimates the median of the head's scramble distribution, a property of the head (its singular
    values and principal angles), not of the number of draws: more draws make the estimate more precise (its spread
    shrinks like ``1/sqrt(n)``) without moving its target, unlike the p-value, whose floor is ``1/(n + 1)``.

    Args:
        P: ``[n]`` trained P (dimensionless, [0, 1] or NaN).
        null_median: ``[n]`` the median of each head's defined scrambled draws (NaN when it has none).

    Returns:
        ``(effect [n] float64, reason [n] str)``: NaN where either input is NaN (the head's ``scramble_reason`` says
        why: no comparison), and NaN with :data:`EFFECT_ZERO_P` / :data:`EFFECT_ZERO_NULL` where ``P = 0`` or
        ``m = 0`` (a logarithm of 0; no epsilon is added, so a number is never made up); reason ``""`` elsewhere.
    """
    Pt = np.asarray(P, dtype=np.float64).reshape(-1)
    m = np.asarray(null_median, dtype=np.float64).reshape(-1)
    eff = np.full(Pt.shape, np.nan)
    why = np.full(Pt.shape, "", dtype=object)
    finite = np.isfinite(Pt) & np.isfinite(m)
    zero_p = finite & (Pt <= 0)
    zero_m = finite & ~zero_p & (m <= 0)
    ok = finite & ~zero_p & ~zero_m
    eff[ok] = np.log10(Pt[ok]) - np.log10(m[ok])
    why[zero_p] = EFFECT_ZERO_P
    why[zero_m] = EFFECT_ZERO_NULL
    return eff, why.astype(str)


def scramble_draws(
    f: Factors, n_draws: int, seed: int, layer: int | None, return_K: bool, device: torch.device | str = "cpu"
) -> tuple[Float[Tensor, "b n"], Float[Tensor, "b n r r"] | None]:
    """P of ``n_draws`` scrambled orientations per head (SPEC 4b; module docstring for the draw design).

    Args:
        f: the heads' :class:`~tl_idempotence.analyses.orientation.Factors` (flattened batch ``b``).
        n_draws: draws per head (>= 1).
        seed, layer: seed the generator (``layer_generator(seed, layer, "scramble", rank_O, rank_V)``).
        return_K: also return ``K~ = R₁ S R₂ᵀ`` (in ``S``'s units of ``2^e_S``).
        device: where the batched products run.

    Returns:
        ``(P [b, n] float64 CPU, K~ [b, n, r, r] or None)``; NaN rows for heads with a reason.

    Raises:
        OptionError: the pools would exceed :data:`MAX_POOL_BYTES`.
    """
    b, r = f.S.shape
    if 2 * n_draws * r * r * 8 > MAX_POOL_BYTES:
        raise OptionError(
            f"nulls={n_draws} at d_head={r} needs {2 * n_draws * r * r * 8 / 2**30:.1f} GiB of Haar pools per rank "
            f"pair (limit {MAX_POOL_BYTES / 2**30:.0f} GiB); use fewer draws."
        )
    dev = torch.device(device)
    P = torch.full((b, n_draws), float("nan"), dtype=torch.float64)
    Kd = torch.zeros((b, n_draws, r, r), dtype=torch.float64) if return_K else None
    ok = defined_for_orientation(f.reason)
    if not ok.any():
        return P, Kd
    pairs = torch.stack([f.rank_O, f.rank_V], -1)
    okt = torch.from_numpy(ok)
    groups = sorted({tuple(p) for p in pairs[okt].tolist()})
    S_dev, cos_dev = f.S.to(dev), f.cos.to(dev)
    for rO, rV in groups:
        idx = ((pairs[:, 0] == rO) & (pairs[:, 1] == rV) & okt).nonzero().flatten()
        gen = layer_generator(seed, layer, "scramble", rO, rV)
        pool_O = embed_orthogonal(haar_orthogonal(n_draws, rO, gen), r)  # R1 ∈ O(rank_O) ⊕ I
        pool_V = embed_orthogonal(haar_orthogonal(n_draws, rV, gen), r)  # R2 ∈ O(rank_V) ⊕ I
        # Head h pairs R1 = pool_O[j] with R2 = pool_V[perm_h[j]]: i.i.d. Haar pairs for each head.
        perm_V = torch.rand(len(idx), n_draws, generator=gen, dtype=torch.float64).argsort(-1)
        pool_O_d = pool_O.to(dev)
        pool_Vt = pool_V.transpose(-1, -2).contiguous().to(dev)
        perm_d = perm_V.to(dev)
        hc = max(1, CHUNK_ELEMS // (n_draws * r * r))
        for a in range(0, len(idx), hc):
            sel = idx[a : a + hc]
            sel_d = sel.to(dev)
            s = S_dev[sel_d]  # [hc, r]
            # Z = diag(s) R2ᵀ D R1 = diag(s) X  (one product per draw; R1 broadcast, not copied)
            L = pool_Vt[perm_d[a : a + hc]]  # [hc, n, r, r] = R2ᵀ
            L.mul_((s.unsqueeze(-1) * cos_dev[sel_d].unsqueeze(-2)).unsqueeze(1))
            Z = torch.matmul(L, pool_O_d)
            del L
            P[sel] = P_from_Z(s.unsqueeze(1), Z, f.rtol).cpu()
            if Kd is not None:
                R2 = pool_V[perm_V[a : a + hc]]
                Kd[sel] = (pool_O * f.S[sel].unsqueeze(1).unsqueeze(-2)) @ R2.transpose(-1, -2)
                del R2
            del Z
    return P, Kd


def _summarize_draws(P_trained: Tensor, Pd: Tensor) -> dict[str, np.ndarray]:
    Pd_np = Pd.numpy()
    Pt = P_trained.numpy()
    valid = np.isfinite(Pd_np)
    n_valid = valid.sum(-1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
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


#: Reason of a head that is defined but whose every scrambled draw has an undefined P.
NO_DRAWS = "every scrambled draw of this head has an undefined P (nilpotent orientation): no defined draw"


def _scramble_reasons(reason: np.ndarray, n_valid: np.ndarray) -> np.ndarray:
    """The heads' reasons (``[b]`` str), with :data:`NO_DRAWS` for defined heads without a defined draw."""
    out = np.asarray(reason, dtype=object).astype(str)
    return np.where((out == "") & (np.asarray(n_valid) == 0), NO_DRAWS, out)


@dataclass(repr=False)
class Scramble(
    ImmutableResult,
    DrawnResult,
    repr_keys="n_heads n_draws median_P_trained median_P_scrambled frac_beats_scramble",
    frozen=("a scramble result is", "dataclasses.replace(s, ...) for a changed copy"),
):
    """Orientation-scramble draws for a batch of heads (SPEC 4b). float64, CPU. Immutable
    (:class:`~tl_idempotence.core.tables.ImmutableResult`): assigning a field raises
    ``dataclasses.FrozenInstanceError``; ``dataclasses.replace`` gives a changed copy.

    Attributes:
        P: trained P, ``[*batch]``.
        P_draws: P of each scrambled orientation, ``[*batch, n_draws]`` (NaN for a
            nilpotent draw or an undefined head).
        P_scrambled_median, P_scrambled_q95: per head, ``[*batch]``.
        p_value: ``(1 + #{P~ >= P}) / (n + 1)`` over the defined draws, ``[*batch]``: the test of the trained
            orientation against Haar-scrambled orientations with the same spectra (not of closure); floor ``1/(n+1)``.
        beats_scramble: ``P > P_scrambled_median``, ``[*batch]`` bool (False when undefined).
        S: singular values of K (= of T), ``[*batch, r]``, kept by every draw (weights' units).
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
        """One row per head (flattened batch) with the per-head summary columns (same as :attr:`heads`)."""
        return self.heads

    @property
    def heads(self) -> pd.DataFrame:
        """One row per head (flattened batch): ``index, P, P_scrambled_median, P_scrambled_q95, p_value,
        scramble_effect, beats_scramble, scramble_reason`` (``p_value`` tests trained vs Haar-scrambled orientation
        with the same spectra, not closure; ``scramble_effect`` = ``log10(P / P_scrambled_median)``,
        :func:`scramble_effect`)."""
        cols = flat_fields(self, "P", "P_scrambled_median", "P_scrambled_q95", "p_value")
        eff, eff_why = scramble_effect(cols["P"], cols["P_scrambled_median"])
        reason = np.asarray(self.reason, dtype=object).reshape(-1).astype(str)
        return pd.DataFrame(
            {
                "index": np.arange(int(self.P.numel())),
                **cols,
                "scramble_effect": eff,
                **flat_fields(self, "beats_scramble"),
                "scramble_reason": np.where(reason == "", eff_why, reason),
            }
        )

    @property
    def summary(self) -> dict[str, Any]:
        """``n_heads, n_draws, median_P_trained, median_P_scrambled, frac_beats_scramble, n_heads_compared``
        (read-only)."""
        pv = self.p_value.reshape(-1).numpy()
        defined = np.isfinite(pv)
        beats = self.beats_scramble.reshape(-1).numpy()
        return frozen(
            {
                "n_heads": int(self.P.numel()),
                "n_draws": int(self.P_draws.shape[-1]),
                "median_P_trained": nan_median(self.P.reshape(-1).numpy()),
                "median_P_scrambled": nan_median(self.P_scrambled_median.reshape(-1).numpy()),
                "n_heads_compared": int(defined.sum()),
                "frac_beats_scramble": float(beats[defined].mean()) if defined.any() else float("nan"),
            }
        )


def _factors_for(x: Any, compute_dtype: torch.dtype, device: torch.device) -> tuple[Factors, Closure, int | None]:
    if isinstance(x, Closure):
        return factors_of_closure(x), x, None
    layer = x.layer if isinstance(x, LayerHeads) else None
    c = closure(x, factors=True, compute_dtype=compute_dtype, device=device)
    return factors_of_closure(c), c, layer


@strict_kwargs
def orientation_scramble(
    heads: Closure | HeadWeightsLike,
    nulls: IntLike = SCRAMBLE_NULLS,
    seed: IntLike = 0,
    *,
    layer: IntLike | None = None,
    return_K: bool = True,
    compute_dtype: DtypeLike = DEFAULT_COMPUTE_DTYPE,
    device: DeviceLike = DEFAULT_DEVICE,
    n_draws: IntLike | None = None,
) -> Scramble:
    """Orientation-scramble null for a batch of heads (SPEC 4b; paper: trained median P
    0.336 vs scrambled 1.04e-4 over 7,304 heads).

    Args:
        heads: a factored :class:`~tl_idempotence.maths.closure.Closure` (``tli.closure(...)``),
            a :class:`~tl_idempotence.core.heads.LayerHeads`, a TransformerLens
            ``FactoredMatrix`` (``model.OV`` or one head ``model.OV[l, h]``) or a ``(W_V, W_O)``
            pair in TL row form (``[*batch, d_model, d_head]`` / ``[*batch, d_head, d_model]``).
        nulls (int): Haar draws per head, in ``[1, MAX_NULLS]`` (a bool, a float or a negative count is refused).
        seed (int): non-negative seed; with ``layer`` it seeds the generator
            (:func:`~tl_idempotence.core.random.layer_generator`). A LayerHeads supplies its layer.
        layer (int | None): layer index mixed into the seed (``None`` when not from a model).
        return_K (bool): also return the scrambled ``K~`` (``[*batch, n, r, r]`` float64).
        compute_dtype (torch.dtype | str): dtype of the ``d_model``-long products (for weight inputs).
        device (str | torch.device): where the Gram products and the batched draws run ("cpu",
            "cuda", "auto"); results are CPU float64.
        n_draws (int | None): deprecated name of ``nulls``.

    Every argument is validated here, where it enters.

    Returns:
        :class:`Scramble` with the input's batch shape (``()`` for one head).

    Raises:
        OptionError / OptionTypeError: ``nulls`` not an int in ``[1, MAX_NULLS]`` (bools refused), a
            negative or non-int seed or layer, a Closure without factors, Haar pools above ``MAX_POOL_BYTES``.
        WeightError: bad shapes or non-finite weights.
    """
    if n_draws is not None:
        warn_at_caller("orientation_scramble(n_draws=...) is deprecated; use nulls=...", DeprecationWarning)
        nulls = n_draws
    nulls = check_int(nulls, "nulls", 1, MAX_NULLS)
    seed = check_seed(seed)
    return_K = check_bool(return_K, "return_K")
    if layer is not None:
        layer = check_int(layer, "layer", 0)
    dtype = check_compute_dtype(compute_dtype)
    dev = check_device(device)
    f, c, lay = _factors_for(heads, dtype, dev)
    layer = lay if layer is None else layer
    Pd, Kd = scramble_draws(f, nulls, seed, layer, return_K, dev)
    summ = _summarize_draws(f.P, Pd)
    shape = tuple(c.P.shape)
    r = f.S.shape[-1]

    def sh(a: Any, *tail: int) -> Tensor:
        t = a if isinstance(a, Tensor) else torch.as_tensor(np.asarray(a))
        return t.reshape(shape + tail)

    return Scramble(
        P=sh(f.P),
        P_draws=sh(Pd, nulls),
        P_scrambled_median=sh(summ["P_scrambled_median"]),
        P_scrambled_q95=sh(summ["P_scrambled_q95"]),
        p_value=sh(summ["p_value"]),
        beats_scramble=sh(summ["beats_scramble"]),
        S=sh(f.unscale(f.S), r),
        D=sh(f.cos, r),
        rank_O=sh(f.rank_O),
        rank_V=sh(f.rank_V),
        K_draws=None if Kd is None else f.unscale(Kd).reshape((*shape, nulls, r, r)),
        reason=np.asarray(f.reason, dtype=object).reshape(shape),
    )


class ScrambleAnalysis:
    """Per-head scramble columns of the report (SPEC 4b); runs when ``nulls > 0``.

    Per head: the module docstring's columns (``scramble_effect`` beside ``p_value``).
    Per layer: ``median_P_scrambled`` (median over heads of each head's scramble median),
    ``frac_beats_scramble`` (over the layer's ``n_heads_compared`` heads with a defined comparison; NaN with
    a note when there is none), ``n_heads_compared``, ``trained_wins`` (the layer's median trained P beats it).
    Tables: ``scramble_draws`` (``layer, head, draw, P``) — every draw, for figures and for the declared
    threshold rule :data:`~tl_idempotence.analyses.scramble_spec.FRAC_SCRAMBLED_CLOSED` (its kernel
    :func:`~tl_idempotence.analyses.threshold.fractions_closed`), which gives
    ``frac_scrambled_closed`` (here at the run's threshold, and at another from the stored draws).
    """

    name: ClassVar[str] = "scramble"
    reason_column: ClassVar[str | None] = "scramble_reason"

    def enabled(self, options: GeneralOptions) -> bool:
        """Whether the report runs this analysis (when its option ``nulls > 0``)."""
        return bool(options["nulls"] > 0)

    def run(self, ctx: LayerContext) -> LayerResult:
        """This analysis of one layer (SPEC 4b): the columns, values, tables and notes of the class docstring.

        Raises: nothing of its own for a valid context (the context was built from checked heads and options).
        """
        n = ctx.options["nulls"]
        K, D, rank_O, rank_V = ctx.principal(principal_K=False)
        f = factors_of(K, D, rank_O, rank_V, ctx.closure, ctx.grams.e_T)
        Pd, _ = scramble_draws(f, n, ctx.options.seed, ctx.layer, return_K=False, device=ctx.device)
        summ = _summarize_draws(f.P, Pd)
        Pd_np = Pd.numpy()
        draws = pd.DataFrame(
            {
                "layer": ctx.layer,
                "head": np.repeat(np.arange(ctx.n_heads), n),
                "draw": np.tile(np.arange(n), ctx.n_heads),
                "P": Pd_np.reshape(-1),
            }
        )
        cols: dict[str, np.ndarray] = dict(summ)
        cols["frac_scrambled_closed"] = fractions_closed(
            draws, "P", np.full(ctx.n_heads, ctx.layer), np.arange(ctx.n_heads), ctx.options.threshold
        )
        eff, eff_why = scramble_effect(f.P.numpy(), summ["P_scrambled_median"])
        cols["scramble_effect"] = eff
        reasons = _scramble_reasons(f.reason, summ["n_scramble_draws"])
        cols["scramble_reason"] = np.where(reasons == "", eff_why, reasons)
        P = ctx.closure.P.numpy()
        med_trained = nan_median(P)
        med_scr = (
            float(np.nanmedian(summ["P_scrambled_median"]))
            if np.isfinite(summ["P_scrambled_median"]).any()
            else float("nan")
        )
        # Over the heads whose comparison is defined (finite p-value): NaN heads are in neither count.
        compared = np.isfinite(summ["p_value"])
        frac_beats = float(summ["beats_scramble"][compared].mean()) if compared.any() else float("nan")
        res = LayerResult(
            columns=cols,
            values={
                "median_P_scrambled": med_scr,
                "frac_beats_scramble": frac_beats,
                "n_heads_compared": int(compared.sum()),
                "trained_wins": bool(med_trained > med_scr),
            },
            tables={"scramble_draws": draws},
        )
        if not np.isfinite(med_scr):
            res.notes["median_P_scrambled"] = "no head of the layer has a defined scramble (see scramble_reason)"
        if not compared.any():
            res.notes["frac_beats_scramble"] = (
                "no head of the layer has a defined comparison with its scramble (see scramble_reason)"
            )
        return res

    def summarize(
        self, heads: pd.DataFrame, layers: pd.DataFrame, tables: dict[str, pd.DataFrame], options: GeneralOptions
    ) -> dict[str, Any]:
        """Model-level headline numbers (SPEC 4b) from the concatenated per-layer results (JSON values)."""
        defined = np.isfinite(heads["p_value"].to_numpy(dtype=float))
        s: dict[str, Any] = {
            "n_scramble_draws": int(options["nulls"]),
            "median_P_trained": nan_median(heads["P"]),
            "median_P_scrambled": nan_median(heads["P_scrambled_median"]),
            "n_heads_compared": int(defined.sum()),
        }
        s["n_heads_beating_scramble"] = int(heads["beats_scramble"].to_numpy(dtype=bool)[defined].sum())
        s["n_heads_q05"] = int((bh_q_values(heads["p_value"]) <= FDR_LEVEL).sum())  # NaN q: not counted
        s["frac_beats_scramble"] = (
            s["n_heads_beating_scramble"] / s["n_heads_compared"] if defined.any() else float("nan")
        )
        wins = layers["trained_wins"].to_numpy(dtype=bool)
        s["n_layers_trained_wins"] = int(wins.sum())
        s["layers_trained_loses"] = [int(v) for v in layers.loc[~wins, "layer"]]
        return s
