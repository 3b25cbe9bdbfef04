"""How stable the attended-token effect is: bootstrap intervals and sign stability across texts (SPEC 12, 13).

Both work on :attr:`AttendedTokenEffect.positions <tl_idempotence.probes.token_effect.AttendedTokenEffect.positions>`
frames (columns ``label, window, pos, effect, null_effect`` are read; other columns are ignored). Rows whose
``effect`` or ``null_effect`` is not finite are left out, as the effect's own table does. ``d = effect - null``.

**Direction** (SPEC 13): a head lowers (-1) or raises (+1) the attended token by the sign of ``n_pos - n_neg``,
the counts of positive and negative ``d`` (ties ``d = 0`` dropped; what its sign test tests); 0 when they are
equal. ``direction="effect"`` uses the sign of the median ``effect`` instead (the mechanism's agreement column).

**Bootstrap** (:func:`bootstrap_effects`): a two-stage (cluster) percentile bootstrap. Each replicate draws the
windows (texts) with replacement, as many as there are, then, inside each drawn window, its destination
positions with replacement, as many as it has; a window drawn twice contributes two independent draws. The
draws are of ``(window, pos)`` keys **shared by every head**, so the heads' replicates are joint (they saw the
same resampled text) and the agreement count's replicates are counts over one resampled text each. A head
without a finite row at a drawn key skips it. For each head and replicate: the median of ``d``, the median of
``effect`` and the direction. Intervals: the ``(1 - level)/2`` and ``(1 + level)/2`` percentiles of the
replicates (``numpy.percentile``, linear interpolation). ``direction_stability``: the share of replicates whose
direction equals the observed one. Given ``alpha`` (label -> α, e.g. the closed heads'), the agreement count
``#{h : direction_h = sign(α_h) ≠ 0}`` observed and its percentile interval. Seeded
(``numpy.random.default_rng(seed)``); the whole scheme is one draw sequence, so the numbers depend on the seed,
``n_boot`` and the frame's keys, not on which heads are in it. Cost: about ``n_boot x positions`` per head (a sort
per replicate): 1000 replicates of 2048 positions take about 0.2 s per head.

**Sign stability** (:func:`sign_stability`): given several positions frames (independent text sets), each head's
direction in each, and whether it **kept** it: the same nonzero direction in every set that measured it (a head
must be in every set). Given ``alpha``, the agreement count per set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import OptionError, OptionTypeError

__all__ = ["MAX_BOOT", "EffectBootstrap", "SignStability", "bootstrap_effects", "directions", "sign_stability"]

#: The most bootstrap replicates: the draws hold ``n_boot x positions`` indices at once (10,000 replicates of 2048
#: positions: 160 MB and ~2 s per head; 2^20 would be 16 GB), so more are refused before any allocation.
MAX_BOOT = 10_000

_NEEDED = ("label", "window", "pos", "effect", "null_effect")


def _check_positions(positions: Any, what: str = "positions") -> pd.DataFrame:
    if not isinstance(positions, pd.DataFrame):
        raise OptionTypeError(
            f"{what} must be an AttendedTokenEffect.positions DataFrame; got {type(positions).__name__}."
        )
    missing = [c for c in _NEEDED if c not in positions.columns]
    if missing:
        raise OptionError(f"{what} lacks the columns {missing} (an AttendedTokenEffect.positions frame has them).")
    p = positions.loc[:, list(_NEEDED)].copy()
    eff = pd.to_numeric(p["effect"], errors="coerce").to_numpy(dtype=float)
    nul = pd.to_numeric(p["null_effect"], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(eff) & np.isfinite(nul)
    p = p.loc[ok]
    p["effect"], p["d"] = eff[ok], eff[ok] - nul[ok]
    return p


def _check_direction(direction: str) -> str:
    if direction not in ("diff", "effect"):
        raise OptionError(
            f"direction must be 'diff' (sign of n_pos - n_neg of effect - null) or 'effect'; got {direction!r}."
        )
    return direction


def _alpha_map(alpha: Any) -> dict[str, float] | None:
    if alpha is None:
        return None
    if isinstance(alpha, pd.Series):
        alpha = alpha.to_dict()
    if not isinstance(alpha, Mapping):
        raise OptionTypeError(f"alpha must map head labels to α (a dict or Series); got {type(alpha).__name__}.")
    try:
        return {str(k): float(v) for k, v in alpha.items()}
    except (TypeError, ValueError) as e:
        raise OptionTypeError(f"alpha must map labels to numbers ({e}).") from e


def directions(positions: pd.DataFrame, direction: str = "diff") -> pd.Series:
    """Each head's direction in one positions frame (module docstring): ``sign(n_pos - n_neg)`` of ``effect - null``
    (``direction="diff"``) or the sign of the median effect (``"effect"``), int -1/0/+1, indexed by label.

    Raises:
        OptionTypeError / OptionError: not a positions frame, a missing column, an unknown ``direction``.
    """
    p = _check_positions(positions)
    direction = _check_direction(direction)
    if direction == "diff":
        s = p.groupby("label", sort=False)["d"].apply(lambda d: int(np.sign(np.sign(d).sum())))
    else:
        s = p.groupby("label", sort=False)["effect"].apply(lambda e: int(np.sign(np.median(e))))
    return s.astype(np.int64)


@dataclass(frozen=True)
class EffectBootstrap:
    """:func:`bootstrap_effects`' answer.

    Attributes:
        heads: indexed by label: ``n_positions, n_windows, median_diff, median_diff_lo, median_diff_hi,
            median_effect, median_effect_lo, median_effect_hi, direction, direction_stability`` (standardized
            effect units; direction -1/0/+1).
        agreement: with ``alpha``: ``n_heads, n_agree, n_agree_lo, n_agree_hi`` (counts), ``direction``; else None.
        n_boot, level, seed: the bootstrap's settings. scheme: what was resampled, in words.
    """

    heads: pd.DataFrame
    agreement: dict[str, Any] | None
    n_boot: int
    level: float
    seed: int
    scheme: str


SCHEME = (
    "two-stage percentile bootstrap: windows with replacement, then positions within each drawn window with "
    "replacement; (window, pos) draws shared by every head"
)


def _draws(keys: pd.DataFrame, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``[n_boot, L]`` indices into ``keys`` (``-1``: padding), two-stage (module docstring)."""
    win = keys["window"].to_numpy()
    uniq, start, count = np.unique(win, return_index=True, return_counts=True)  # keys sorted by window
    W = len(uniq)
    pick = rng.integers(0, W, size=(n_boot, W))  # windows drawn
    sizes = count[pick]  # [B, W]
    L = int(sizes.sum(1).max())
    out = np.full((n_boot, L), -1, dtype=np.int64)
    flat_sizes = sizes.ravel()
    owner = np.repeat(np.arange(n_boot * W), flat_sizes)  # which (replicate, draw) each slot belongs to
    within = np.floor(rng.random(owner.size) * flat_sizes[owner]).astype(np.int64)
    idx = start[pick.ravel()][owner] + within
    rep = owner // W
    # position of each slot inside its replicate's row
    rep_start = np.concatenate([[0], np.cumsum(sizes.sum(1))[:-1]])
    col = np.arange(owner.size) - np.repeat(rep_start, sizes.sum(1))
    out[rep, col] = idx
    return out


def _row_medians(V: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN (NaN for a row without a finite value)."""
    c = np.isfinite(V).sum(1)
    s = np.sort(V, axis=1)  # NaN last
    lo, hi = np.maximum((c - 1) // 2, 0), np.maximum(c // 2, 0)
    r = np.arange(len(V))
    med = (s[r, lo] + s[r, hi]) / 2
    return np.where(c > 0, med, np.nan)


def bootstrap_effects(
    positions: pd.DataFrame,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    alpha: Any = None,
    direction: str = "diff",
) -> EffectBootstrap:
    """Per-head bootstrap intervals of the median of ``effect - null`` and of ``effect``, and the agreement count's
    interval (module docstring; SPEC 13).

    Args:
        positions: an :attr:`AttendedTokenEffect.positions` frame.
        n_boot: replicates (10 .. :data:`MAX_BOOT`). level: the intervals' coverage, in (0, 1). seed: the draws' seed.
        alpha: label -> α of the heads whose agreement ``direction = sign(α)`` is counted (e.g. the closed heads;
            a dict or Series), or None. direction: ``"diff"`` or ``"effect"`` (module docstring).

    Returns:
        :class:`EffectBootstrap`.

    Raises:
        OptionTypeError / OptionError: not a positions frame, bad counts or level, ``alpha`` naming a head the
            frame lacks, an unknown ``direction``, no finite row.
    """
    p = _check_positions(positions)
    direction = _check_direction(direction)
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or not 10 <= n_boot <= MAX_BOOT:
        raise OptionError(f"n_boot must be a whole number in 10 .. {MAX_BOOT}; got {n_boot!r}.")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise OptionError(f"level must be in (0, 1); got {level!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise OptionError(f"seed must be a whole number >= 0; got {seed!r}.")
    amap = _alpha_map(alpha)
    if not len(p):
        raise OptionError("positions has no row with a finite effect and null: nothing to resample.")
    labels = list(dict.fromkeys(p["label"]))
    if amap is not None and set(amap) - set(labels):
        raise OptionError(f"alpha names heads the positions frame lacks: {sorted(set(amap) - set(labels))[:5]}.")
    keys = p[["window", "pos"]].drop_duplicates().sort_values(["window", "pos"], kind="stable").reset_index(drop=True)
    key_of = pd.MultiIndex.from_frame(keys)
    draws = _draws(keys, int(n_boot), np.random.default_rng(int(seed)))
    pad = draws < 0
    qs = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    rows, rep_dirs = [], {}
    for lab, g in p.groupby("label", sort=False):
        at = key_of.get_indexer(pd.MultiIndex.from_frame(g[["window", "pos"]]))
        dv = np.full(len(keys), np.nan)
        ev = np.full(len(keys), np.nan)
        dv[at], ev[at] = g["d"].to_numpy(), g["effect"].to_numpy()
        D = np.where(pad, np.nan, dv[np.where(pad, 0, draws)])
        E = np.where(pad, np.nan, ev[np.where(pad, 0, draws)])
        md, me = _row_medians(D), _row_medians(E)
        if direction == "diff":
            obs_dir, rep_dir = int(np.sign(np.sign(g["d"]).sum())), np.sign(np.nansum(np.sign(D), 1)).astype(int)
        else:
            obs_dir, rep_dir = int(np.sign(np.median(g["effect"]))), np.sign(np.nan_to_num(me)).astype(int)
        rep_dirs[lab] = rep_dir
        rows.append({
            "label": lab, "n_positions": len(g), "n_windows": int(g["window"].nunique()),
            "median_diff": float(np.median(g["d"])), "median_diff_lo": float(np.nanpercentile(md, qs[0])),
            "median_diff_hi": float(np.nanpercentile(md, qs[1])), "median_effect": float(np.median(g["effect"])),
            "median_effect_lo": float(np.nanpercentile(me, qs[0])),
            "median_effect_hi": float(np.nanpercentile(me, qs[1])),
            "direction": obs_dir, "direction_stability": float((rep_dir == obs_dir).mean()),
        })  # fmt: skip
    heads = pd.DataFrame(rows).set_index("label")
    heads.index.name = None
    agreement = None
    if amap is not None:
        sgn = {lab: int(np.sign(a)) if np.isfinite(a) else 0 for lab, a in amap.items()}
        obs = sum(1 for lab, s in sgn.items() if s != 0 and int(heads.loc[lab, "direction"]) == s)
        reps = np.zeros(int(n_boot), dtype=np.int64)
        for lab, s in sgn.items():
            if s != 0:
                reps += rep_dirs[lab] == s
        lo, hi = np.percentile(reps, qs)
        agreement = {
            "n_heads": len(amap), "n_agree": int(obs), "n_agree_lo": float(lo), "n_agree_hi": float(hi),
            "direction": direction,
        }  # fmt: skip
    return EffectBootstrap(heads, agreement, int(n_boot), float(level), int(seed), SCHEME)


@dataclass(frozen=True)
class SignStability:
    """:func:`sign_stability`' answer.

    Attributes:
        heads: indexed by label (heads measured in every set): one ``direction_<name>`` column per set (-1/0/+1)
            and ``kept`` (the same nonzero direction in every set).
        sets: one row per set: ``name, n_heads`` (heads in it), ``n_raise, n_lower`` and, given ``alpha``,
            ``n_agree`` (of the heads in ``alpha``).
        n_heads: heads in every set. n_kept: those that kept their direction. n_changed: heads with a nonzero
            direction in every set that changed it. missing: heads left out (not in every set).
        direction: ``"diff"`` or ``"effect"``.
    """

    heads: pd.DataFrame
    sets: pd.DataFrame
    n_heads: int
    n_kept: int
    n_changed: int
    missing: tuple[str, ...]
    direction: str


def sign_stability(
    frames: Sequence[pd.DataFrame], *, names: Sequence[str] | None = None, alpha: Any = None, direction: str = "diff"
) -> SignStability:
    """How many heads keep their direction across several text sets (module docstring; SPEC 13).

    Args:
        frames: two or more :attr:`AttendedTokenEffect.positions` frames (one per text set; same model and heads).
        names: one name per set (default ``"set0"``, ``"set1"``, ...). alpha: label -> α to count agreement per set.
        direction: ``"diff"`` or ``"effect"``.

    Returns:
        :class:`SignStability`.

    Raises:
        OptionTypeError / OptionError: fewer than two frames, a frame that is not a positions frame, names of
            another length or repeated, an unknown ``direction``.
    """
    if isinstance(frames, pd.DataFrame) or not isinstance(frames, Sequence) or len(frames) < 2:
        raise OptionError("sign_stability compares two or more positions frames (a list of them).")
    names = [f"set{i}" for i in range(len(frames))] if names is None else [str(n) for n in names]
    if len(names) != len(frames) or len(set(names)) != len(names):
        raise OptionError(f"names must be {len(frames)} distinct names; got {names}.")
    amap = _alpha_map(alpha)
    dirs = [directions(f, direction).rename(f"direction_{n}") for f, n in zip(frames, names, strict=True)]
    common = set(dirs[0].index).intersection(*[d.index for d in dirs[1:]])
    order = [lab for lab in dict.fromkeys(lab for d in dirs for lab in d.index) if lab in common]
    allh = {lab for d in dirs for lab in d.index}
    t = pd.concat([d.reindex(order) for d in dirs], axis=1).astype(np.int64)
    M = t.to_numpy()
    nonzero = (M != 0).all(1)
    same = (M == M[:, :1]).all(1)
    t["kept"] = nonzero & same
    rows = []
    for d, n in zip(dirs, names, strict=True):
        row: dict[str, Any] = {
            "name": n,
            "n_heads": len(d),
            "n_raise": int((d > 0).sum()),
            "n_lower": int((d < 0).sum()),
        }
        if amap is not None:
            row["n_agree"] = sum(
                1 for lab, a in amap.items() if lab in d.index and np.isfinite(a) and a != 0 and d[lab] == np.sign(a)
            )
        rows.append(row)
    return SignStability(
        heads=t, sets=pd.DataFrame(rows), n_heads=len(order), n_kept=int(t["kept"].sum()),
        n_changed=int((nonzero & ~same).sum()), missing=tuple(sorted(allh - common)), direction=direction,
    )  # fmt: skip
