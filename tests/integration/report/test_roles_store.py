"""Head roles and their join with a report save and load like the report (parquet + one digested JSON record, no
pickle), and a file that lies is refused by name.

On the trained lineage's last checkpoint: ``tli.save_roles``/``RoleAssociation.save`` then ``tli.load_roles`` give
back the same tables (exactly) and summaries; a changed byte of a table, an edited record, and edits whose sha256s
and digest were recomputed (a summary median, a P that no longer fits ``closed``, an association number) are each
refused naming the file; a non-empty folder, a foreign folder and wrong types are refused; overwrite replaces only
what the earlier save wrote.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import rewrite_saved
from tl_idempotence.core.files import record_digest
from tl_idempotence.errors import MissingFileError, OptionError, OptionTypeError, ReportFileError
from tl_idempotence.report.roles import ROLES_RECORD, RoleAssociation
from tl_idempotence.testing import bridge_from_dir

pytestmark = pytest.mark.bridge


@pytest.fixture(scope="module")
def assoc(lineage):
    model = bridge_from_dir(lineage.checkpoints[-1][1])
    rep = tli.idempotence_report(model, progress=False)
    return rep.roles(model=model, n_tokens=16, n_permutations=99, seed=2)


def _rewrite_table(d, name, edit):
    """Edit ``name.parquet`` and recompute its sha256 and the record's digest (an edit that hides itself)."""
    rewrite_saved(d, ROLES_RECORD, name, edit)


def test_head_roles_round_trip(assoc, tmp_path):
    d = tli.save_roles(assoc.roles, tmp_path / "r")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["roles.json", "roles.parquet"]
    back = tli.load_roles(d)
    assert type(back) is tli.HeadRoles
    pd.testing.assert_frame_equal(back.table, assoc.roles.table, check_exact=True)
    assert back.summary == assoc.roles.summary and back.options == assoc.roles.options
    assert back.info == assoc.roles.info


def test_association_round_trip(assoc, tmp_path):
    d = assoc.save(tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "association.parquet",
        "roles.json",
        "roles.parquet",
        "table.parquet",
    ]
    back = tli.load_roles(d)
    assert isinstance(back, RoleAssociation)
    pd.testing.assert_frame_equal(back.table, assoc.table, check_exact=True)
    pd.testing.assert_frame_equal(back.association, assoc.association, check_exact=True)
    assert back.summary == assoc.summary
    pd.testing.assert_frame_equal(back.roles.table, assoc.roles.table, check_exact=True)


def test_a_changed_table_byte_is_refused_by_name(assoc, tmp_path):
    d = tmp_path / "a"
    assoc.save(d)
    raw = bytearray((d / "table.parquet").read_bytes())
    raw[len(raw) // 2] ^= 1
    (d / "table.parquet").write_bytes(bytes(raw))
    with pytest.raises(ReportFileError, match=r"table\.parquet does not match the sha256 recorded in .*roles\.json"):
        tli.load_roles(d)


def test_an_edited_record_is_refused_by_name(assoc, tmp_path):
    d = tmp_path / "a"
    assoc.save(d)
    rec = json.loads((d / ROLES_RECORD).read_text())
    rec["summary"]["median_induction"] = 0.99
    (d / ROLES_RECORD).write_text(json.dumps(rec))
    with pytest.raises(ReportFileError, match=r"roles\.json does not match its recorded sha256 digest"):
        tli.load_roles(d)


def test_a_median_edited_with_its_digest_is_refused(assoc, tmp_path):
    d = tmp_path / "r"
    tli.save_roles(assoc.roles, d)
    rec = json.loads((d / ROLES_RECORD).read_text())
    rec["summary"]["median_induction"] = 0.99
    rec["digest"] = record_digest(rec)
    (d / ROLES_RECORD).write_text(json.dumps(rec))
    with pytest.raises(ReportFileError, match=r"summary\['median_induction'\] is 0\.99 but .* from .*roles\.parquet"):
        tli.load_roles(d)


def _zero_the_top_induction(df):
    df.loc[df["induction"].idxmax(), "induction"] = 0.0
    return df


def _open_the_closed_heads(df):
    df.loc[df["closed"], "P"] = 0.5
    return df


def _change_a_rho(df):
    df.loc[0, "spearman_rho"] = 0.123
    return df


#: (what is saved: the roles or the whole association, the table edited, the edit, what the refusal says)
TABLE_EDITS = {
    "a score": ("roles", "roles", _zero_the_top_induction, r"summary\['median_induction'\]"),
    "a P that no longer fits closed": (
        "association",
        "table",
        _open_the_closed_heads,
        r"table\.parquet: 'closed' disagrees with P >= threshold \(0\.9\)",
    ),
    "an association number": (
        "association",
        "association",
        _change_a_rho,
        r"association\.parquet: column 'spearman_rho' is not what .*table\.parquet",
    ),
}


@pytest.mark.parametrize("case", list(TABLE_EDITS))
def test_a_table_edited_with_its_sha256_is_refused(assoc, tmp_path, case):
    saved, table, edit, says = TABLE_EDITS[case]
    d = tmp_path / "r"
    if saved == "roles":
        tli.save_roles(assoc.roles, d)
    else:
        assoc.save(d)
    _rewrite_table(d, table, edit)
    with pytest.raises(ReportFileError, match=says):
        tli.load_roles(d)


def test_a_removed_table_is_refused_by_name(assoc, tmp_path):
    d = tmp_path / "a"
    assoc.save(d)
    (d / "association.parquet").unlink()
    with pytest.raises(MissingFileError, match=r"association\.parquet is missing \(listed in .*roles\.json\)"):
        tli.load_roles(d)


def test_a_report_folder_is_not_roles(assoc, tmp_path, lineage):
    rep = tli.idempotence_report(lineage.checkpoints[-1][1], progress=False)
    rep.save(tmp_path / "rep")
    with pytest.raises(MissingFileError, match=r"has no roles\.json"):
        tli.load_roles(tmp_path / "rep")
    d = tmp_path / "a"
    assoc.save(d)
    rec = json.loads((d / ROLES_RECORD).read_text())
    rec["format"] = "tl_idempotence.report/1"
    rec["digest"] = record_digest(rec)
    (d / ROLES_RECORD).write_text(json.dumps(rec))
    with pytest.raises(ReportFileError, match=r"is not a tl_idempotence\.head_roles/1 or .* record"):
        tli.load_roles(d)


def test_save_refusals_and_overwrite(assoc, tmp_path):
    d = tmp_path / "a"
    assoc.save(d)
    with pytest.raises(OptionError, match="exists and is not empty; pass overwrite=True"):
        assoc.save(d)
    (d / "notes.txt").write_text("mine")
    tli.save_roles(assoc.roles, d, overwrite=True)  # a HeadRoles over a RoleAssociation: a different format
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt", "roles.json", "roles.parquet"]  # its files replaced
    assert isinstance(tli.load_roles(d), tli.HeadRoles)
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_text("x")
    with pytest.raises(OptionError, match=r"holds no roles\.json; refusing to overwrite .* nothing was deleted"):
        assoc.save(other, overwrite=True)
    assert (other / "x.txt").exists()
    with pytest.raises(OptionTypeError, match=r"saves a HeadRoles .* or a RoleAssociation"):
        tli.save_roles(assoc.table, tmp_path / "t")
    with pytest.raises(OptionTypeError, match="must be a path"):
        assoc.save(3)
    with pytest.raises(OptionError, match="does not exist"):
        assoc.save(tmp_path / "no" / "such")
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".pkl", ".pickle")]


def test_load_refusals(tmp_path):
    with pytest.raises(OptionTypeError, match="must be a path; got int"):
        tli.load_roles(3)
    with pytest.raises(MissingFileError, match="is not a folder"):
        tli.load_roles(tmp_path / "absent")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / ROLES_RECORD).write_text("{not json")
    with pytest.raises(ReportFileError, match=r"roles\.json"):
        tli.load_roles(tmp_path / "x")
