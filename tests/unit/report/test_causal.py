"""``rep.causal`` (report/causal.py, SPEC 13): closed heads and matched controls edited, and compared, on a tiny
TransformerBridge (2 layers of 9 heads on 3 kv heads) whose report at threshold 0.03 closes L0H5, L0H7, L0H8, L1H1
and L1H2 (P 0.033-0.074; every other head is below 0.021). Checked against direct computations written here:

* the controls: for each closed head the non-closed head of its layer nearest in |α| (greedy, without
  replacement), by a loop over the report's heads;
* the per-head values: medians (and the loss's mean) of the probe's positions, with numpy;
* the comparison: the difference of means, and the two-sided p by enumerating every relabelling of closed and
  control **within each layer** (itertools), its floor, and the BH q (scipy);
* the headline's verdicts, the refusals, the page, the exports, the command line and the notebook display.
"""

from __future__ import annotations

import html
import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence import cli
from tl_idempotence.errors import OptionError, OptionTypeError, UnknownOptionError
from tl_idempotence.probes.causal_tables import VARIANTS
from tl_idempotence.report import causal as causal_mod
from tl_idempotence.report.causal import causal_headline
from tl_idempotence.report.causal_spec import CAUSAL
from tl_idempotence.report.join_defaults import CAUSAL_VARIANTS
from tl_idempotence.testing import tiny_hf_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLOSED = ["L0H5", "L0H7", "L0H8", "L1H1", "L1H2"]
VS = ("closure_only", "zero")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("causal_join") / "tiny", n_layers=2)


@pytest.fixture(scope="module")
def rep(bridge):
    return tli.idempotence_report(bridge, progress=False).with_threshold(0.03)


def _texts():
    toks = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(2))
    toks[:, 0] = 1
    return toks


@pytest.fixture(scope="module")
def ct(rep):
    return rep.causal(texts=_texts(), variants=VS, progress=False)


def expected_pairs(heads: pd.DataFrame, k: int = 1) -> list[tuple[str, str]]:
    """Greedy nearest |α| within each layer, without replacement (ties to the lower head), by hand."""
    out = []
    for _, g in heads.groupby("layer"):
        closed = g[g["closed"]]
        free = {lab: abs(a) for lab, a, c in zip(g.index, g["alpha"], g["closed"], strict=True) if not c}
        options = sorted(
            (abs(abs(a) - s), int(h), int(g.loc[n, "head"]), lab, n)
            for lab, a, h in zip(closed.index, closed["alpha"], closed["head"], strict=True)
            for n, s in free.items()
        )
        got: dict[str, list[str]] = {lab: [] for lab in closed.index}
        used: set[str] = set()
        for _, _, _, lab, n in options:
            if len(got[lab]) < k and n not in used:
                got[lab].append(n)
                used.add(n)
        out += [(lab, n) for lab in closed.index for n in got[lab]]
    return out


def test_the_controls_are_the_nearest_non_closed_heads_of_the_same_layer(rep, ct):
    h = rep.heads
    assert sorted(rep.closed_heads.index) == CLOSED
    pairs = ct.pairs
    assert list(zip(pairs["closed_label"], pairs["control_label"], strict=True)) == expected_pairs(h)
    for a, b in zip(pairs["closed_label"], pairs["control_label"], strict=True):
        assert h.loc[a, "layer"] == h.loc[b, "layer"] and h.loc[a, "closed"] and not h.loc[b, "closed"]
    t = ct.table
    assert list(t.index) == sorted(t.index, key=lambda x: (int(x[1]), int(x[3:])))  # the report's head order
    assert sorted(t.index[t["group"] == "closed"]) == CLOSED and (t["closed"] == (t["group"] == "closed")).all()
    assert set(t.index[t["group"] == "control"]) == set(pairs["control_label"])
    for col in ("P", "alpha", "norm"):
        np.testing.assert_array_equal(t[col], h.loc[t.index, col])
    s = ct.summary
    assert (s["n_closed"], s["n_matched"], s["n_control_heads"], s["n_controls"]) == (5, 5, 5, 1)
    two = causal_mod.plan_heads(h, CLOSED, 2, "norm")[1].pairs  # k = 2 on ‖T‖: every closed head, two controls
    assert list(zip(two["closed_label"], two["control_label"], strict=True)) == expected_pairs(
        h.assign(alpha=h["norm"]), 2
    )


def test_the_per_head_values_are_the_probes_medians(ct):
    pos, t = ct.probe.positions, ct.table
    for lab in t.index:
        for v in VS:
            p = pos[(pos["label"] == lab) & (pos["variant"] == v)]
            if not len(p):
                assert np.isnan(t.loc[lab, f"total_{v}"]) and t.loc[lab, f"reason_{v}"]
                continue
            assert t.loc[lab, f"total_{v}"] == np.median(p["total"])
            assert t.loc[lab, f"abs_total_{v}"] == abs(np.median(p["total"]))
            assert t.loc[lab, f"self_repair_{v}"] == np.median(p["direct"] - p["total"])
            assert t.loc[lab, f"loss_{v}"] == pytest.approx(np.nanmean(p["loss"]), rel=1e-12)


def _relabelled_p(values: pd.Series, layer_of: dict[str, int], closed: list[str], controls: list[str]):
    """Difference of means and its two-sided p over every relabelling within layers, enumerated by hand."""
    pool = [x for x in [*closed, *controls] if np.isfinite(values[x])]
    by_layer: dict[int, list[str]] = {}
    for x in pool:
        by_layer.setdefault(layer_of[x], []).append(x)
    n_c = {lay: sum(x in closed for x in xs) for lay, xs in by_layer.items()}

    def diff(chosen: set[str]) -> float:
        a = [values[x] for x in pool if x in chosen]
        b = [values[x] for x in pool if x not in chosen]
        return float(np.mean(a) - np.mean(b))

    obs = diff(set(closed) & set(pool))
    per_layer = [list(itertools.combinations(xs, n_c[lay])) for lay, xs in by_layer.items()]
    ds = [diff({x for part in pick for x in part}) for pick in itertools.product(*per_layer)]
    hits = sum(abs(d) >= abs(obs) - 1e-9 * max(1.0, float(np.abs(values[pool]).max())) for d in ds)
    return obs, hits / len(ds), 1 / len(ds)


def test_the_comparison_is_a_within_layer_relabelling_computed_directly(ct):
    from scipy.stats import false_discovery_control

    t, c = ct.table, ct.comparison
    closed = list(t.index[t["group"] == "closed"])
    controls = list(t.index[t["group"] == "control"])
    layer_of = {lab: int(t.loc[lab, "layer"]) for lab in t.index}
    assert list(zip(c["variant"], c["quantity"], strict=True)) == [
        (v, q) for v in VS for q in ("abs_total", "total", "self_repair", "loss")
    ]
    for _, row in c.iterrows():
        vals = t[f"{row['quantity']}_{row['variant']}"]
        obs, p, floor = _relabelled_p(vals, layer_of, closed, controls)
        assert row["difference"] == pytest.approx(obs, rel=1e-12, abs=1e-15)
        assert row["closed"] == pytest.approx(vals[closed].mean(), rel=1e-12)
        assert row["controls"] == pytest.approx(vals[controls].mean(), rel=1e-12)
        assert (row["p_value"], row["p_floor"], row["method"]) == (pytest.approx(p), pytest.approx(floor), "exact")
        assert (row["n_closed"], row["n_controls"], row["n_relabelings"]) == (5, 5, 120)  # C(6,3) x C(4,2)
    np.testing.assert_allclose(c["q_value"], false_discovery_control(c["p_value"], method="bh"), rtol=1e-12)


def test_the_headline_says_what_holds_and_what_does_not_with_the_floor(ct):
    c = ct.comparison
    assert ct.headline.startswith("Causal test of closure: 5 closed heads against 5 matched controls (same layer,")
    assert "p floor 0.0083" in ct.headline and "BH q over the 8 comparisons" in ct.headline
    holds = c[c["q_value"] <= 0.05]
    assert ("Holds (q <= 0.05): nothing." in ct.headline) == holds.empty
    only_p = c[(c["p_value"] <= 0.05) & (c["q_value"] > 0.05)]
    assert ("but not after BH" in ct.headline) == (not only_p.empty)
    assert "Too few heads" not in ct.headline
    tiny = pd.DataFrame(
        {"variant": ["zero"] * 2, "quantity": ["abs_total", "loss"], "closed": [0.5, 0.1], "controls": [0.1, 0.1],
         "p_value": [1 / 3, 1.0], "q_value": [2 / 3, 1.0], "p_floor": [1 / 3, 1 / 3]}
    )  # fmt: skip
    text = causal_headline(tiny, 1, 1, "norm")
    assert "nearest ‖T‖" in text and "Holds (q <= 0.05): nothing." in text
    assert "Too few heads to reach p <= 0.05: the smallest p the relabelling can give is 0.33." in text
    assert "|Δ logit| 0.5 vs 0.1 (p = 0.33)" in text and "Δ loss +0.1 vs +0.1 (p = 1)" in text
    none = causal_headline(tiny.iloc[:0], 0, 0, "abs_alpha")
    assert "nothing is compared" in none


def test_refusals(rep, bridge):
    kw = dict(texts=_texts(), progress=False)
    with pytest.raises(OptionError, match=r"heads \['L0H0'\] are not closed at this report's threshold"):
        rep.causal(heads=["L0H0", "L0H5"], **kw)
    with pytest.raises(OptionError, match=r"no closed head at threshold 0\.5"):
        rep.with_threshold(0.5).causal(**kw)
    with pytest.raises(OptionError, match="match_by must be one of"):
        rep.causal(match_by="abs", **kw)
    with pytest.raises(OptionTypeError, match="match_by must be one of"):
        rep.causal(match_by=1, **kw)
    with pytest.raises(OptionError, match="variants must be distinct names"):
        rep.causal(variants=["zero", "zero"], **kw)
    with pytest.raises(OptionError, match="n_controls"):
        rep.causal(n_controls=0, **kw)
    with pytest.raises(UnknownOptionError):
        rep.causal(n_control=2, **kw)
    with pytest.raises(OptionError, match="no join"):
        rep.join("causa")


def test_one_closed_head_of_a_layer_is_tested_with_its_control(rep):
    r = rep.causal(heads=["L1H2"], texts=_texts(), variants="zero", progress=False)
    assert list(r.pairs["control_label"]) == ["L1H0"] and list(r.table.index) == ["L1H0", "L1H2"]
    assert (r.comparison["n_relabelings"] == 2).all() and (r.comparison["p_floor"] == 0.5).all()
    assert "Too few heads to reach p <= 0.05: the smallest p the relabelling can give is 0.5." in r.headline


def test_the_join_is_on_the_page_in_the_exports_the_notebook_and_the_command_line(rep, ct, tiny_dir, tmp_path, capsys):
    page = Path(rep.save_html(tmp_path / "r.html", joins={"causal": ct})).read_text()
    assert '<h2 id="causal">A causal test of closure</h2>' in page and "Closed heads against matched controls" in page
    assert "Causal test: Holds (q &lt;= 0.05)" in page  # the page headline's sentence
    rec = json.loads(Path(rep.export(tmp_path / "r.json", joins={"causal": ct})).read_text())
    assert rec["causal"]["summary"]["headline"] == ct.headline and len(rec["causal"]["comparison"]) == 8
    assert [p["control_label"] for p in rec["causal"]["pairs"]] == list(ct.pairs["control_label"])
    rep.export(tmp_path / "r.csv", joins={"causal": ct})
    csv = pd.read_csv(tmp_path / "r.csv").set_index("label")
    assert csv.loc["L0H5", "causal_group"] == "closed" and math.isnan(csv.loc["L0H1", "causal_total_zero"])
    assert csv.loc["L1H2", "causal_total_zero"] == pytest.approx(ct.table.loc["L1H2", "total_zero"], rel=1e-12)
    assert html.escape(ct.headline) in ct._repr_html_() and "closure_only" in ct._repr_html_()
    with pytest.raises(OptionError, match="causal test was made with another report"):
        rep.with_threshold(0.04).export(tmp_path / "x.json", joins={"causal": ct})
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    assert "--causal" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # a checkpoint path is weights only: the usage error (exit 2)
        cli.main(["report", str(tiny_dir), "--causal", "--quiet"])
    assert e.value.code == 2 and "--causal runs the model with heads edited" in capsys.readouterr().err
    assert CAUSAL.cli is not None and CAUSAL.cli.text is not None and CAUSAL.cli.text(ct) == ct.headline
    calls = []
    fake = SimpleNamespace(causal=lambda **kw: calls.append(kw))
    CAUSAL.cli.compute(fake, "m", True, {}, SimpleNamespace(seed=3), progress=False)  # JoinFlag.run passes it
    CAUSAL.cli.compute(fake, "m", True, {}, SimpleNamespace(seed=4))
    assert calls == [{"model": "m", "seed": 3, "progress": False}, {"model": "m", "seed": 4, "progress": True}]
    assert CAUSAL.cli.takes_progress


def test_the_declared_variants_are_the_probes():
    assert CAUSAL_VARIANTS == VARIANTS and CAUSAL.defaults()["variants"] == VARIANTS
