"""Head roles joined only with the report they are of, and saved and read back as they are.

Replays: ``rep.roles(model=...)`` refuses a model of other sizes, weights or weight processing (the report-identity
check) and ``roles=`` of another model's sizes or processing; ``roles=`` with ``n_tokens``/``n_sequences``/``model``
it was not made with is refused naming them; the JSON export and the report's outputs refuse roles of another
report; a saved HeadRoles whose text fields read "NaN" or whose keys are decimal strings reads back exactly; a
roles save over the folder it was loaded from, or to a file name, is refused; the page and the notebook view say
that the signed copying median mixes copying and suppressing heads.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tl_idempotence as tli
from helpers import closed_pairs_layers, report_fingerprints
from tl_idempotence.errors import OptionError, OutputOverInputError, ReportMismatchError
from tl_idempotence.probes.roles import ROLES, HeadRoles
from tl_idempotence.report.export import export_record, report_output
from tl_idempotence.testing import bridge_from_dir, tiny_hf_dir

pytestmark = pytest.mark.bridge


@pytest.fixture(scope="module")
def rep():
    return tli.idempotence_report(closed_pairs_layers(), progress=False)


def fake_roles(rep, options=None, info=None, **cols) -> HeadRoles:
    t = rep.heads[["layer", "head", "kv_head"]].copy()
    for r in ROLES:
        t[r] = cols.get(r, 0.0)
    t["reason"] = ""
    summary: dict = {  # model_name: the info's, as load_roles checks
        "model_name": (info or rep.info).model_name,
        "n_heads": len(t),
        "layer_fingerprints": report_fingerprints(rep),
    }
    for r in ROLES:
        v = t[r].to_numpy(dtype=float)
        summary[f"median_{r}"] = float(np.nanmedian(v)) if np.isfinite(v).any() else float("nan")
    return HeadRoles(table=t, summary=summary, info=info or rep.info, options=options or {})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tiny_hf_dir(tmp_path_factory.mktemp("m") / "tiny", n_layers=2)
    b = bridge_from_dir(d)
    return d, b, tli.idempotence_report(b, progress=False, threshold=0.05)


# 1. another model, or roles of another model -----------------------------------------------------------------


def test_a_model_of_other_sizes_or_weights_is_refused(tiny, tmp_path):
    _, _, rep = tiny
    bigger = bridge_from_dir(tiny_hf_dir(tmp_path / "big", n_layers=3))
    with pytest.raises(ReportMismatchError, match="model sizes differ: n_layers 2 vs 3"):
        rep.roles(model=bigger, n_tokens=4, n_sequences=1, n_permutations=9)
    other = bridge_from_dir(tiny_hf_dir(tmp_path / "other", n_layers=2, seed=7))
    with pytest.raises(ReportMismatchError, match="attention weights differ"):
        rep.roles(model=other, n_tokens=4, n_sequences=1, n_permutations=9)


def test_a_model_processed_otherwise_is_refused(tiny):
    d, _, rep = tiny
    same = bridge_from_dir(d)  # the same weights, loaded again: accepted
    ra = rep.roles(model=same, n_tokens=4, n_sequences=1, n_permutations=9)
    assert len(ra.table) == len(rep.heads)
    same._tli_processing = {"raw": False, "fold_ln": True, "center_writing_weights": True}
    with pytest.raises(ReportMismatchError, match="weight processing differs"):
        rep.roles(model=same, n_tokens=4, n_sequences=1, n_permutations=9)


def test_roles_of_another_models_sizes_or_processing_are_refused(rep):
    bigger = fake_roles(rep, info=dataclasses.replace(rep.info, n_layers=3))
    with pytest.raises(ReportMismatchError, match="n_layers 2 vs 3"):
        rep.roles(roles=bigger, n_permutations=9)
    folded = fake_roles(rep, info=dataclasses.replace(rep.info, processing={"fold_ln": True}))
    with pytest.raises(ReportMismatchError, match="weight processing differs"):
        rep.roles(roles=folded, n_permutations=9)
    assert len(rep.roles(roles=fake_roles(rep), n_permutations=9).table) == 12


# 2. roles= with the arguments it ignores ---------------------------------------------------------------------


def test_roles_with_arguments_it_would_ignore_is_refused(rep, tiny):
    made = fake_roles(rep, options={"n_tokens": 16, "n_sequences": 8, "seed": 0})
    with pytest.raises(OptionError, match=r"n_tokens=4 \(the roles were made with 16\)"):
        rep.roles(roles=made, n_tokens=4, n_permutations=9)
    with pytest.raises(OptionError, match="n_sequences=2"):
        rep.roles(roles=made, n_sequences=2, n_permutations=9)
    with pytest.raises(ReportMismatchError, match=r"The model given, .*\(TransformerBridge\), is not the model"):
        rep.roles(roles=made, model=tiny[1], n_permutations=9)
    ok = rep.roles(roles=made, n_tokens=16, n_sequences=8, n_permutations=9)  # what it was made with
    assert ok.roles is made


# 3. roles of another report in the exports -------------------------------------------------------------------


def test_exports_refuse_roles_of_another_report(rep, tmp_path):
    assoc = rep.roles(roles=fake_roles(rep), n_permutations=9)
    other = rep.with_threshold(0.5)
    with pytest.raises(OptionError, match="another report"):
        export_record(other, assoc)
    with pytest.raises(OptionError, match="another report"):
        report_output(other, roles=assoc)
    assert export_record(rep, assoc)["roles"]["summary"] == assoc.summary


# 4. text fields that read "NaN" -------------------------------------------------------------------------------


def test_text_that_reads_nan_round_trips(rep, tmp_path):
    # (the summary's copying / error_measure texts state the probe's fixed definitions: since issue 45's contract
    # they are checked on save and load, so text that reads "NaN" is tried in the model's name only)
    made = fake_roles(rep, info=dataclasses.replace(rep.info, model_name="NaN"))
    summary = {**made.summary, "model_name": "NaN"}
    hr = HeadRoles(table=made.table, summary=summary, info=made.info, options=made.options)
    back = tli.load_roles(tli.save_roles(hr, tmp_path / "h"))
    assert back.info.model_name == "NaN" and back.info == hr.info
    assert back.summary["model_name"] == "NaN" and isinstance(back.summary["model_name"], str)
    a = rep.roles(roles=hr, n_permutations=9)
    back_a = tli.load_roles(a.save(tmp_path / "a"))
    assert back_a.summary["model_name"] == "NaN" and isinstance(back_a.summary["roles"]["model_name"], str)
    nan_roles = fake_roles(rep, copying=float("nan"))  # a float field that is NaN still reads back as NaN
    b = tli.load_roles(tli.save_roles(nan_roles, tmp_path / "n"))
    assert np.isnan(b.summary["median_copying"])


# 5. save over its own folder, or to a file name --------------------------------------------------------------


def test_save_over_the_loaded_folder_or_to_a_file_is_refused(rep, tmp_path):
    d = tli.save_roles(fake_roles(rep), tmp_path / "roles_saved")
    r = tli.load_roles(d)
    with pytest.raises(OutputOverInputError):
        tli.save_roles(r, d, overwrite=True)
    a = rep.roles(roles=fake_roles(rep), n_permutations=9)
    da = a.save(tmp_path / "assoc")
    back = tli.load_roles(da)
    for obj in (back, back.roles):
        with pytest.raises(OutputOverInputError):
            tli.save_roles(obj, da, overwrite=True)
    with pytest.raises(OptionError, match=r"folder.*save_html.*export"):
        tli.save_roles(r, tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()
    tli.save_roles(r, tmp_path / "elsewhere")  # another folder is fine


# 6. the signed copying median ----------------------------------------------------------------------------------


def test_the_signed_copying_median_is_explained(rep, tmp_path):
    cop = np.zeros(len(rep.heads))
    labels = list(rep.heads.index)
    cop[labels.index("L0H0")], cop[labels.index("L0H1")] = -0.999, 0.998
    assoc = rep.roles(roles=fake_roles(rep, copying=cop), n_permutations=9)
    closed = assoc.table[assoc.table["closed"]]
    assert assoc.association.loc["copying", "median_closed"] == pytest.approx(np.median(closed["copying"]))
    # the signed median of a mixed set is not shown; the closed heads by sign are (and the agreement with α)
    page = open(rep.save_html(tmp_path / "p.html", roles=assoc), encoding="utf-8").read()
    assert "1 copying (median |copying| 0.998), 1 suppressing (median |copying| 0.999)" in page
    assert "mixes copying" not in page
    nb = assoc._repr_html_()
    assert "closed heads: 1 copying (median |copying| 0.998), 1 suppressing (median |copying| 0.999)" in nb
    assert "by sign, below" in nb and "mixes copying" not in nb


def test_roles_made_by_hand_without_every_score_are_refused_naming_the_columns(rep):
    """A HeadRoles whose table lacks role scores (made by hand): the join names them (it raised pandas' KeyError)."""
    full = fake_roles(rep)
    t = full.table.drop(columns=["previous_token", "induction"])
    partial = HeadRoles(table=t, summary=dict(full.summary), info=full.info)
    with pytest.raises(OptionError, match=r"no column\(s\) \['previous_token', 'induction'\]"):
        rep.roles(roles=partial, n_permutations=9)
