"""Rewrote ONLY the constructive-search columns of ``smollm2_bridge_l5_l10_search.*.parquet`` (see README.md).

    PYTHONPATH=src python tests/data/v0_1/regenerate_search_columns.py

Why: the search's random restarts now come from one generator per head, seeded by
``(seed, layer, head)`` (``core.random.head_generator``), so a head's searched P no longer
depends on which other heads were searched or in what order. That changes the searched
numbers; every other column is checked here to be bit-identical to the stored 0.1 table and
is kept from that table untouched.
"""

from pathlib import Path

import numpy as np
import pandas as pd

import tl_idempotence as tli

OUT = Path(__file__).parent
STEM = "smollm2_bridge_l5_l10_search"
SEARCH = {
    "heads": ["P_searched", "search_iters", "search_stopped_on", "search_best_restart", "search_reason"],
    "layers": ["feasible_P", "feasible", "feasible_head", "n_heads_feasible", "n_search_budget_stops"],
}


def same(a: pd.Series, b: pd.Series) -> bool:
    a, b = a.to_numpy(), b.to_numpy()
    if b.dtype.kind == "f":
        return np.array_equal(a.astype(np.float64).view(np.int64), b.astype(np.float64).view(np.int64))
    return [str(x) for x in a] == [str(x) for x in b]


hf = tli.models.checkpoint_dir("smollm2-135m", progress=False)
rep = tli.idempotence_report(str(hf), layers=[5, 10], nulls=8, search=True, progress=False)
for part, cols in SEARCH.items():
    path = OUT / f"{STEM}.{part}.parquet"
    ref = pd.read_parquet(path)
    got = getattr(rep, part).reset_index(drop=True)
    others = [c for c in ref.columns if c not in cols]
    bad = [c for c in others if not same(got[c], ref[c])]
    assert not bad, f"{part}: non-search columns changed: {bad}"
    for c in cols:
        ref[c] = pd.Series(got[c].to_numpy(), index=ref.index).astype(ref[c].dtype)
    ref.to_parquet(path, index=False)
    print(part, "rewrote", cols)
