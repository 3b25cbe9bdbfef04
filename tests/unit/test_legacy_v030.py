"""Saved folders of 0.3.0 still load (issue 45): the folders of tests/data/v030 (made at commit 13de6bd by
tests/data/v030/make.py on ``tiny_hf_dir(arch="llama", n_layers=2)``, seed 0) against the numbers the old code
computed (numbers.json); tests/integration/test_legacy_v030.py compares them with what this version computes on
the same model (building it is the cost of a quick-tier file).

Head tokens and the attended-token effect changed layout after 0.3.0 (issue 46): their upgrade
(``probes/legacy.py``) recomputes what the saved tables determine and leaves NaN, with a reason in
``summary["not_measured"]`` and the headline, what needs the model. A mechanism of 0.3.0 (``mechanism/1``) loads the
same way (``report/mechanism_legacy.py``): checked as written, its tests recomputed, its controls, base rates,
projection facts, intervals and split not measured.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tests.helpers import redigest

import tl_idempotence as tli
from tl_idempotence.core.legacy import NOT_MEASURED
from tl_idempotence.errors import ReportFileError

DATA = Path(__file__).resolve().parents[1] / "data" / "v030"
NUMBERS = json.loads((DATA / "numbers.json").read_text())
WHY_TOKENS = "not in a 0.3.0 save: recompute with tli.head_tokens(model, ...)"
WHY_EFFECT = "not in a 0.3.0 save: recompute with tli.attended_token_effect(model, texts, predicted_k=10)"


def floats(s) -> list[float]:
    return [np.nan if v is None else v for v in s]


def frame(split: dict) -> pd.DataFrame:
    """A frame numbers.json holds (``to_json(orient="split")``)."""
    return pd.DataFrame(split["data"], columns=split["columns"], index=split["index"])


@pytest.fixture(scope="module")
def tokens():
    return tli.load_head_tokens(DATA / "head_tokens")


@pytest.fixture(scope="module")
def effect():
    return tli.load_attended_token_effect(DATA / "attended_token_effect")


def test_report_and_roles_load_with_their_numbers():
    rep = tli.load_report(DATA / "report")
    n = NUMBERS["report"]
    np.testing.assert_array_equal(rep.heads["P"].to_numpy(), floats(n["P"]))
    np.testing.assert_array_equal(rep.heads["alpha"].to_numpy(), floats(n["alpha"]))
    assert rep.headline == n["headline"]
    roles = tli.load_roles(DATA / "head_roles")
    assert type(roles).__name__ == "HeadRoles"
    for col in ("induction", "copying"):
        np.testing.assert_array_equal(roles.table[col].to_numpy(), floats(NUMBERS["head_roles"][col]))
    assoc = tli.load_roles(DATA / "role_association")
    want = frame(NUMBERS["role_association"]["association"])  # written to 10 digits
    got = assoc.association
    for col in ("spearman_rho", "spearman_p", "median_other"):
        np.testing.assert_allclose(got[col].to_numpy(dtype=float), want[col].to_numpy(dtype=float), atol=1e-10)


def test_head_tokens_of_030_load_recomputed_and_marked(tokens):
    n = NUMBERS["head_tokens"]
    t = tokens.table
    assert list(t.index) == n["labels"]
    for col in ("self_rank_median", "frac_top_k", "frac_bottom_k", "sv_1"):
        np.testing.assert_array_equal(t[col].to_numpy(), floats(n[col]), err_msg=col)
    assert tokens.self_cosines.isna().all().all()  # needs the model: NaN, and said so
    assert dict(tokens.summary[NOT_MEASURED]) == {"self_cosines and the *_cosine token lists": WHY_TOKENS}
    assert tokens.headline.endswith(f"Not measured: self_cosines and the *_cosine token lists ({WHY_TOKENS}).")
    assert not tokens.top_tokens("L0H0")["kind"].str.endswith("_cosine").any()


def test_attended_token_effect_of_030_loads_recomputed_and_marked(effect):
    n = NUMBERS["attended_token_effect"]
    old = frame(n["table"])  # written to 15 digits
    t = effect.table
    for col in n["columns"][3:]:
        np.testing.assert_allclose(t[col].to_numpy(dtype=float), old[col].to_numpy(dtype=float), rtol=1e-12)
    split = [c for c in t.columns if c.endswith(("_predicted", "_unpredicted")) and not c.startswith("n_")]
    assert t[split].isna().all().all() and (t[["n_predicted", "n_unpredicted"]] == 0).all().all()
    assert effect.positions["predicted"].isna().all() and effect.summary["predicted_k"] is None
    assert dict(effect.summary[NOT_MEASURED]) == {
        "the copy-suppression split (n_predicted, *_predicted, *_unpredicted)": WHY_EFFECT
    }
    assert WHY_EFFECT in effect.headline


def test_a_resave_loads_as_this_versions_layout(tokens, effect, tmp_path):
    for res, load, rec, tables in (
        (tokens, tli.load_head_tokens, "head_tokens.json", {"table", "self_ranks", "self_cosines", "top"}),
        (effect, tli.load_attended_token_effect, "attended_token_effect.json", {"table", "positions"}),
    ):
        d = Path(res.save(tmp_path / rec[:-5]))
        saved = json.loads((d / rec).read_text())
        assert set(saved["files"]) == tables and saved["summary"][NOT_MEASURED] == dict(res.summary[NOT_MEASURED])
        back = load(d)
        assert back.headline == res.headline and back.loaded_from == str(d)
        pd.testing.assert_frame_equal(back.table, res.table)
        redigest(d, rec, fields=lambda r: r["summary"].update(headline=r["summary"]["headline"].split(" Not")[0]))
        with pytest.raises(ReportFileError, match=rf"{rec}.*headline"):  # the mark is part of what is checked
            load(d)


@pytest.fixture(scope="module")
def mech():
    return tli.load_mechanism(DATA / "mechanism")


def test_a_mechanism_of_030_loads_recomputed_and_marked(mech):
    """What the saved tables give is recomputed (the 0.3.0 across-layers Spearman p comes back as today's
    unstratified p); what needs every measured head's weights or the model is NaN / None, named, and the headline
    says so after what was measured."""
    from tl_idempotence.report.mechanism_legacy import V030_NOT_MEASURED
    from tl_idempotence.report.mechanism_tables import PROJECTION_COLUMNS, TABLE_COLUMNS

    old = pd.read_parquet(DATA / "mechanism" / "table.parquet")
    t = mech.table
    assert tuple(t.columns) == TABLE_COLUMNS and list(t.index) == NUMBERS["head_tokens"]["labels"]
    for col in ("P", "alpha", "alpha_P", "effect_median", "effect_q", "copying", "copying_own", "self_rank_median"):
        np.testing.assert_array_equal(t[col].to_numpy(dtype=float), old[col].to_numpy(dtype=float), err_msg=col)
    eff = mech.effect.table
    np.testing.assert_array_equal(t["direction"].to_numpy(), eff["direction"].to_numpy())
    np.testing.assert_array_equal(t["aligned_diff"], np.sign(t["alpha"]) * eff["median_diff"])  # 0 here: ties
    from tl_idempotence.report.mechanism_legacy import derived_v030

    md = np.linspace(-1.0, 1.0, len(t))  # the saved effect's medians of effect - null are all 0 (tied positions)
    fresh, _, _ = derived_v030(t.assign(median_diff=md), mech.summary)
    np.testing.assert_array_equal(fresh["aligned_diff"], np.sign(t["alpha"]) * md)
    a, dr = np.sign(t["alpha"].to_numpy()), t["direction"].to_numpy()
    want = [None if x == 0 or y == 0 else bool(x == y) for x, y in zip(a, dr)]
    assert [None if pd.isna(v) else bool(v) for v in t["agrees_alpha"]] == want and want.count(True) == 6
    assert t["sign_agrees"].isna().all()  # no closed head
    assert t["asked"].all() and (t["control_of"] == "").all()
    s = mech.summary
    assert (s["n_closed"], s["n_sign_tested"], s["n_spearman"], s["n_strata"]) == (0, 0, 18, 2)
    assert s["spearman_rho"] == 0.2776057791537668 and s["spearman_p_unstratified"] == 0.34  # 0.3.0's own
    assert s["spearman_p"] == s["spearman_p_within_layer"] == 0.36
    lo_hi = [c for c in t.columns if c.endswith(("_lo", "_hi"))] + ["direction_stability", *PROJECTION_COLUMNS[::2]]
    assert t[lo_hi].isna().all().all() and (t[["proj_rank", "proj_rank_any"]] == -1).all().all()
    assert t["direction_kept"].isna().all() and mech.weights["norm"].isna().all()
    assert all(s[k] is None for k in ("matched", "base_rates", "projection", "stability", "copy_suppression"))
    assert dict(s[NOT_MEASURED]) == V030_NOT_MEASURED
    head = NUMBERS["mechanism"]["headline"].split(" (permutation p")[0]
    assert mech.headline.startswith(head + " (within-layer permutation p = 0.36, 2 layers")
    assert "across layers p = 0.34" in mech.headline
    assert mech.headline.endswith(
        ". Not measured: " + "; ".join(f"{k} ({v})" for k, v in V030_NOT_MEASURED.items()) + "."
    )
    assert dict(mech.effect.summary[NOT_MEASURED]) and dict(mech.tokens.summary[NOT_MEASURED])


def test_a_resaved_030_mechanism_loads_as_this_versions_layout(mech, tmp_path):
    d = Path(mech.save(tmp_path / "m"))
    saved = json.loads((d / "mechanism.json").read_text())
    assert saved["format"] == "tl_idempotence.mechanism/2"
    assert set(saved["files"]) == {"table", "signs", "weights", "stability"}
    back = tli.load_mechanism(d)
    assert back.headline == mech.headline and back.loaded_from == str(d)
    pd.testing.assert_frame_equal(back.table, mech.table)
    assert dict(back.summary[NOT_MEASURED]) == dict(mech.summary[NOT_MEASURED])
    redigest(d, "mechanism.json", fields=lambda r: r["summary"].update(headline=mech.headline.split(" Not")[0]))
    with pytest.raises(ReportFileError, match=r"mechanism\.json.*headline"):
        tli.load_mechanism(d)


def test_a_030_mechanism_that_lies_about_its_tests_is_refused_by_name(tmp_path):
    """0.3.0's own numbers are checked as written before the upgrade replaces them (more: the integration file)."""
    d = shutil.copytree(DATA / "mechanism", tmp_path / "m")
    redigest(d, "mechanism.json", fields=lambda r: r["summary"].update(spearman_p=0.04))
    with pytest.raises(ReportFileError, match=rf"{d}/mechanism\.json was edited: summary\['spearman_p'\] is 0\.04"):
        tli.load_mechanism(d)


def test_the_headline_of_a_030_mechanism_never_answers_beyond_controls():
    """A sign test that holds against chance says the matched controls were not measured (never a bare "Yes")."""
    from tl_idempotence.probes.tied import EmbeddingTie
    from tl_idempotence.report.mechanism_headline import mechanism_headline

    tie = EmbeddingTie(tied=False, how="untied", max_abs_diff=0.1, max_rel_diff=1.0, declared=False, dtypes="f")
    s = {"n_closed": 8, "n_sign_tested": 8, "n_agree": 8, "sign_test_p": 2 / 256, "spearman_rho": math.nan,
         "n_spearman": 2, "matched": None, "stability": None, "copy_suppression": None, "base_rates": None}  # fmt: skip
    assert ("Yes against chance (matched controls not measured): 8 of 8") in mechanism_headline(s, tie)
    s["matched"] = {}
    assert "(no matched control to compare with)" in mechanism_headline(s, tie)


@pytest.mark.parametrize(
    ("name", "record", "table", "edit", "match"),
    [
        ("head_tokens", "head_tokens.json", None, lambda r: r["summary"].update(median_self_rank=0.25), "median"),
        ("head_tokens", "head_tokens.json", "self_ranks", lambda df: df.assign(L0H0=0.0), "self_rank_median"),
        ("head_tokens", "head_tokens.json", None, lambda r: r["summary"].update(not_measured="x"), "not_measured"),
        ("attended_token_effect", "attended_token_effect.json", "positions", lambda df: df.assign(
            effect=df["effect"] + 0.5), "effect"),
        ("attended_token_effect", "attended_token_effect.json", None, lambda r: r["summary"].update(
            convention="other"), "convention"),
        ("attended_token_effect", "attended_token_effect.json", None, lambda r: r["info"].update(n_kv_heads=9), ""),
    ],
)  # fmt: skip
def test_an_edited_030_save_is_refused_by_name(tmp_path, name, record, table, edit, match):
    """A 0.3.0 folder that lies (an edit with its digests recomputed) is refused naming its file, as any save."""
    d = shutil.copytree(DATA / name, tmp_path / name)
    if table is None:
        redigest(d, record, fields=edit)
    else:
        redigest(d, record, tables={table: edit})
    load = tli.load_head_tokens if name == "head_tokens" else tli.load_attended_token_effect
    with pytest.raises(ReportFileError, match=str(d)) as e:
        load(d)
    assert match in str(e.value)


def test_a_truncated_030_table_is_refused_by_name(tmp_path):
    d = shutil.copytree(DATA / "head_tokens", tmp_path / "ht")
    f = d / "self_ranks.parquet"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ReportFileError, match=r"self_ranks\.parquet"):
        tli.load_head_tokens(d)


def test_a_030_mechanism_cannot_enter_a_population(mech):
    """Its controls were not measured: tli.compare_mechanisms refuses it, naming the label and what is missing,
    rather than pooling it with results whose controls were matched over every head of their layer."""
    from tl_idempotence.errors import OptionError

    with pytest.raises(OptionError, match=r"mechanisms\['old'\] was saved by an earlier version .*matched controls"):
        tli.compare_mechanisms({"old": mech})


def test_a_resaved_030_head_tokens_stripped_of_its_mark_is_refused(tokens, tmp_path):
    """Its cosines are missing at every ranked token: only a save that says they were not measured may hold that."""

    def strip(rec):
        rec["summary"].pop(NOT_MEASURED)
        rec["summary"]["headline"] = rec["summary"]["headline"].split(" Not measured:")[0]

    d = Path(tokens.save(tmp_path / "t"))
    redigest(d, "head_tokens.json", fields=strip)
    with pytest.raises(ReportFileError, match=r"self_cosines\.parquet.*no self-cosine at any token"):
        tli.load_head_tokens(d)


def _set(df: pd.DataFrame, col: str, row: int, v) -> pd.DataFrame:
    df = df.copy()
    df.loc[row, col] = v
    return df


_COSINE_ROW = pd.DataFrame([{"label": "L0H0", "kind": "promoted_cosine", "rank": 1, "token_id": 4, "token": "w4",
                             "value": 0.9}])  # fmt: skip


@pytest.mark.parametrize(
    ("name", "tables", "fields", "match"),
    [
        ("head_tokens", {"top": lambda df: _set(df, "token_id", 0, 4)}, None, "L0H0's promoted/suppressed rows"),
        ("head_tokens", {"top": lambda df: _set(df, "value", 5, 0.9)}, None, "L0H0's promoted/suppressed rows"),
        ("head_tokens", {"top": lambda df: df[~((df["label"] == "L1H2") & (df["kind"] == "suppressed"))]}, None,
         "L1H2's promoted/suppressed rows"),
        ("head_tokens", {"top": lambda df: pd.concat([df, _COSINE_ROW], ignore_index=True)}, None,
         r"it lists L0H0's kinds \['promoted_cosine'\]"),
        ("head_tokens", {"top": lambda df: df.assign(label=df["label"].replace("L0H0", "L9H0"))}, None, "L9H0"),
        ("head_tokens", None, lambda r: r["summary"].update(headline=r["summary"]["headline"] + " x"), "headline"),
        ("head_tokens", None, lambda r: r["options"].update(extra=1), r"its options has fields \['extra'\]"),
        ("attended_token_effect", None, lambda r: r["summary"].update(n_negative_q05=3), "n_negative_q05"),
        ("attended_token_effect", None, lambda r: r["summary"].update(n_positive_q05=1), "n_positive_q05"),
        ("attended_token_effect", None, lambda r: r["summary"].update(headline=r["summary"]["headline"] + " x"),
         "headline"),
        ("attended_token_effect", None, lambda r: r["options"].update(predicted_k=10),
         r"its options has fields \['predicted_k'\]"),
        ("attended_token_effect", None, lambda r: r["summary"].update(predicted_k=10),
         r"its summary has fields \['predicted_k'\]"),
    ],
)  # fmt: skip
def test_a_030_save_is_checked_as_written_before_its_upgrade(tmp_path, name, tables, fields, match):
    """What 0.3.0 derived and the upgrade recomputes (the self lists, the counts by the median's sign, the headlines)
    is first checked equal to what 0.3.0's rules give from the saved tables, and the record holds only 0.3.0's fields:
    a lie is refused naming its file, never overwritten (found by a hostile review)."""
    d = shutil.copytree(DATA / name, tmp_path / name)
    redigest(d, f"{name}.json", tables=tables, fields=fields)
    load = tli.load_head_tokens if name == "head_tokens" else tli.load_attended_token_effect
    with pytest.raises(ReportFileError, match=f"{d}.* was edited: .*{match}"):
        load(d)


def test_only_the_030_mark_excuses_missing_cosines(tokens, tmp_path):
    """A re-save whose mark names the cosines in other words (the headline kept in step) is refused: only the key a
    0.3.0 upgrade writes (``V030_COSINES``) says the cosines were not measured."""
    from tl_idempotence.probes.legacy import V030_COSINES

    other = "the self_cosines (not measured)"

    def reword(rec):
        s = rec["summary"]
        s[NOT_MEASURED] = {other: s[NOT_MEASURED].pop(V030_COSINES)}
        s["headline"] = s["headline"].replace(V030_COSINES, other)

    d = Path(tokens.save(tmp_path / "t"))
    redigest(d, "head_tokens.json", fields=reword)
    with pytest.raises(ReportFileError, match=r"self_cosines\.parquet.*no self-cosine at any token"):
        tli.load_head_tokens(d)
