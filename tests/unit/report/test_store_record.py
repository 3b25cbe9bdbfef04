"""``read_record`` refuses every folder that lies, each with its own words (the mutation targets
``store_digest`` and ``store_read`` run these, their fastest killing tests: a tiny synthetic report instead of
SmolLM2).

Each case copies one saved report and changes one thing: the record's type, format, digest, file list, a
table's bytes, a table's contents with its sha256 and the digest recomputed (what an adversary does), the
sizes, the closed column and the types of P and closed. The tests after the marked line are those the run of
``store_read`` (``read_record``, ``_read_listed_tables``) found missing. The digest is recomputed here from its
definition (sha256 of the record without ``digest`` as canonical JSON: sorted keys, ``,``/``:`` separators, no
NaN), never by the module.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import canonical_digest
from tl_idempotence.core.files import record_digest
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.errors import MissingFileError, OptionTypeError, ReportFileError
from tl_idempotence.report.store import FORMAT, RECORD, read_record

pytestmark = pytest.mark.bridge  # no model: runs on both transformer-lens majors


def _layers() -> list[LayerHeads]:
    """Two layers of 4 query heads reading 2 kv heads (d_model 12, d_head 3); head 0 of each an exact projection."""
    g = torch.Generator().manual_seed(5)
    out = []
    for layer in range(2):
        V = torch.randn(2, 12, 3, generator=g, dtype=torch.float64)
        O = torch.randn(4, 12, 3, generator=g, dtype=torch.float64)
        V[0] = torch.linalg.qr(V[0]).Q
        O[0] = V[0]
        out.append(LayerHeads(layer, O, V, torch.tensor([0, 0, 1, 1])))
    return out


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    rep = tli.idempotence_report(_layers(), nulls=4, progress=False)
    return Path(rep.save(tmp_path_factory.mktemp("store") / "rep"))


@pytest.fixture
def saved(original, tmp_path):
    return Path(shutil.copytree(original, tmp_path / "rep"))


def rewrite(folder: Path, edit=None, tables: dict[str, pd.DataFrame] | None = None) -> Path:
    """Edit the record and/or replace tables, with every sha256 and the digest recomputed."""
    f = folder / RECORD
    rec = json.loads(f.read_text())
    for name, df in (tables or {}).items():
        df.to_parquet(folder / f"{name}.parquet")
        rec["files"][name] = hashlib.sha256((folder / f"{name}.parquet").read_bytes()).hexdigest()
    if edit is not None:
        edit(rec)
    rec["digest"] = canonical_digest(rec)
    f.write_text(json.dumps(rec, indent=1))
    return f


def refused(folder: Path, error=ReportFileError) -> str:
    with pytest.raises(error) as e:
        read_record(folder)
    return str(e.value)


def test_the_digest_is_sha256_of_canonical_json(saved):
    rec = json.loads((saved / RECORD).read_text())
    assert rec["format"] == FORMAT and rec["digest"] == canonical_digest(rec) == record_digest(rec)
    assert record_digest({"a": float("nan")}) == "" and record_digest({"a": object()}) == ""
    assert record_digest({"b": 1, "a": [1, 2]}) == hashlib.sha256(b'{"a":[1,2],"b":1}').hexdigest()
    # a record rewritten with a digest computed by its definition loads
    rewrite(saved)
    back = read_record(saved)
    assert len(back.heads) == 8 and list(back.layers["layer"]) == [0, 1]
    assert back.options.nulls == 4 and back.info.n_kv_heads == 2
    assert set(back.tables) == {k for k in rec["files"] if k not in ("heads", "layers")}


def test_not_a_report_folder(saved, tmp_path):
    with pytest.raises(OptionTypeError) as e:
        read_record(3)
    assert str(e.value) == "The report folder must be a path; got int."
    f = saved / "heads.parquet"
    assert refused(f, MissingFileError) == f"{f} is not a folder; pass the folder written by rep.save(...)."
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refused(empty, MissingFileError) == (
        f"{empty} has no report.json: it is not a saved report (or the save was interrupted)."
    )
    (saved / RECORD).write_text("[1, 2]")
    assert refused(saved) == f"{saved / RECORD} is not a {FORMAT} record (format 'list')."
    (saved / RECORD).write_text(json.dumps({"format": "other/1"}))
    assert refused(saved) == f"{saved / RECORD} is not a {FORMAT} record (format 'other/1')."


def test_an_edited_record_without_its_digest(saved):
    f = saved / RECORD
    rec = json.loads(f.read_text())
    rec["options"]["seed"] = 1
    f.write_text(json.dumps(rec))
    assert refused(saved) == (
        f"{f} does not match its recorded sha256 digest: the record (summary, options, file list) was edited or "
        "damaged. Save the report again from its source."
    )
    rec.pop("digest")
    f.write_text(json.dumps(rec))
    assert refused(saved).startswith(f"{f} does not match its recorded sha256 digest")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda r: r.update(files=["heads", "layers"]), "lists no heads/layers tables."),
        (lambda r: r["files"].pop("layers"), "lists no heads/layers tables."),
        (lambda r: r["files"].pop("heads"), "lists no heads/layers tables."),
        (lambda r: r["files"].update({"../x": "0" * 64}), "lists a table named '../x', which is not a table name."),
        (lambda r: r["files"].update({"a b": "0" * 64}), "lists a table named 'a b', which is not a table name."),
    ],
)
def test_a_file_list_that_lies(saved, edit, says):
    f = rewrite(saved, edit)
    assert refused(saved) == f"{f} {says}"


def test_missing_changed_and_unreadable_tables(saved):
    f = saved / RECORD
    (saved / "layers.parquet").unlink()
    assert refused(saved, MissingFileError) == f"{saved / 'layers.parquet'} is missing (listed in {f})."


def test_a_changed_table_and_one_that_is_not_parquet(saved):
    f = saved / RECORD
    t = saved / "heads.parquet"
    t.write_bytes(t.read_bytes()[:-1] + b"\0")
    assert refused(saved) == f"{t} does not match the sha256 recorded in {f}: it was changed or damaged."
    t.write_bytes(b"not parquet")
    rec = json.loads(f.read_text())
    rec["files"]["heads"] = hashlib.sha256(b"not parquet").hexdigest()
    rec["digest"] = canonical_digest(rec)
    f.write_text(json.dumps(rec))
    assert refused(saved).startswith(f"{t} is not a readable parquet file (")


@pytest.mark.parametrize("part", ["info", "options", "summary"])
def test_a_malformed_info_options_or_summary(saved, part):
    f = rewrite(saved, lambda r: r.update({part: "nonsense"}))
    assert refused(saved).startswith(f"{f} has a malformed info/options/summary record (")
    f = rewrite(saved, lambda r: r.pop(part))
    assert refused(saved) == f"{f} has a malformed info/options/summary record (KeyError: '{part}')."


def _heads(saved: Path) -> pd.DataFrame:
    return pd.read_parquet(saved / "heads.parquet")


def test_tables_that_do_not_fit_the_info(saved, original):
    where = saved / "heads.parquet"
    tail = "The tables and the record do not belong together."
    fit = f"{where} does not fit what {saved / RECORD} says was measured: "

    def says(problem: str) -> str:
        return fit + problem + ". " + tail

    h = _heads(original)
    rewrite(saved, tables={"heads": h.drop(columns=["layer"])})
    assert refused(saved) == f"{where} has no layer/head columns: it is not a report's per-head table."
    rewrite(saved, tables={"heads": h.drop(columns=["head"])})
    assert refused(saved) == f"{where} has no layer/head columns: it is not a report's per-head table."
    bad = h.assign(head=h["head"].astype(str) + "x")
    rewrite(saved, tables={"heads": bad})
    # the index check's own words, once (it used to be wrapped in "layer/head/kv_head columns that are not
    # integers (...)", which named heads.parquet even for a layers.parquet value)
    assert refused(saved) == f"{where}: column 'head' is of type str, not an integer index."
    rewrite(saved, tables={"heads": h.assign(layer=h["layer"] - 1)})
    rows = f"{saved / 'layers.parquet'} lists layers [0, 1], not those of the heads"
    assert refused(saved) == says(f"layers [-1, 0] but the record says n_layers=2; {rows}")
    rewrite(saved, tables={"heads": h.assign(layer=h["layer"] + 1)})
    assert refused(saved) == says(f"layers [1, 2] but the record says n_layers=2; {rows}")
    rewrite(saved, tables={"heads": h.assign(head=h["head"] + 1)})
    assert refused(saved) == says("head indices up to 4 but the record says n_heads=4")
    rewrite(saved, tables={"heads": h.assign(head=h["head"] - 1)})
    assert refused(saved) == says("head indices up to 2 but the record says n_heads=4")
    rewrite(saved, tables={"heads": h.assign(kv_head=h["kv_head"] + 1)})
    assert refused(saved) == says("kv heads up to 2 but the record says n_kv_heads=2")
    rewrite(saved, tables={"heads": h.assign(kv_head=h["kv_head"] - 1)})
    assert refused(saved) == says("kv heads up to 0 but the record says n_kv_heads=2")
    dup = h.copy()
    dup.loc[dup.index[1], "head"] = 0  # layer 0: heads 0, 0, 2, 3
    rewrite(saved, tables={"heads": dup})
    assert refused(saved) == says("layers whose heads are not exactly 0..3 once each")
    short = h[~((h["layer"] == 1) & (h["head"] == 3))]  # layer 1 without head 3
    rewrite(saved, tables={"heads": short})
    assert refused(saved) == says("layers whose heads are not exactly 0..3 once each")
    lay = pd.read_parquet(original / "layers.parquet")
    rewrite(saved, tables={"heads": h, "layers": lay.drop(columns=["layer"])})
    assert refused(saved) == says(f"{saved / 'layers.parquet'} has no layer column")
    rewrite(saved, tables={"layers": lay.assign(layer=[1, 0])})  # the same layers in another order fit
    rewrite(saved, tables={"layers": lay.assign(layer=[0, 0])})
    assert refused(saved) == says(f"{saved / 'layers.parquet'} lists layers [0, 0], not those of the heads")


def test_sizes_recorded_twice_must_agree(saved):
    f = rewrite(saved, lambda r: r["info"].update(d_model=13))
    assert refused(saved) == (
        f"{f}: the summary and what was measured (info, tables) disagree on d_model (12 vs 13): the record was "
        "edited. Save the report again from its source."
    )
    rewrite(saved, lambda r: r["info"].update(d_model=12))
    f = rewrite(saved, lambda r: r["info"].update(d_model=16, d_head=4))
    assert "disagree on d_model (12 vs 16), d_head (3 vs 4): the record was edited" in refused(saved)


def test_the_closed_column_must_follow_P_and_the_threshold(saved, original):
    h = _heads(original)
    assert h["closed"].sum() == 2  # the two projections
    flipped = h.assign(closed=~h["closed"])
    rewrite(saved, tables={"heads": flipped})
    assert refused(saved) == (
        f"{saved / 'heads.parquet'}: column 'closed' disagrees with P >= threshold (0.9) at L0H0 (first of 8 heads): "
        "the tables and the record do not belong together."
    )
    one = h.copy()
    one.loc[one.index[1], "closed"] = True
    rewrite(saved, tables={"heads": one})
    assert "at L0H1 (first of 1 head):" in refused(saved)
    # at P exactly the threshold a head is closed (P >= threshold)
    at = h.copy()
    at.loc[at.index[1], "P"] = 0.9
    rewrite(saved, tables={"heads": at})
    assert "'closed' disagrees with P >= threshold (0.9) at L0H1 (first of 1 head)" in refused(saved)


def test_column_edge_cases_are_judged_by_what_they_hold(saved, original):
    h = _heads(original)
    where = saved / "heads.parquet"
    # layer numbers stored as floats are read as the integers they are
    rewrite(saved, tables={"heads": h.assign(layer=(h["layer"] + 1).astype("float64"))})
    assert refused(saved).startswith(
        f"{where} does not fit what {saved / RECORD} says was measured: layers [1, 2] but the record says n_layers=2;"
    )
    rewrite(saved, tables={"heads": h.assign(kv_head=(h["kv_head"] + 1).astype("float64"))})
    assert "kv heads up to 2 but the record says n_kv_heads=2." in refused(saved)
    lay = pd.read_parquet(original / "layers.parquet")
    rewrite(saved, tables={"heads": h, "layers": lay.assign(layer=[0.0, 0.0])})
    assert refused(saved).endswith(
        "layers.parquet lists layers [0, 0], not those of the heads. The tables and the record do not belong together."
    )
    rewrite(saved, tables={"layers": lay})
    # many layers out of range: the message lists the first ten
    many = pd.DataFrame({"layer": [a for a in range(12) for _ in range(4)], "head": list(range(4)) * 12})
    rewrite(saved, tables={"heads": many})
    assert refused(saved) == (
        f"{where} does not fit what {saved / RECORD} says was measured: layers [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] but the "
        f"record says n_layers=2; {saved / 'layers.parquet'} lists layers [0, 1], not those of the heads. The tables "
        "and the record do not belong together."
    )
    rewrite(saved, tables={"heads": h, "layers": pd.DataFrame({"layer": list(range(12))})})
    assert refused(saved).endswith(
        f"{saved / 'layers.parquet'} lists layers [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], not those of the heads. The "
        "tables and the record do not belong together."
    )
    rewrite(saved, tables={"layers": lay})
    # a table of only layer and head columns is a per-head table whose heads fit; what it lacks is judged later
    rewrite(saved, tables={"heads": h[["layer", "head"]]})
    assert "has no layer/head columns" not in refused(saved)
    assert refused(saved).endswith("(KeyError: 'P'): the tables and the record do not belong together.")
    # no kv_head column: nothing to check the kv heads of; the rest fits, so it loads
    rewrite(saved, tables={"heads": h.drop(columns=["kv_head"])})
    assert "kv_head" not in read_record(saved).heads.columns


# ------------------------------------------------------------------------- every field of the record, each refused


def test_a_record_that_is_not_json_is_refused_naming_it(saved):
    f = saved / RECORD
    f.write_text("{")
    assert refused(saved) == (
        f"report record {f} is not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)."
    )
    f.write_bytes(b"\xff")
    assert refused(saved) == f"report record {f} is not UTF-8 text (byte 0): the file is corrupt or not JSON."


@pytest.mark.parametrize(
    ("field", "value", "measured"),
    [
        ("n_layers", 3, 2),
        ("n_heads_per_layer", 5, 4),
        ("n_kv_heads", 1, 2),
        ("d_model", 13, 12),
        ("d_head", 4, 3),
        ("n_heads", 9, 8),
        ("n_attention_layers", 1, 2),
    ],
)
def test_each_size_the_summary_repeats_is_checked_against_what_was_measured(saved, field, value, measured):
    """Each size is compared by its own name (an edit of one is refused here, before the summary is recomputed)."""
    f = rewrite(saved, lambda r: r["summary"].update({field: value}))
    if field in ("n_heads_per_layer", "n_heads", "n_attention_layers"):  # impossible on its own
        msg = refused(saved)
        assert msg.startswith(f"{f} has a malformed info/options/summary record (OptionError: summary field ")
        assert ("n_kv_heads=2 is impossible" if field == "n_heads_per_layer" else "n_heads=") in msg
        return
    assert refused(saved) == (
        f"{f}: the summary and what was measured (info, tables) disagree on {field} ({value!r} vs {measured!r}): the "
        "record was edited. Save the report again from its source."
    )


@pytest.mark.parametrize(
    ("column", "dtype"),
    [
        ("closed", "int64"),  # 0/1: a cast to bool, or a comparison with bools, would take it
        ("closed", "float64"),
        ("closed", "boolean"),  # pandas' nullable booleans
        ("P", "Float64"),  # pandas' nullable floats
        ("P", "str"),
    ],
)
def test_P_and_closed_must_be_floats_and_booleans(saved, original, column, dtype):
    """A cast to bool would take 0/1, 0.5 or 2 for a closed head and let the table load holding them: the columns
    are judged by their type, so a loaded report's ``closed`` is the boolean column the report wrote."""
    h = _heads(original)
    rewrite(saved, tables={"heads": h.assign(**{column: h[column].astype(dtype)})})
    back = _heads(saved)
    if dtype != "str":  # (text reads back as object or str, by pandas version)
        assert str(back[column].dtype) == dtype  # parquet keeps the type
    assert refused(saved) == (
        f"{saved / 'heads.parquet'}: P and 'closed' are columns of {back['P'].dtype} and {back['closed'].dtype}, not "
        "of floats and booleans: the tables and the record do not belong together."
    )


def test_an_unreadable_table_names_the_readers_error(saved):
    t = saved / "layers.parquet"
    t.write_bytes(b"PAR1 but not parquet")
    rewrite(saved, lambda r: r["files"].update(layers=hashlib.sha256(t.read_bytes()).hexdigest()))
    with pytest.raises(ReportFileError) as e:
        read_record(saved)
    cause = e.value.__cause__
    assert cause is not None
    assert str(e.value) == f"{t} is not a readable parquet file ({type(cause).__name__}: {cause})."
    assert "NoneType" not in str(e.value)


def test_a_table_name_is_letters_digits_and_underscores_of_either_case(saved, original):
    """``[A-Za-z0-9_]+``: a listed table the format does not write is checked against its sha256 and read."""
    extra = pd.DataFrame({"x": [1.0, 2.0]})
    rewrite(saved, tables={"Extra_2": extra})  # listed in files but not in the record's list of tables: refused
    assert "its list of tables" in refused(saved) and "['Extra_2', 'mismatch_pairs'" in refused(saved)
    rewrite(saved, lambda r: r["tables"].insert(0, "Extra_2"))  # listed in both (issue 45's contract)
    assert read_record(saved).tables["Extra_2"].equals(extra)
    (saved / "Extra_2.parquet").write_bytes((saved / "Extra_2.parquet").read_bytes() + b"\0")
    assert refused(saved).startswith(f"{saved / 'Extra_2.parquet'} does not match the sha256 recorded in")


def test_the_summary_loaded_is_the_records(saved):
    rec = json.loads((saved / RECORD).read_text())
    back = read_record(saved)
    assert back.summary["n_closed"] == rec["summary"]["n_closed"] == 2
    assert back.summary["median_P"] == rec["summary"]["median_P"]
    assert back.summary["n_heads_q05"] == rec["summary"]["n_heads_q05"]


def test_a_record_saved_before_a_derived_field_existed_gets_it_from_its_tables(saved):
    want = json.loads((saved / RECORD).read_text())["summary"]["n_heads_q05"]
    assert isinstance(want, int)
    rewrite(saved, lambda r: r["summary"].pop("n_heads_q05"))
    assert read_record(saved).summary["n_heads_q05"] == want


def test_an_edited_summary_field_is_refused_naming_the_record(saved):
    rec = json.loads((saved / RECORD).read_text())
    f = rewrite(saved, lambda r: r["summary"].update(median_P=0.5))
    assert refused(saved) == (
        f"{f}: summary['median_P'] is 0.5 in the record but {rec['summary']['median_P']!r} from its tables, info and "
        "options: the record was edited. Save the report again from its source."
    )


def test_text_in_the_info_that_reads_NaN_stays_text(saved):
    """Only float fields get NaN back: the info's text is never restored (a checkpoint's extra config)."""
    rewrite(saved, lambda r: (r["info"].update(extra={"note": "NaN"}), r["summary"].update(source={"note": "NaN"})))
    assert read_record(saved).info.extra == {"note": "NaN"}


@pytest.mark.parametrize(
    ("options", "files"),
    [
        ({"nulls": 0}, {"heads", "layers"}),  # only the two tables every report has
        (
            {"nulls": 0, "algebra": True},  # the one analysis whose summary reads its own tables
            {"heads", "layers", "algebra_pairs", "algebra_heads", "algebra_groups", "algebra_ranges"}
            | {"algebra_closed_ranges"},
        ),
    ],
)
def test_reports_of_other_options_load(tmp_path, options, files):
    rep = tli.idempotence_report(_layers(), progress=False, **options)
    d = Path(rep.save(tmp_path / "rep"))
    rec = json.loads((d / RECORD).read_text())
    assert set(rec["files"]) == files
    back = read_record(d)
    assert set(back.tables) == files - {"heads", "layers"}
    assert back.summary.get("algebra") == rep.summary.get("algebra")


@pytest.mark.parametrize("name", ["NaN", "Infinity", "-Infinity"])
def test_a_model_whose_name_reads_as_a_float_saves_and_loads(tmp_path, name):
    """The record writes NaN floats as the text "NaN"; reading it back turned every such text into a float, so a
    report of a model named "NaN" saved but could not be loaded ("summary field model_name must be a str")."""
    from helpers import SyntheticSource, gaussian_layer

    src = SyntheticSource([gaussian_layer(0, 4, 4, 16, 4, seed=0)], name=name)
    rep = tli.idempotence_report(src, progress=False)
    rep.save(tmp_path / "r")
    back = tli.load_report(tmp_path / "r")
    assert back.summary.model_name == name and back.info.model_name == name
    assert back.summary.to_dict() == rep.summary.to_dict() or json.dumps(
        back.summary.to_dict(), sort_keys=True, default=str
    ) == json.dumps(rep.summary.to_dict(), sort_keys=True, default=str)


@pytest.mark.parametrize(
    ("table", "column"), [("heads", "layer"), ("heads", "head"), ("heads", "kv_head"), ("layers", "layer")]
)
def test_an_index_column_that_is_not_whole_is_refused_naming_its_file(saved, original, table, column):
    """-0.5 in an index column is refused (a cast would make it head 0), and the message names the table's own
    file and the column (a message that dropped or changed the file name would fail)."""
    frame = pd.read_parquet(original / f"{table}.parquet")
    values = frame[column].to_numpy(dtype="float64", copy=True)
    values[0] = -0.5
    rewrite(saved, tables={table: frame.assign(**{column: values})})
    assert refused(saved) == (
        f"{saved / f'{table}.parquet'}: column {column!r} holds values that are not whole numbers ([-0.5])."
    )


def test_a_nullable_index_column_with_a_missing_value_is_refused_naming_its_file(saved, original):
    """An Int64 (nullable) index column with a missing value: pandas' own ValueError escaped ``load_report``
    (not a ``ReportFileError``, so a sweep task crashed instead of recomputing the item)."""
    h = pd.read_parquet(original / "heads.parquet")
    rewrite(saved, tables={"heads": h.assign(head=pd.array([None, *h["head"].iloc[1:]], dtype="Int64"))})
    assert refused(saved) == f"{saved / 'heads.parquet'}: column 'head' has 1 missing value(s)."


# ------------------------------------------------------------------------------- edits that keep every count
# Each edit below keeps the counts a check by counts would compare (flags swapped within a layer, kv heads swapped,
# q-values permuted) and has every sha256 and the digest recomputed (``rewrite``): only a check of every element
# refuses it, naming the file, the column and the first head.


def test_two_closed_flags_swapped_within_a_layer_are_refused_naming_the_first_head(saved, original):
    h = _heads(original)
    i, j = h.index[(h["layer"] == 1) & (h["head"] == 0)][0], h.index[(h["layer"] == 1) & (h["head"] == 1)][0]
    assert h.loc[i, "closed"] and not h.loc[j, "closed"]
    x = h.copy()
    x.loc[[i, j], "closed"] = [False, True]
    assert x.groupby("layer")["closed"].sum().tolist() == h.groupby("layer")["closed"].sum().tolist()
    rewrite(saved, tables={"heads": x})
    assert refused(saved) == (
        f"{saved / 'heads.parquet'}: column 'closed' disagrees with P >= threshold (0.9) at L1H0 (first of 2 heads): "
        "the tables and the record do not belong together."
    )


def test_kv_heads_swapped_within_a_layer_are_refused_naming_the_first_head(saved, original):
    h = _heads(original)
    assert h["kv_head"].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]  # kv_layout(4, 2) in both layers
    x = h.copy()
    x.loc[x.index[5], "kv_head"], x.loc[x.index[6], "kv_head"] = 1, 0  # L1H1 <-> L1H2: each kv head still read twice
    rewrite(saved, tables={"heads": x})
    assert refused(saved) == (
        f"{saved / 'heads.parquet'}: column 'kv_head' disagrees with the kv map of n_heads=4, n_kv_heads=2 "
        "(tl_idempotence.kv_layout) at L1H1 (first of 2 heads): the tables and the record do not belong together."
    )


def test_q_values_permuted_are_refused_as_not_BH_of_the_p_values(saved, original):
    h = _heads(original)
    q = h["q_value"].to_numpy()
    assert len(set(q.tolist())) > 1
    x = h.assign(q_value=q[::-1])  # the same values (the same count under every level), other heads
    first = next(i for i in range(len(q)) if q[::-1][i] != q[i])
    rewrite(saved, tables={"heads": x})
    msg = refused(saved)
    label = f"L{h['layer'].iloc[first]}H{h['head'].iloc[first]}"
    assert msg.startswith(
        f"{saved / 'heads.parquet'}: column 'q_value' is not Benjamini-Hochberg of its 'p_value' column at {label} "
    )
    rewrite(saved, tables={"heads": h.drop(columns="p_value")})
    assert refused(saved) == f"{saved / 'heads.parquet'}: column 'q_value' without the 'p_value' it is derived from."


def test_a_summary_float_changed_in_its_seventh_significant_digit_is_refused(saved):
    """The summary is compared exactly (as the docstring says), never within a relative tolerance."""
    rec = json.loads((saved / RECORD).read_text())
    v = rec["summary"]["median_P"]
    w = float(f"{v:.7g}") + 10 ** (math.floor(math.log10(abs(v))) - 6)  # one unit in the 7th significant digit
    assert f"{v:.6g}" == f"{w:.6g}" and abs(w - v) / v < 1e-5
    f = rewrite(saved, lambda r: r["summary"].update(median_P=w))
    assert refused(saved).startswith(f"{f}: summary['median_P'] is {w!r} in the record but {v!r} from its tables")


def test_a_kv_map_other_than_the_standard_layout_is_stated_and_checked(tmp_path):
    g = torch.Generator().manual_seed(3)
    maps = [[0, 1, 0, 1], [0, 0, 1, 1]]
    layers = [
        LayerHeads(i, torch.randn(4, 12, 3, generator=g, dtype=torch.float64),
                   torch.randn(2, 12, 3, generator=g, dtype=torch.float64), torch.tensor(m))
        for i, m in enumerate(maps)
    ]  # fmt: skip
    d = Path(tli.idempotence_report(layers, progress=False).save(tmp_path / "r"))
    assert json.loads((d / RECORD).read_text())["kv_map"] == {"0": [0, 1, 0, 1]}  # layer 1 is kv_layout's
    assert tli.load_report(d).heads["kv_head"].tolist() == maps[0] + maps[1]
    h = pd.read_parquet(d / "heads.parquet")
    rewrite(d, tables={"heads": h.assign(kv_head=[0, 0, 1, 1, 0, 0, 1, 1])})
    assert "column 'kv_head' disagrees with the kv map of n_heads=4, n_kv_heads=2 (tl_idempotence.kv_layout, or " \
        "the layers of its 'kv_map') at L0H1 (first of 2 heads)" in refused(d)  # fmt: skip
    rewrite(d, lambda r: r.update(kv_map={"0": [0, 1, 0, 2]}), tables={"heads": h})
    assert refused(d).startswith(f"{d / RECORD}: field 'kv_map' is not a map")
    rewrite(d, lambda r: r.update(kv_map={"0": [0, 1, 0, 1], "5": [1, 0, 1, 0]}))
    assert refused(d) == f"{d / RECORD}: field 'kv_map' names layer 5, which was not measured."


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"n_heads": 10**12}, "summary field n_heads=1000000000000 is impossible: a report measures every head"),
        ({"n_heads": 10}, "summary field n_heads=10 is impossible: a report measures every head"),
        ({"n_kv_heads": 3}, "summary field n_kv_heads=3 is impossible: it must divide n_heads_per_layer=4"),
        ({"closed_per_layer": {0: 2}}, "summary field closed_per_layer has 1 layers, but n_attention_layers=2"),
        ({"n_mismatch_pairs": 10**9}, "summary field n_mismatch_pairs=1000000000 is impossible: more than"),
        ({"n_feasible_layers": 0, "infeasible_layers": [0, 0]}, "summary field infeasible_layers=[0, 0] is impossible"),
    ],
)
def test_from_dict_bounds_every_size_by_the_others(original, edit, says):
    from tl_idempotence.errors import OptionError
    from tl_idempotence.report.summary import ReportSummary

    s = read_record(original).summary.to_dict()
    assert ReportSummary.from_dict(s) == s  # untouched: the same summary
    with pytest.raises(OptionError) as e:
        ReportSummary.from_dict({**s, **edit})
    assert str(e.value).startswith(says)


# -------------------------------------------------------------------------------- the scramble effect column


def test_scramble_effect_saves_and_loads_and_an_edited_one_is_refused(saved, original):
    rep = tli.load_report(original)
    h = _heads(original)
    assert "scramble_effect" in h.columns
    np.testing.assert_array_equal(rep.heads["scramble_effect"].to_numpy(), h["scramble_effect"].to_numpy())
    np.testing.assert_allclose(
        h["scramble_effect"].to_numpy(), np.log10(h["P"].to_numpy() / h["P_scrambled_median"].to_numpy()), rtol=1e-14
    )
    e = h["scramble_effect"].to_numpy()
    x = h.assign(scramble_effect=e + np.where(np.arange(len(e)) == 2, 1e-12, 0.0))  # one head, far below display
    rewrite(saved, tables={"heads": x})
    assert refused(saved) == (
        f"{saved / 'heads.parquet'}: column 'scramble_effect' is not log10(P / P_scrambled_median) at "
        f"L{h['layer'].iloc[2]}H{h['head'].iloc[2]} (first of 1 head): the tables and the record do not belong "
        "together."
    )
    rewrite(saved, tables={"heads": h.drop(columns="P_scrambled_median")})
    assert refused(saved).startswith(
        f"{saved / 'heads.parquet'}: column 'scramble_effect' without the 'P' and 'P_scrambled_median'"
    )


def test_a_record_saved_before_the_scramble_effect_loads_without_it(saved):
    """A record without a scramble_effect column loads; the column is absent, never filled with a
    made-up number, and the displays that read it say nothing of it."""
    rewrite(saved, tables={"heads": _heads(saved).drop(columns="scramble_effect")})
    rep = tli.load_report(saved)
    assert "scramble_effect" not in rep.heads.columns and "p_value" in rep.heads.columns
    from tl_idempotence.views.page import closed_heads_table

    assert "scramble effect (log10 P / null median)" not in closed_heads_table(rep).columns
    assert rep.headline.startswith("2 of 8 heads are closed (P ≥ 0.9); q ≤ 0.05 for ")
