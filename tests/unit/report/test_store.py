"""Saving and loading a report (``rep.save(path)``, ``tli.load_report(path)``): parquet tables plus one JSON
record, no pickle.

A loaded report has the same heads, layers, long tables and summary bit for bit, the same figures (their
plotly JSON) and the same HTML page (up to the random element ids plotly and itables draw). A folder that
lies is refused with the file named: a changed or truncated table file, an edited ``report.json``, a missing
file, a folder that is not a saved report.

Real values: SmolLM2-135M-Instruct's raw weights from the zoo's cached checkpoint files, two layers with
every analysis (scramble, mismatch, search, shared-value algebra), so every table kind is saved.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import rewrite_record
from tl_idempotence.errors import MissingFileError, OptionError
from tl_idempotence.report.store import RECORD, ReportFileError

pytestmark = pytest.mark.bridge  # checkpoint files only: must also pass on transformer-lens 4.x


def test_saving_refuses_to_clobber(smol_full, smol_saved, tmp_path):
    with pytest.raises(OptionError, match="not empty; pass overwrite=True"):
        smol_full.save(smol_saved)
    assert tli.load_report(smol_full.save(smol_saved, overwrite=True)).summary["n_closed"] == 3
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(OptionError, match="not a saved report folder"):
        smol_full.save(other, overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"
    with pytest.raises(OptionError, match="does not exist"):
        smol_full.save(tmp_path / "no" / "such" / "folder")
    with pytest.raises(OptionError, match="it is a file"):
        smol_full.save(other / "notes.txt")


@pytest.mark.parametrize("table", ["heads", "layers", "scramble_draws", "algebra_closed_ranges"])
def test_a_changed_table_file_is_refused_with_its_name(smol_saved, table):
    f = smol_saved / f"{table}.parquet"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    f.write_bytes(bytes(data))
    with pytest.raises(ReportFileError, match=rf"{re.escape(str(f))} does not match the sha256"):
        tli.load_report(smol_saved)


def test_a_replaced_table_is_refused_even_when_it_is_valid_parquet(smol_saved):
    f = smol_saved / "heads.parquet"
    df = pd.read_parquet(f)
    df.loc[0, "P"] = 0.99  # a plausible, valid, wrong value
    df.to_parquet(f, index=False)
    with pytest.raises(ReportFileError, match=r"heads\.parquet does not match the sha256"):
        tli.load_report(smol_saved)


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r["summary"].__setitem__("n_closed", 4),
        lambda r: r["options"].__setitem__("threshold", 0.5),
        lambda r: r["info"].__setitem__("n_heads", 8),
        lambda r: r.pop("digest"),
    ],
    ids=["summary", "options", "info", "no-digest"],
)
def test_an_edited_record_is_refused_with_its_name(smol_saved, edit):
    f = smol_saved / RECORD
    rec = json.loads(f.read_text())
    edit(rec)
    f.write_text(json.dumps(rec, indent=1, sort_keys=True))
    with pytest.raises(ReportFileError, match=rf"{re.escape(str(f))} does not match its recorded sha256 digest"):
        tli.load_report(smol_saved)


def test_tables_whose_closed_column_disagrees_with_P_and_the_threshold_are_refused(smol_saved):
    # A consistent forgery (every sha256 recomputed, as a script that rewrote the files would):
    # the digests pass, but 'closed' no longer follows from P and the recorded threshold.
    import hashlib

    f = smol_saved / "heads.parquet"
    df = pd.read_parquet(f)
    df.loc[0, "closed"] = not bool(df.loc[0, "closed"])
    df.to_parquet(f, index=False)
    rf = smol_saved / RECORD
    rec = json.loads(rf.read_text())
    rec["files"]["heads"] = hashlib.sha256(f.read_bytes()).hexdigest()
    body = {k: v for k, v in rec.items() if k != "digest"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    rec["digest"] = hashlib.sha256(canon.encode("utf-8")).hexdigest()
    rf.write_text(json.dumps(rec, indent=1, sort_keys=True))
    with pytest.raises(
        ReportFileError, match=r"'closed' disagrees with P >= threshold \(0\.9\) at L\d+H\d+ \(first of 1 head\)"
    ):
        tli.load_report(smol_saved)


def test_a_damaged_or_foreign_record_is_refused(smol_saved):
    f = smol_saved / RECORD
    text = f.read_text()
    f.write_text(text[: len(text) // 2])  # truncated JSON
    with pytest.raises(ReportFileError, match=re.escape(str(f))):
        tli.load_report(smol_saved)
    f.write_text(json.dumps({"format": "something-else/1"}))
    with pytest.raises(ReportFileError, match=r"is not a tl_idempotence\.report/1 record"):
        tli.load_report(smol_saved)
    f.write_text("[1, 2, 3]")
    with pytest.raises(ReportFileError, match=r"is not a tl_idempotence\.report/1 record"):
        tli.load_report(smol_saved)


@pytest.mark.parametrize("missing", ["layers.parquet", "mismatch_pairs.parquet"])
def test_a_missing_table_file_is_refused_with_its_name(smol_saved, missing):
    (smol_saved / missing).unlink()
    with pytest.raises(MissingFileError, match=rf"{re.escape(str(smol_saved / missing))} is missing"):
        tli.load_report(smol_saved)


def test_a_folder_that_is_not_a_report_is_refused(smol_saved, tmp_path):
    (smol_saved / RECORD).unlink()
    with pytest.raises(MissingFileError, match=f"has no {RECORD}"):
        tli.load_report(smol_saved)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingFileError, match=rf"{re.escape(str(empty))} has no {RECORD}"):
        tli.load_report(empty)
    with pytest.raises(MissingFileError, match="is not a folder"):
        tli.load_report(tmp_path / "nowhere")
    a_file = tmp_path / "report.html"
    a_file.write_text("<html></html>")
    with pytest.raises(MissingFileError, match="is not a folder"):
        tli.load_report(a_file)


# --------------------------------------------------------------------------- overwrite and what is measured


def test_overwrite_replaces_only_the_reports_own_files(smol_full, smol_saved, tmp_path):
    """A user's notes and figures beside the report stay; a table the new report does not have goes."""
    (smol_saved / "notes.md").write_text("my notes")
    (smol_saved / "figure.png").write_bytes(b"\x89PNG")
    (smol_saved / "mine.parquet").write_bytes(b"not a table of the report")  # a parquet name the record never listed
    small = tli.idempotence_report(
        str(tli.models.checkpoint_dir("smollm2-135m", progress=False)), layers=[5], progress=False
    )
    rep_tables = {f"{n}.parquet" for n in smol_full.tables}
    assert rep_tables and (smol_saved / next(iter(rep_tables))).exists()
    small.save(smol_saved, overwrite=True)
    names = {p.name for p in smol_saved.iterdir()}
    assert {"notes.md", "figure.png", "mine.parquet"} <= names
    assert (smol_saved / "notes.md").read_text() == "my notes"
    assert not (rep_tables & names), "a table of the earlier report was left beside the new one"
    back = tli.load_report(smol_saved)
    assert back.heads.equals(small.heads) and list(back.tables) == list(small.tables)


def test_overwrite_through_a_symlinked_folder_writes_where_it_points(smol_full, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    smol_full.save(link)
    (real / "notes.md").write_text("mine")
    smol_full.save(link, overwrite=True)
    assert link.is_symlink() and (real / RECORD).is_file() and (real / "notes.md").read_text() == "mine"
    assert tli.load_report(link).heads.equals(smol_full.heads)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OptionError, match=r"symbolic link to .*nowhere, which does not exist"):
        smol_full.save(dangling)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda r: r["info"].update(n_heads=12), "layers whose heads are not exactly 0..11"),
        (lambda r: r["info"].update(n_heads=6), "head indices up to 8 but the record says n_heads=6"),
        (lambda r: r["info"].update(n_kv_heads=1), "kv heads up to 2 but the record says n_kv_heads=1"),
        (lambda r: r["info"].update(n_layers=8), "the record says n_layers=8"),
        (lambda r: r["info"].update(n_layers=40), "n_layers (30 vs 40)"),
        # impossible on its own: 2 layers of 12 heads are not 18 heads
        (lambda r: r["summary"].update(n_heads_per_layer=12), "summary field n_heads=18 is impossible"),
        (lambda r: r["info"].update(d_head=32), "d_head (64 vs 32)"),
    ],
    ids=["n_heads up", "n_heads down", "n_kv_heads", "n_layers below a layer", "n_layers up", "summary", "d_head"],
)
def test_what_was_measured_must_fit_the_tables(smol_saved, edit, says):
    """The digest is recomputed, so only the cross-checks stand between the edit and a wrong tensor shape."""
    rewrite_record(smol_saved, edit)
    with pytest.raises(ReportFileError, match=re.escape(says)):
        tli.load_report(smol_saved)
