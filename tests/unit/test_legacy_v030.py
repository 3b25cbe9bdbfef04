"""Saved folders of 0.3.0 still load (issue 45): the folders of tests/data/v030 (made at commit 13de6bd by
tests/data/v030/make.py on ``tiny_hf_dir(arch="llama", n_layers=2)``, seed 0) against the numbers the old code
computed (numbers.json); tests/integration/test_legacy_v030.py compares them with what this version computes on
the same model (building it is the cost of a quick-tier file).

Head tokens and the attended-token effect changed layout after 0.3.0 (issue 46): their upgrade
(``probes/legacy.py``) recomputes what the saved tables determine and leaves NaN, with a reason in
``summary["not_measured"]`` and the headline, what needs the model. A mechanism of 0.3.0 (``mechanism/1``) is refused
saying why; its parts load.
"""

from __future__ import annotations

import json
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


def test_a_mechanism_of_030_is_refused_and_its_parts_load():
    refused = r"mechanism/1.*saved before rep.mechanism gave matched controls.*its parts load by themselves"
    with pytest.raises(ReportFileError, match=refused):
        tli.load_mechanism(DATA / "mechanism")
    assert tli.load_head_tokens(DATA / "mechanism" / "head_tokens").summary[NOT_MEASURED]
    assert tli.load_attended_token_effect(DATA / "mechanism" / "attended_token_effect").summary[NOT_MEASURED]


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
