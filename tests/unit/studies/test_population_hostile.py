"""tli.compare_mechanisms given what a hostile user would give it: every input is refused where it enters with the
library's error naming the argument (never a raw error from the statistics, never a silent wrong number: one model
counted twice under two labels, controls "matched" on a column that is no size), numpy integers accepted; a
population with no closed head answers "undefined" with its reasons."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from tl_idempotence.errors import OptionError, OptionTypeError, UnknownOptionError
from tl_idempotence.probes.tied import EmbeddingTie
from tl_idempotence.report.mechanism import Mechanism
from tl_idempotence.studies.population import compare_mechanisms

TIE = EmbeddingTie(tied=True, how="exact", max_abs_diff=0.0, max_rel_diff=0.0, declared=True, dtypes="f / f")
ROWS = [  # (layer, head, closed, alpha, direction, effect_median, copying)
    (0, 0, True, 2.0, 1, 0.5, 1.0), (0, 1, True, -1.0, -1, -0.3, -1.0), (0, 2, False, 1.5, 1, 0.2, 1.0),
    (0, 3, False, -1.2, 1, 0.1, 1.0), (1, 0, True, 1.0, 1, 0.4, 1.0), (1, 1, False, 0.9, -1, -0.2, -1.0),
]  # fmt: skip


def mech(rows: list[tuple], name: str = "m", scale: float = 1.0) -> Mechanism:
    df = pd.DataFrame(rows, columns=["layer", "head", "closed", "alpha", "direction", "effect_median", "copying"])
    df["alpha"] *= scale
    df["P"] = np.where(df["closed"], 0.95, 0.3)
    df["alpha_P"] = df["alpha"] * df["P"]
    df["copying_own"] = df["copying"]
    df["median_diff"] = 0.1 * df["direction"]
    df["reason"] = ""
    df.index = [f"L{a}H{b}" for a, b in zip(df["layer"], df["head"])]
    return Mechanism(df, pd.DataFrame(), {"model_name": name, "tied": True, "threshold": 0.9}, None, None, TIE)


A, B = mech(ROWS, "a"), mech(ROWS, "b", scale=1.5)
BAD = [
    # (mechanisms, options, error class, a substring naming what is wrong)
    ({}, {}, OptionError, "at least one"),
    ([A], {}, OptionTypeError, "a mapping"),
    ({"a": A, "b": 3}, {}, OptionTypeError, "'b'"),
    ({"a": A, "b": A.table}, {}, OptionTypeError, "'b'"),
    ({"a": A, "b": None}, {}, OptionTypeError, "'b'"),
    ({1: A}, {}, OptionTypeError, "label"),
    ({"": A}, {}, OptionTypeError, "label"),
    ({"a": A, "b": A}, {}, OptionError, "'b' and 'a'"),
    ({"a": A, "b": mech(ROWS, "a")}, {}, OptionError, "'b' and 'a' are equal"),  # a saved one and a fresh one
    ({"a": A, "b": B}, {"match_by": "abs_alfa"}, OptionError, "match_by='abs_alfa'"),
    ({"a": A, "b": B}, {"match_by": "norm"}, OptionError, "match_by='norm'"),  # rep.mechanism's size; no column here
    ({"a": A, "b": B}, {"match_by": "closed"}, OptionError, "match_by='closed'"),  # accepted before: no size at all
    ({"a": A, "b": B}, {"match_by": "layer"}, OptionError, "match_by='layer'"),  # accepted before: every candidate tied
    ({"a": A, "b": B}, {"match_by": "reason"}, OptionError, "match_by='reason'"),
    ({"a": A, "b": B}, {"match_by": 3}, OptionTypeError, "match_by"),
    ({"a": A, "b": B}, {"match_by": None}, OptionTypeError, "match_by"),
    ({"a": A, "b": B}, {"n_controls": "1"}, OptionTypeError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": 2.5}, OptionTypeError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": True}, OptionTypeError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": torch.tensor(1)}, OptionTypeError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": 0}, OptionError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": -1}, OptionError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": 10**12}, OptionError, "n_controls"),
    ({"a": A, "b": B}, {"n_controls": math.nan}, OptionTypeError, "n_controls"),
    ({"a": A, "b": B}, {"n_permutations": "99"}, OptionTypeError, "n_permutations"),
    ({"a": A, "b": B}, {"n_permutations": 99.0}, OptionTypeError, "n_permutations"),
    ({"a": A, "b": B}, {"n_permutations": 0}, OptionError, "n_permutations"),
    ({"a": A, "b": B}, {"n_permutations": -1}, OptionError, "n_permutations"),
    ({"a": A, "b": B}, {"n_permutations": 10**12}, OptionError, "n_permutations"),
    ({"a": A, "b": B}, {"n_permutations": 1e12}, OptionTypeError, "n_permutations"),
    ({"a": A, "b": B}, {"seed": -1}, OptionError, "seed"),
    ({"a": A, "b": B}, {"seed": 1.5}, OptionTypeError, "seed"),
    ({"a": A, "b": B}, {"seed": math.nan}, OptionTypeError, "seed"),
    ({"a": A, "b": B}, {"max_exact": "1"}, OptionTypeError, "max_exact"),
    ({"a": A, "b": B}, {"max_exact": False}, OptionTypeError, "max_exact"),
    ({"a": A, "b": B}, {"max_exact": 0}, OptionError, "max_exact"),
    ({"a": A, "b": B}, {"max_exact": 10**12}, OptionError, "max_exact"),  # never an hour of enumeration
    ({"a": A, "b": B}, {"max_exact": math.nan}, OptionTypeError, "max_exact"),
    ({"a": A, "b": B}, {"n_permutation": 9}, UnknownOptionError, "n_permutation"),
]


@pytest.mark.parametrize("mechanisms,options,error,names", BAD, ids=lambda x: None)
def test_compare_mechanisms_refuses_hostile_inputs_where_they_enter(mechanisms, options, error, names):
    with pytest.raises(error) as e:
        compare_mechanisms(mechanisms, **options)
    assert names in str(e.value) and type(e.value) is error


def test_numpy_integers_and_a_population_without_closed_heads():
    i64 = np.int64
    c = compare_mechanisms({"a": A, "b": B}, n_controls=i64(1), n_permutations=i64(99), seed=i64(2), max_exact=i64(50))
    assert c.options == {"match_by": "abs_alpha", "n_controls": 1, "n_permutations": 99, "seed": 2, "max_exact": 50}
    assert all(type(v) is int for k, v in c.options.items() if k != "match_by")
    plain = compare_mechanisms({"a": A, "b": B}, n_controls=1, n_permutations=99, seed=2, max_exact=50)
    assert c.summary["pooled_p"] == plain.summary["pooled_p"] and c.summary["answer"] == plain.summary["answer"]
    no_closed = [(r[0], r[1], False, *r[3:]) for r in ROWS]
    u = compare_mechanisms({"x": mech(no_closed, "x"), "y": mech(no_closed[:3], "y")})
    s = u.summary
    assert s["answer"] == "undefined" and s["n_pooled_closed"] == 0 and math.isnan(s["pooled_p"])
    assert s["untestable"] == ["2 of 2 models have no closed head (x, y)"]
    assert u.table["notes"].str.contains("no head is closed").all()  # each row's NaN carries its reason
    assert "Undefined" in u.headline and s["pooled_notes"]
