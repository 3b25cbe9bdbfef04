"""tli.compare_mechanisms: every per-model statistic and the combined test against a direct computation (scipy, or
every relabelling enumerated here by hand) on small hand-built mechanism tables with a known answer.

Populations: closure predicts the sign in every model; it does not (every head agrees: above chance, not above the
controls); it only looks so because of depth (closed heads in the deep layer, where every head agrees: the
within-layer tests must not be fooled); models that differ in their base level (the strata must be (model, layer),
never pooled across models); a model without a closed head and a refused one (rows, never dropped)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest, fisher_exact, rankdata, spearmanr

from tl_idempotence.errors import OptionError, OptionTypeError, UnknownOptionError, UnsupportedModelError
from tl_idempotence.probes.tied import EmbeddingTie
from tl_idempotence.report.mechanism import Mechanism, derive_tests
from tl_idempotence.studies.population import QUESTION, MechanismComparison, compare_mechanisms
from tl_idempotence.studies.population_stats import ROW_COLUMNS

TIE = EmbeddingTie(tied=True, how="exact", max_abs_diff=0.0, max_rel_diff=0.0, declared=True, dtypes="f / f")
COLUMNS = ["layer", "head", "closed", "alpha", "direction", "effect_median", "copying"]


def table(rows: list[tuple]) -> pd.DataFrame:
    """A mechanism table from ``(layer, head, closed, alpha, direction, effect_median, copying)`` rows (P 0.95 for
    closed heads, 0.3 for the others)."""
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["P"] = np.where(df["closed"], 0.95, 0.3)
    df["alpha_P"] = df["alpha"] * df["P"]
    df["copying_own"] = df["copying"]
    df["median_diff"] = 0.1 * df["direction"]
    df.index = [f"L{a}H{b}" for a, b in zip(df["layer"], df["head"])]
    return df


def mech(rows: list[tuple], name: str = "m", tied: bool = True, threshold: float = 0.9) -> Mechanism:
    return Mechanism(
        table(rows), pd.DataFrame(), {"model_name": name, "tied": tied, "threshold": threshold}, None, None, TIE
    )


def brute_p(strata: list[tuple[list[float], int]]) -> tuple[float, float, int]:
    """``(difference, two-sided p, relabellings)``: every relabelling of the closed label within each stratum
    (``(values, n_closed)``, the closed heads' values first), the difference of the pooled means closed - controls."""
    n_c = sum(c for _, c in strata)
    n_k = sum(len(v) - c for v, c in strata)

    def diff(choice: tuple[tuple[int, ...], ...]) -> float:
        closed = sum(v[i] for (v, _), idx in zip(strata, choice) for i in idx)
        total = sum(sum(v) for v, _ in strata)
        return closed / n_c - (total - closed) / n_k

    observed = diff(tuple(tuple(range(c)) for _, c in strata))
    every = [diff(ch) for ch in itertools.product(*(itertools.combinations(range(len(v)), c) for v, c in strata))]
    hits = sum(abs(d) >= abs(observed) - 1e-9 for d in every)
    return observed, hits / len(every), len(every)


def within_spearman_exact(x: np.ndarray, y: np.ndarray, strata: np.ndarray) -> float:
    """Two-sided p of Spearman's ρ over every permutation of ``x`` within strata (spearman_permutation's convention,
    written out: ranks permuted, ``min(1, 2 min(P[<=], P[>=]))``)."""
    rho = spearmanr(x, y).statistic
    groups = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    null = []
    for perms in itertools.product(*(itertools.permutations(g) for g in groups)):
        xp = x.copy()
        for g, p in zip(groups, perms):
            xp[g] = x[list(p)]
        null.append(np.corrcoef(rankdata(xp), rankdata(y))[0, 1])
    null = np.array(null)
    tol = abs(rho) * np.finfo(float).eps * 100
    return min(1.0, 2 * min(np.mean(null <= rho + tol), np.mean(null >= rho - tol)))


# --------------------------------------------------------------------------- populations


def predicting(i: int) -> list[tuple]:
    """2 layers x 4 heads; heads 0, 1 closed and agreeing (α > 0, direction +1), heads 2, 3 not, disagreeing; |α|
    of closed head h nearest non-closed head h + 2. Effects from a seeded generator."""
    rng = np.random.default_rng(100 + i)
    rows = []
    for layer in range(2):
        for h in range(4):
            closed = h < 2
            alpha = 1.0 + 0.1 * (h % 2) + (0.02 if not closed else 0.0) + 0.3 * layer
            direction, copying = (1.0, 0.5) if closed else (-1.0, -0.2)
            rows.append((layer, h, closed, alpha, direction, float(rng.normal()), copying))
    return rows


def everyone_agrees(i: int) -> list[tuple]:
    return [(lay, h, c, a, 1.0, e, cop) for lay, h, c, a, _, e, cop in predicting(i)]


def depth_only(i: int) -> list[tuple]:
    """3 layers x 6 heads: α·P and the effect both rise with layer; within a layer their ranks are unrelated
    (ρ = -0.086). Layer 2 holds 3 closed heads and 3 non-closed ones, all agreeing; layers 0 and 1 no closed head,
    all disagreeing."""
    y_rank = [3, 6, 1, 5, 2, 4]
    rows = []
    for layer in range(3):
        for h in range(6):
            closed = layer == 2 and h < 3
            alpha = 10.0 * layer + 1.0 + h * 0.1 + i * 0.01
            effect = 10.0 * layer + y_rank[h]
            rows.append((layer, h, closed, alpha, 1.0 if layer == 2 else -1.0, effect, 0.5))
    return rows


def test_predicting_population_every_statistic_by_hand():
    mechs = {f"m{i}": mech(predicting(i), f"m{i}") for i in range(2)}
    cmp = compare_mechanisms(mechs, n_permutations=999)
    t = cmp.table.set_index("model")
    assert list(cmp.table.columns) == list(ROW_COLUMNS)
    for label, m in mechs.items():
        r, tab = t.loc[label], m.table
        closed = tab["closed"].to_numpy()
        assert (r["n_heads"], r["n_closed"], r["n_sign_tested"], r["n_agree"]) == (8, 4, 4, 4)
        assert r["agree_rate"] == 1.0 and r["sign_test_p"] == binomtest(4, 4, 0.5).pvalue == 0.125
        assert r["sign_test_floor"] == 0.125
        assert (r["n_other_tested"], r["n_other_agree"], r["other_agree_rate"]) == (4, 0, 0.0)
        assert r["base_rate_fisher_p"] == pytest.approx(fisher_exact([[4, 0], [0, 4]]).pvalue)
        # matched: one control per closed head, within its layer, nearest |α|: h -> h + 2
        h = cmp.heads[cmp.heads["model"] == label].set_index("label")
        assert list(h.index[h["matched"] == "closed"]) == ["L0H0", "L0H1", "L1H0", "L1H1"]
        assert list(h.index[h["matched"] == "control"]) == ["L0H2", "L0H3", "L1H2", "L1H3"]
        d, p, n = brute_p([([1, 1, 0, 0], 2), ([1, 1, 0, 0], 2)])
        assert (r["matched_difference"], r["matched_p"], r["matched_method"]) == (d, p, "exact")
        assert (d, p) == (1.0, 2 / 36)
        assert r["matched_p_floor"] == 1 / n == 1 / 36
        assert (r["matched_closed_rate"], r["matched_control_rate"]) == (1.0, 0.0)
        # Spearman: ρ is scipy's; the within-layer p every within-layer permutation (4!^2 = 576 <= 999: exact)
        x, y = tab["alpha_P"].to_numpy(), tab["effect_median"].to_numpy()
        assert r["spearman_rho"] == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
        assert r["spearman_p_within_layer"] == pytest.approx(within_spearman_exact(x, y, tab["layer"].to_numpy()))
        # copying sign = sign(α): closed 4 of 4 (copying +0.5), non-closed 0 of 4 (copying -0.2)
        assert (r["copying_rate_closed"], r["copying_rate_other"]) == (1.0, 0.0)
        assert r["copying_fisher_p"] == pytest.approx(fisher_exact([[4, 0], [0, 4]]).pvalue)
        # the mechanism's own tests agree where they overlap
        _, _, own = derive_tests(tab, 1, 0)
        assert (own["n_sign_tested"], own["n_agree"]) == (r["n_sign_tested"], r["n_agree"])
        assert own["spearman_rho"] == pytest.approx(r["spearman_rho"], abs=1e-12)
        assert closed.sum() == r["n_closed"]
    s = cmp.summary
    d, p, n = brute_p([([1, 1, 0, 0], 2)] * 4)  # 2 models x 2 layers, relabelled within each
    assert (s["pooled_difference"], s["pooled_p"], s["pooled_n_relabelings"]) == (d, p, n) == (1.0, 2 / 6**4, 6**4)
    assert s["pooled_method"] == "exact" and s["pooled_p_floor"] == 1 / 6**4
    assert (s["n_pooled_closed"], s["n_pooled_controls"], s["n_models_compared"]) == (8, 8, 2)
    assert (s["n_models_positive"], s["n_models_negative"], s["n_models_zero"]) == (2, 0, 0)
    assert s["models_sign_test_p"] == binomtest(2, 2, 0.5).pvalue == 0.5
    assert (s["n_agree"], s["n_sign_tested"], s["sign_test_p"]) == (8, 8, binomtest(8, 8).pvalue)
    assert (s["n_other_agree"], s["n_other_tested"]) == (0, 8)
    assert s["answer"] == "yes"
    assert cmp.headline.startswith(QUESTION + " Yes: pooled over the 2 of 2 measured")
    assert "difference +1.00, p = 0.0015" in cmp.headline


def test_no_prediction_above_chance_is_not_above_controls():
    cmp = compare_mechanisms({f"m{i}": mech(everyone_agrees(i)) for i in range(3)}, n_permutations=999)
    t, s = cmp.table, cmp.summary
    assert (t["n_agree"] == 4).all() and (t["n_other_agree"] == 4).all()
    assert (t["matched_difference"] == 0).all() and (t["matched_p"] == 1).all()
    assert (s["pooled_difference"], s["pooled_p"], s["n_models_zero"]) == (0.0, 1.0, 3)
    assert math.isnan(s["models_sign_test_p"])  # no model with a nonzero difference
    assert s["sign_test_p"] == binomtest(12, 12).pvalue < 0.05
    assert s["answer"] == "not detectably"
    assert "Not detectably" in cmp.headline
    assert any(c.startswith("closed heads agree more often than 1/2 (12 of 12") for c in s["holds"])
    assert "non-closed heads: 12 of 12, 100%" in cmp.headline
    # the copying sign's rates are a description beside the base rate, never a finding that "holds"
    assert not any("copying has the sign" in c for c in s["holds"])
    assert any(c.startswith("whether copying has the sign of α more often for closed heads") for c in s["untestable"])


def test_depth_only_is_not_mistaken_for_closure():
    mechs = {f"m{i}": mech(depth_only(i)) for i in range(4)}
    cmp = compare_mechanisms(mechs, n_permutations=999)
    t, s = cmp.table, cmp.summary
    # unstratified, closed heads look different: 3 of 3 agree against 3 of 15 non-closed heads
    assert (t["n_agree"] == 3).all() and (t["n_other_agree"] == 3).all() and (t["n_other_tested"] == 15).all()
    assert t["base_rate_fisher_p"].iloc[0] == pytest.approx(fisher_exact([[3, 0], [3, 12]]).pvalue)
    # within the layer, closed heads and their controls agree alike: no difference, p = 1
    assert (t["matched_difference"] == 0).all() and (t["matched_p"] == 1).all()
    assert (s["pooled_difference"], s["pooled_p"]) == (0.0, 1.0)
    assert s["answer"] == "not detectably"
    # α·P tracks the effect across layers only: unstratified p small, within layers large
    x, y = mechs["m0"].table["alpha_P"].to_numpy(), mechs["m0"].table["effect_median"].to_numpy()
    assert (t["spearman_p_unstratified"] < 0.01).all() and spearmanr(x, y).pvalue < 1e-4  # scipy's t approximation
    assert (t["spearman_p_within_layer"] > 0.5).all()
    assert s["spearman_p_within"] > 0.05
    assert any(c.startswith("α·P tracks the effect within (model, layer) strata") for c in s["does_not_hold"])


def test_strata_are_model_and_layer_never_pooled_across_models():
    """Model A: closed agree, controls not; B: every head disagrees; C: every head agrees. Relabelled within each
    (model, layer) only A moves: p = 2/6 = 1/3. Pooled across models (one stratum) it would be 524/924."""

    def one(values: list[float]) -> Mechanism:
        rows = [(0, h, h < 2, 1.0 + 0.1 * (h % 2) + 0.01 * (h >= 2), 1.0 if v else -1.0, 0.1 * h, 0.5)
                for h, v in enumerate(values)]  # fmt: skip
        return mech(rows)

    cmp = compare_mechanisms({"A": one([1, 1, 0, 0]), "B": one([0, 0, 0, 0]), "C": one([1, 1, 1, 1])})
    s = cmp.summary
    d, p, n = brute_p([([1, 1, 0, 0], 2), ([0, 0, 0, 0], 2), ([1, 1, 1, 1], 2)])
    assert (s["pooled_difference"], s["pooled_p"], s["pooled_n_relabelings"]) == (d, p, n)
    assert p == pytest.approx(1 / 3)
    d_flat, p_flat, _ = brute_p([([1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], 6)])  # closed first: A's, C's, then B's
    assert d_flat == pytest.approx(d) and p_flat == pytest.approx(524 / 924) != pytest.approx(s["pooled_p"])
    assert (s["n_models_positive"], s["n_models_zero"]) == (1, 2)


def test_no_model_is_dropped():
    untied = mech([(lay, h, False, 0.01, 1.0, 0.1 * h + lay, 0.9) for lay in range(2) for h in range(4)], tied=False)
    err = UnsupportedModelError("an encoder attends bidirectionally")
    cmp = compare_mechanisms({"tied": mech(predicting(0)), "untied": untied, "encoder": err}, n_permutations=99)
    t, s = cmp.table, cmp.summary
    assert list(t["model"]) == ["tied", "untied", "encoder"]
    assert list(t["status"]) == ["measured", "measured", "refused"]
    assert t.loc[2, "notes"] == "refused: UnsupportedModelError: an encoder attends bidirectionally"
    assert t.loc[2, "n_closed"] == 0 and math.isnan(t.loc[2, "agree_rate"]) and t.loc[2, "tied"] is None
    assert t.loc[1, "n_closed"] == 0 and t.loc[1, "notes"].startswith("no head is closed")
    assert (s["n_models"], s["n_measured"], s["n_refused"], s["refused"]) == (3, 2, 1, ["encoder"])
    assert (s["n_tied"], s["n_untied"], s["n_heads"], s["n_closed"]) == (1, 1, 16, 4)
    assert s["untestable"][:1] == ["1 of 2 models have no closed head (untied)"] and len(s["untestable"]) == 2
    assert "Refused (1, rows with the reason): encoder." in cmp.headline
    assert set(cmp.heads["model"]) == {"tied", "untied"} and len(cmp.heads) == 16


def test_layer_without_controls_and_undefined_answer():
    rows = [(lay, h, lay == 1, 0.3 + 0.01 * h, 1.0, float(lay), 1.0) for lay in range(2) for h in range(4)]
    cmp = compare_mechanisms({"lin": mech(rows)}, n_permutations=99)
    r, s = cmp.table.iloc[0], cmp.summary
    assert r["n_matched_closed"] == 0 and r["matched_method"] == "none" and math.isnan(r["matched_p"])
    assert r["notes"].startswith("layer 1: no non-closed head to match 4 closed heads with; no layer has both")
    assert s["answer"] == "undefined" and "Undefined: no model of 1 measured" in cmp.headline
    assert s["untestable"][0].startswith("1 of 1 models have no matched control")


def test_seeded_draws_reproduce():
    mechs = {f"m{i}": mech(depth_only(i)) for i in range(2)}
    a = compare_mechanisms(mechs, n_permutations=199, seed=3)
    b = compare_mechanisms(mechs, n_permutations=199, seed=3)
    pd.testing.assert_frame_equal(a.table, b.table)
    assert a.summary == b.summary
    c = compare_mechanisms(mechs, n_permutations=199, seed=4)
    assert c.table["spearman_p_within_layer"].tolist() != a.table["spearman_p_within_layer"].tolist()


def test_refusals():
    m = mech(predicting(0))
    with pytest.raises(OptionTypeError, match="a mapping"):
        compare_mechanisms([m])
    with pytest.raises(OptionError, match="at least one"):
        compare_mechanisms({})
    with pytest.raises(OptionTypeError, match="'x': a value must be a Mechanism"):
        compare_mechanisms({"x": "smollm2-135m"})
    with pytest.raises(OptionError, match="'b' and 'a' are the same mechanism result"):
        compare_mechanisms({"a": m, "b": m})
    with pytest.raises(OptionError, match="different P thresholds"):
        compare_mechanisms({"a": m, "b": mech(predicting(1), threshold=0.8)})
    no_direction = table(predicting(0)).drop(columns=["direction"])
    bad = Mechanism(no_direction, pd.DataFrame(), {"threshold": 0.9}, None, None, TIE)
    with pytest.raises(OptionError, match=r"'a' lacks the columns \['direction'\]"):
        compare_mechanisms({"a": bad})
    with pytest.raises(OptionError, match="no column 'norm'"):
        compare_mechanisms({"a": m}, match_by="norm")
    with pytest.raises(UnknownOptionError):
        compare_mechanisms({"a": m}, n_perm=9)
    with pytest.raises(OptionError, match="n_controls"):
        compare_mechanisms({"a": m}, n_controls=0)
    with pytest.raises(UnknownOptionError):  # one name for one thing: k is the token readout's top/bottom size
        compare_mechanisms({"a": m}, k=1)


def test_result_export_display_figure(tmp_path):
    cmp = compare_mechanisms({"a": mech(predicting(0)), "enc": UnsupportedModelError("encoder")}, n_permutations=99)
    assert isinstance(cmp, MechanismComparison) and repr(cmp).startswith("MechanismComparison(n_models=2")
    with pytest.raises(Exception, match="immutable"):
        cmp.table = None
    t = cmp.table
    t.loc[0, "n_closed"] = 99
    assert cmp.table.loc[0, "n_closed"] == 4  # a copy on each read
    csv = pd.read_csv(cmp.export(tmp_path / "p.csv"))
    assert list(csv["model"]) == ["a", "enc"] and list(csv.columns) == list(ROW_COLUMNS)
    rec = json.loads((tmp_path / "p.json").read_text()) if cmp.export(tmp_path / "p.json") else None
    assert rec["summary"]["headline"] == cmp.headline and rec["table"][1]["agree_rate"] is None
    with pytest.raises(OptionError, match="html"):
        cmp.export(tmp_path / "p.html")
    html = cmp._repr_html_()
    assert "MechanismComparison" in html and "refused: UnsupportedModelError: encoder" in html
    fig = cmp.figure()
    assert [tr.name for tr in fig.data] == ["non-closed heads (base rate)", "matched controls", "closed heads"]
    assert list(fig.data[2].y[:1]) == [1.0] and math.isnan(fig.data[2].y[1])
    assert "refused" not in str(cmp) or "enc" in str(cmp)
