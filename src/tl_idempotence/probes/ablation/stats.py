"""The ablation's statistics: the exact rank p-value of the flagged set among its matched controls, and the
percentile bootstrap intervals of its loss change and of its excess over the controls.

Pure functions of arrays (no model, no hook): :func:`~tl_idempotence.probes.ablation.ablation` calls them on its
summed losses (:mod:`tl_idempotence.probes.ablation.result`). Their definitions are the sections "p-value" and
"Effect size and 95 % intervals" of the :mod:`tl_idempotence.probes.ablation` package docstring, which the
functions below call the "module docstring".
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...core.random import layer_generator
from ...errors import OptionError

__all__ = ["BOOTSTRAP_DRAWS", "INTERVAL_LEVEL", "bootstrap_intervals", "percentile_interval", "rank_p_value"]

#: Bootstrap draws of the 95 % intervals.
BOOTSTRAP_DRAWS = 2000
#: The level of the effect-size intervals: :func:`percentile_interval` takes the 2.5 % and 97.5 % quantiles.
INTERVAL_LEVEL = 0.95


def rank_p_value(delta: float, control_deltas: np.ndarray) -> tuple[float, float, int]:
    """The exact rank p-value of ``delta`` among ``control_deltas`` (module docstring, "p-value").

    Args:
        delta: the flagged set's Δ; control_deltas: ``[n_controls]`` the controls' Δ (distinct sets).

    Returns:
        ``(p, floor, n_at_least)``: ``(1 + n_at_least) / (n_controls + 1)``, ``1 / (n_controls + 1)`` and the
        number of controls with Δ ≥ ``delta``; ``p`` and ``floor`` are NaN when there is no control.

    Raises:
        Nothing of its own.
    """
    n = int(np.size(control_deltas))
    at_least = int((np.asarray(control_deltas) >= delta).sum())
    if not n:
        return float("nan"), float("nan"), 0
    return (1 + at_least) / (n + 1), 1 / (n + 1), at_least


def percentile_interval(draws: np.ndarray, level: float = INTERVAL_LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap ``draws``: their ``(1 − level)/2`` and ``(1 + level)/2`` quantiles.

    numpy's default (linear) quantiles; with the default level the 2.5 % and 97.5 % quantiles.

    Args:
        draws: ``[n_draws]`` finite draws (>= 1); level: the interval's level, in (0, 1).

    Returns:
        ``(low, high)``.

    Raises:
        OptionError: ``level`` outside (0, 1).
    """
    if not 0.0 < float(level) < 1.0:
        raise OptionError(f"level must lie in (0, 1); got {level!r}.")
    lo, hi = np.quantile(np.asarray(draws, dtype=float), [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def bootstrap_intervals(
    clean: np.ndarray,
    flagged: np.ndarray,
    controls: np.ndarray,
    n_tok: np.ndarray,
    seed: int,
    level: float = INTERVAL_LEVEL,
) -> tuple[dict[str, float], int]:
    """Percentile intervals of the flagged Δ and of the excess over the control median (module docstring).

    :data:`BOOTSTRAP_DRAWS` draws (``layer_generator(seed, None, "ablation", 1)``) resample the windows in moving
    blocks of ``ℓ = max(1, round(n_windows^(1/3)))``; the excess also resamples the control sets with
    replacement; the ends are :func:`percentile_interval` of the draws. A pure function of its arguments.

    Args:
        clean, flagged: ``[n_windows]`` summed losses (nats); controls: ``[n_controls, n_windows]`` (may have 0
        rows); n_tok: ``[n_windows]`` counted targets (> 0 each); seed: the bootstrap's seed; level: in (0, 1).

    Returns:
        ``({delta_loss_ci_low, delta_loss_ci_high, excess_ci_low, excess_ci_high}, ℓ)``; the excess ends are NaN
        without controls.

    Raises:
        OptionError: a bad ``level`` or seed.
    """
    n_w = len(clean)
    ell = max(1, round(n_w ** (1 / 3)))
    gen = layer_generator(seed, None, "ablation", 1)
    n_blocks = math.ceil(n_w / ell)
    starts = torch.randint(0, n_w - ell + 1, (BOOTSTRAP_DRAWS, n_blocks), generator=gen).numpy()
    idx = (starts[:, :, None] + np.arange(ell)[None, None, :]).reshape(BOOTSTRAP_DRAWS, -1)[:, :n_w]
    C = np.zeros((BOOTSTRAP_DRAWS, n_w))
    np.add.at(C, (np.repeat(np.arange(BOOTSTRAP_DRAWS), n_w), idx.reshape(-1)), 1.0)
    n = C @ n_tok.astype(float)
    d_flag = C @ (flagged - clean) / n
    lo, hi = percentile_interval(d_flag, level)
    out = {"delta_loss_ci_low": lo, "delta_loss_ci_high": hi}
    if len(controls):
        d_ctrl = (C @ (controls - clean[None, :]).T) / n[:, None]  # [draws, n_controls]
        pick = torch.randint(0, len(controls), (BOOTSTRAP_DRAWS, len(controls)), generator=gen).numpy()
        excess = d_flag - np.median(np.take_along_axis(d_ctrl, pick, 1), axis=1)
        lo, hi = percentile_interval(excess, level)
        out |= {"excess_ci_low": lo, "excess_ci_high": hi}
    else:
        out |= {"excess_ci_low": float("nan"), "excess_ci_high": float("nan")}
    return out, ell
