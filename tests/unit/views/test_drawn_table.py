"""A figure of a joined result refuses what is not that result by its table: not a DataFrame, or one missing a
column the figure draws (one rule, :func:`~tl_idempotence.views.role_figures.drawn_table`, for
``mechanism_figure`` and ``mechanism_comparison_figure``), naming the figure, what it draws and what it got."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from tl_idempotence.errors import OptionTypeError
from tl_idempotence.views import mechanism_comparison_figure, mechanism_figure
from tl_idempotence.views.role_figures import drawn_table

COMPARISON = ["model", "agree_rate", "matched_control_rate", "other_agree_rate", "status", "notes"]


def test_drawn_table_returns_the_table_with_every_column() -> None:
    t = pd.DataFrame({"a": [1.0], "b": [2.0], "c": [3.0]})
    assert drawn_table(SimpleNamespace(table=t), {"a", "b"}, "f draws x") is t


@pytest.mark.parametrize("table", [None, "a,b", pd.DataFrame({"a": [1.0]})])
def test_drawn_table_refuses_a_missing_table_or_column(table: object) -> None:
    with pytest.raises(OptionTypeError, match=r"^f draws x; got SimpleNamespace\.$"):
        drawn_table(SimpleNamespace(table=table), {"a", "b"}, "f draws x")


@pytest.mark.parametrize("missing", COMPARISON)
def test_mechanism_comparison_figure_refuses_a_table_missing_a_column(missing: str) -> None:
    t = pd.DataFrame({c: [] for c in COMPARISON if c != missing})
    with pytest.raises(OptionTypeError, match=r"mechanism_comparison_figure draws tli\.compare_mechanisms\(\.\.\.\)"):
        mechanism_comparison_figure(SimpleNamespace(table=t, summary={}))


def test_mechanism_figure_refuses_a_table_missing_effect_q() -> None:
    t = pd.DataFrame({c: [] for c in ("alpha_P", "P", "alpha", "closed", "effect_median")})
    with pytest.raises(OptionTypeError, match=r"mechanism_figure draws rep\.mechanism\(model=\.\.\.\) \(a Mechanism\)"):
        mechanism_figure(SimpleNamespace(table=t, summary={}))
