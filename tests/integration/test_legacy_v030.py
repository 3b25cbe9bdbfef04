"""Saved folders of 0.3.0 (tests/data/v030, made by its make.py at commit 13de6bd) hold what this version computes
on the same model (``tiny_hf_dir(arch="llama", n_layers=2)``, seed 0), once loaded (issue 45): the report's P and α,
the upgraded head tokens (n_ranked, reason and the token lists read again from the saved ranks) and attended-token
effect (every column recomputed from the saved positions), apart from what a 0.3.0 save does not hold (NaN, with
its reason: tests/unit/test_legacy_v030.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli

DATA = Path(__file__).resolve().parents[1] / "data" / "v030"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The model the saves were made from (make.py)."""
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    torch.manual_seed(0)
    return bridge_from_dir(tiny_hf_dir(tmp_path_factory.mktemp("v030") / "tiny", arch="llama", n_layers=2))


def test_the_report_and_roles_are_todays(model):
    rep = tli.load_report(DATA / "report")
    now = tli.idempotence_report(model, nulls=8, seed=0, progress=False)
    np.testing.assert_allclose(now.heads["P"], rep.heads["P"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(now.heads["alpha"], rep.heads["alpha"], rtol=1e-12, atol=0)
    roles = tli.load_roles(DATA / "head_roles")
    now_roles = tli.head_roles(model, repeat_len=8, n_sequences=2, seed=0, progress=False)
    for col in ("previous_token", "duplicate_token", "induction", "copying"):
        np.testing.assert_allclose(now_roles.table[col], roles.table[col], rtol=1e-6, err_msg=col)


def test_head_tokens_are_todays_but_the_cosines(model):
    tokens = tli.load_head_tokens(DATA / "head_tokens")
    t = tokens.table
    tokens.check_model(model)  # the flags 0.3.0 did not record are not compared; the weights' fingerprints are
    now = tli.head_tokens(model, k=4, n_tokens=24, seed=0, progress=False)
    pd.testing.assert_frame_equal(t, now.table, check_exact=False, rtol=1e-12)  # n_ranked and reason recomputed
    pd.testing.assert_frame_equal(tokens.self_ranks, now.self_ranks)
    assert now.headline.startswith(tokens.headline.split(" Not measured:")[0])
    for lab in t.index:  # the promoted/suppressed lists, read again from the saved ranks, are today's
        a, b = tokens.top_tokens(lab), now.top_tokens(lab)
        keep = ~b["kind"].str.endswith("_cosine")
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b[keep].reset_index(drop=True), check_exact=False)


def test_the_attended_token_effect_is_todays_but_the_split(model):
    effect = tli.load_attended_token_effect(DATA / "attended_token_effect")
    t = effect.table
    split = [c for c in t.columns if c.endswith(("_predicted", "_unpredicted"))]
    effect.check_model(model)
    texts = torch.randint(4, 100, (4, 16), generator=torch.Generator().manual_seed(0))  # make.py's texts()
    now = tli.attended_token_effect(model, texts=texts, seq_len=16, max_tokens=64, batch_size=4, seed=0, progress=False)
    same = [c for c in t.columns if c not in split and c not in ("n_predicted", "n_unpredicted")]
    pd.testing.assert_frame_equal(t[same], now.table[same], check_exact=False, rtol=1e-12, atol=1e-14)
    for k in ("n_negative_q05", "n_positive_q05", "n_positions"):
        assert effect.summary[k] == now.summary[k], k
    assert now.headline.startswith(effect.headline.split(" Not measured:")[0])


def test_a_030_result_is_refused_with_another_model(tmp_path):
    from tl_idempotence.errors import ReportMismatchError
    from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

    other = bridge_from_dir(tiny_hf_dir(tmp_path / "other", arch="llama", n_layers=2, seed=1))
    with pytest.raises(ReportMismatchError, match="other attention weights"):
        tli.load_head_tokens(DATA / "head_tokens").check_model(other)


def test_a_030_mechanism_is_todays_but_what_it_does_not_hold(model):
    """What a 0.3.0 mechanism's tables determine is what rep.mechanism gives today on the same model (make.py's
    call); the rest is NaN / None and named (tests/unit/test_legacy_v030.py)."""
    mech = tli.load_mechanism(DATA / "mechanism")
    rep = tli.idempotence_report(model, nulls=8, seed=0, progress=False)
    texts = torch.randint(4, 100, (4, 16), generator=torch.Generator().manual_seed(0))  # make.py's texts()
    opts = {"n_tokens": 24, "k": 4, "seq_len": 16, "max_tokens": 64, "batch_size": 4}  # make.py's OPTS
    now = rep.mechanism(model, texts=texts, n_permutations=99, seed=0, progress=False, **opts)
    t, n = mech.table, now.table
    assert list(t.index) == list(n.index)
    same = ["layer", "head", "kv_head", "closed", "sign_agrees", "direction", "reason", "asked", "control_of",
            "agrees_alpha", "n_positions", "median_diff", "frac_top_k", "frac_bottom_k"]  # fmt: skip
    pd.testing.assert_frame_equal(t[same], n[same])
    close = ["P", "alpha", "alpha_P", "effect_median", "frac_negative", "null_median", "effect_p", "effect_q",
             "self_rank_median", "copying", "copying_own", "aligned_diff"]  # fmt: skip
    pd.testing.assert_frame_equal(t[close], n[close], check_exact=False, rtol=1e-6, atol=1e-12)
    for k in ("n_closed", "n_sign_tested", "n_agree", "n_spearman", "n_strata", "spearman_p",
              "spearman_p_unstratified", "n_closed_own_sign_alpha", "notes"):  # fmt: skip
        assert mech.summary[k] == now.summary[k], k
    assert mech.summary["spearman_rho"] == pytest.approx(now.summary["spearman_rho"], rel=1e-9)
    pd.testing.assert_frame_equal(mech.signs, now.signs, check_exact=False, rtol=1e-6)
    assert mech.headline.split(" Not measured:")[0] == now.headline  # no closed head: no control, interval or split
    # what needs the weights of every measured head or the model: today's has it, the 0.3.0 one says it has not
    assert np.isfinite(n["proj_distance"]).all() and t["proj_distance"].isna().all()
    assert now.summary["base_rates"] and mech.summary["base_rates"] is None
    assert np.isfinite(now.weights["norm"]).all() and mech.weights["norm"].isna().all()


def _closed_030(tmp_path, threshold: float):
    """The 0.3.0 mechanism save at another threshold: a folder 0.3.0 could have written (its table's ``closed`` and
    every field 0.3.0 derived from it recomputed by 0.3.0's rules), digests recomputed."""
    from tests.helpers import redigest

    from tl_idempotence.probes.tied import EmbeddingTie
    from tl_idempotence.report.mechanism_legacy import _old_headline, _old_tests

    d = Path(tmp_path) / "m"
    shutil.copytree(DATA / "mechanism", d)
    t = pd.read_parquet(d / "table.parquet")
    t["closed"] = t["P"] >= threshold
    agrees, signs, stats = _old_tests(t, 99, 0)
    t["sign_agrees"] = agrees

    def fields(r):
        s = r["summary"]
        s.update({k: "NaN" if isinstance(v, float) and not np.isfinite(v) else v for k, v in stats.items()})
        s.update(threshold=threshold, n_closed=int(t["closed"].sum()))
        s["headline"] = _old_headline({**stats, **s}, EmbeddingTie(**s["embedding_tie"]))

    redigest(d, "mechanism.json", tables={"table": lambda _: t, "signs": lambda _: signs}, fields=fields)
    return d


def test_a_030_mechanism_with_closed_heads_loads_without_controls(tmp_path):
    d = _closed_030(tmp_path, 0.03)
    m = tli.load_mechanism(d)
    closed = ["L0H5", "L0H7", "L0H8", "L1H1", "L1H2"]
    assert list(m.table.index[m.table["closed"]]) == closed and m.summary["n_sign_tested"] == 5
    assert list(m.stability["label"]) == closed and (m.stability["set"] == "set0").all()
    agree = [bool(np.sign(m.table.loc[h, "alpha"]) == m.table.loc[h, "direction"]) for h in closed]
    assert m.summary["n_agree"] == sum(agree)
    assert m.headline.startswith(
        f"{m.headline.split('?')[0]}? Too few closed heads to tell: {sum(agree)} of 5 closed heads agree"
    )
    assert "matched" not in m.headline.split(" Not measured:")[0] and (m.table["control_of"] == "").all()
    assert m.table.loc[closed, "median_diff_lo"].isna().all()
    back = tli.load_mechanism(m.save(tmp_path / "again"))
    assert back.headline == m.headline
    pd.testing.assert_frame_equal(back.stability, m.stability)


@pytest.mark.parametrize(
    ("table", "edit", "match"),
    [
        ("table", lambda df: df.assign(alpha=df["alpha"].where(df.index != 0, df["alpha"] * 1.5)), "alpha_P"),
        ("table", lambda df: df.assign(effect_median=df["effect_median"] + 1e-3), "signs.parquet"),
        ("table", lambda df: df.assign(sign_agrees=pd.array([True] * len(df), dtype="boolean")), "sign_agrees"),
        ("signs", lambda df: df.assign(n_zero=df["n_zero"] + 1), "signs.parquet"),
        (None, lambda r: r["summary"].update(n_agree=1), "n_agree"),
        (None, lambda r: r["summary"].update(spearman_p=0.04), "spearman_p"),
        (None, lambda r: r["summary"].update(headline="Yes."), "headline"),
        (None, lambda r: r["summary"].update(not_measured={"x": "y"}), "not_measured"),
        (None, lambda r: r["summary"]["conventions"].update(tokens="other"), "conventions"),
        (None, lambda r: r.update(parts=["head_tokens"]), "parts"),
        (None, lambda r: r["summary"]["attended_token_effect"].update(n_windows=5), "attended_token_effect"),
    ],
)  # fmt: skip
def test_an_edited_030_mechanism_is_refused_by_name(tmp_path, table, edit, match):
    """A 0.3.0 mechanism that lies (an edit with its digests recomputed) is refused naming its folder."""
    from tests.helpers import redigest

    from tl_idempotence.errors import ReportFileError

    d = shutil.copytree(DATA / "mechanism", tmp_path / "m")
    redigest(d, "mechanism.json", **({"fields": edit} if table is None else {"tables": {table: edit}}))
    with pytest.raises(ReportFileError, match=str(d)) as e:
        tli.load_mechanism(d)
    assert match in str(e.value)


@pytest.mark.parametrize(
    ("table", "edit", "match"),
    [
        (None, lambda r: r["summary"]["not_measured"].popitem(), "not_measured"),
        (None, lambda r: r["summary"].update(matched={}), "matched"),
        ("table", lambda df: df.assign(control_of=["L0H1", *[""] * (len(df) - 1)]), "stability.parquet"),
        ("table", lambda df: df.assign(proj_distance=0.5), "proj"),
        ("weights", lambda df: df.assign(norm=1.0), "weights"),
        ("weights", lambda df: df.iloc[:-1], "weights"),
        ("table", lambda df: df.assign(median_diff_lo=-1.0), "median_diff_lo"),
    ],
)  # fmt: skip
def test_an_edited_resave_of_a_030_mechanism_is_refused_by_name(tmp_path, table, edit, match):
    from tests.helpers import redigest

    from tl_idempotence.errors import ReportFileError

    d = Path(tli.load_mechanism(DATA / "mechanism").save(tmp_path / "m"))
    redigest(d, "mechanism.json", **({"fields": edit} if table is None else {"tables": {table: edit}}))
    with pytest.raises(ReportFileError, match=str(d)) as e:
        tli.load_mechanism(d)
    assert match in str(e.value)


def test_a_030_mechanism_with_roles_or_without_a_part(tmp_path):
    """0.3.0 saved the roles' columns when given and only the parts it held: the roles are carried, a save without
    the token readout loads with ``tokens`` None, one without the attended-token effect is refused saying why."""
    from tests.helpers import redigest

    from tl_idempotence.errors import ReportFileError

    roles = {"previous_token": 0.25, "duplicate_token": 0.5, "induction": 0.75}
    d = shutil.copytree(DATA / "mechanism", tmp_path / "roles")
    redigest(d, "mechanism.json", tables={"table": lambda df: df.assign(**roles)})
    m = tli.load_mechanism(d)
    assert list(m.table.columns[-3:]) == list(roles) and (m.table["induction"] == 0.75).all()
    assert tli.load_mechanism(m.save(tmp_path / "roles_again")).table.equals(m.table)
    d = shutil.copytree(DATA / "mechanism", tmp_path / "no_tokens")
    shutil.rmtree(d / "head_tokens")
    redigest(d, "mechanism.json", fields=lambda r: r.update(parts=["attended_token_effect"]))
    m = tli.load_mechanism(d)
    assert m.tokens is None and m.summary["head_tokens"]["k"] == 4  # 0.3.0's restated summary, as saved
    assert tli.load_mechanism(m.save(tmp_path / "no_tokens_again")).headline == m.headline
    d = shutil.copytree(DATA / "mechanism", tmp_path / "no_effect")
    shutil.rmtree(d / "attended_token_effect")
    redigest(d, "mechanism.json", fields=lambda r: r.update(parts=["head_tokens"]))
    with pytest.raises(ReportFileError, match=rf"{d}/mechanism\.json: a 0\.3\.0 mechanism saved without its attended"):
        tli.load_mechanism(d)
