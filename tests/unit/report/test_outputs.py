"""The output registry (``core/outputs.py``) and the one JSON encoder with its two NaN policies
(``core/jsonio.py``; docs/definitions.md "Output formats").

Real values: a report of two synthetic layers with exact projections (P = 1, closed) and a zero head (P, α and
its scramble p-value NaN, each with a reason), so NaN reaches every format; a small checkpoint for the refusal of
outputs over inputs. Each format is read back with its own reader (``json``, ``pandas.read_csv``,
``pandas.read_parquet``, ``load_report``) and compared value for value; the encoder is compared with the two
encoders it replaces (copied here as they were) on hostile values.
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import closed_pairs_layers, llama_like
from tl_idempotence.core.jsonio import EXPORT, RECORD, json_ready, json_restore, json_text
from tl_idempotence.core.outputs import OUTPUT_FORMATS, Output, output_format, write_output
from tl_idempotence.errors import OptionError, OptionTypeError, OutputOverInputError
from tl_idempotence.report.export import export_record
from tl_idempotence.report.parts import json_safe

pytestmark = pytest.mark.bridge  # no TransformerLens model: must also pass on transformer-lens 4.x


@pytest.fixture(scope="module")
def rep():
    return tli.idempotence_report(closed_pairs_layers(alpha=(1.0, 1.0), zero_l1h5=True), nulls=9, progress=False)


# --------------------------------------------------------------------------- the encoder, as it was before


def _old_json_safe(x):
    """A reference encoder for records, written out here (NaN as "NaN")."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, dict):
        return {str(k): _old_json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_old_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def _old_cli_json_value(x):
    """A reference encoder for ``--json``, written out here (NaN as null)."""
    from collections.abc import Mapping

    if isinstance(x, Mapping):
        return {str(k): _old_cli_json_value(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_old_cli_json_value(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


HOSTILE = {
    "nan": float("nan"),
    "np_nan": np.float64("nan"),
    "np32_inf": np.float32("inf"),
    "neg_inf": -math.inf,
    "tiny": 5e-324,
    "big_int": np.int64(2**62),
    "flag": np.bool_(True),
    "text_NaN": "NaN",  # a string that looks like the record's NaN
    "nested": {3: [1.5, (np.float64(-0.0), float("-inf"))], "k": None},
    "empty": {},
    "zero_d": np.array(0.25),
}


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN, types equal (bit for bit for floats)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def test_the_record_policy_is_the_saved_formats_encoder_bit_for_bit():
    hostile = {k: v for k, v in HOSTILE.items() if k != "zero_d"}  # the old encoder could not write a 0-d array
    assert _same(json_safe(hostile), _old_json_safe(hostile))
    assert _same(json_ready(hostile, RECORD), _old_json_safe(hostile))
    text = json_text(HOSTILE, RECORD, indent=1)
    assert '"nan": "NaN"' in text and '"np32_inf": "Infinity"' in text and '"neg_inf": "-Infinity"' in text
    assert '"zero_d": 0.25' in text and '"big_int": 4611686018427387904' in text


def test_the_export_policy_is_the_clis_encoder_bit_for_bit():
    assert _same(json_ready(HOSTILE, EXPORT), _old_cli_json_value(HOSTILE))
    text = json_text(HOSTILE, EXPORT)
    back = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert back["nan"] is None and back["np32_inf"] is None and back["neg_inf"] is None
    assert back["text_NaN"] == "NaN" and back["nested"] == {"3": [1.5, [-0.0, None]], "k": None}


def test_a_record_round_trips_nan_and_infinities_exactly():
    rec = {"median_P": float("nan"), "hi": math.inf, "lo": -math.inf, "x": 0.1 + 0.2, "per_layer": {"0": 1, "7": 2}}
    back = json_restore(json.loads(json_text(rec, RECORD)))
    assert math.isnan(back["median_P"]) and back["hi"] == math.inf and back["lo"] == -math.inf
    assert back["x"] == 0.1 + 0.2 and back["per_layer"] == {0: 1, 7: 2}
    # a record in the format on disk reads back the same
    old_text = '{"median_P": "NaN", "hi": "Infinity", "lo": "-Infinity", "name": "NaN"}'
    old = json_restore(json.loads(old_text), {"median_P", "hi", "lo"})
    assert math.isnan(old["median_P"]) and old["hi"] == math.inf and old["lo"] == -math.inf and old["name"] == "NaN"


def test_a_value_json_cannot_hold_is_refused_not_written():
    with pytest.raises(TypeError):
        json_text({"a": object()}, EXPORT)
    with pytest.raises(ValueError, match="nan must be one of"):
        json_ready(1.0, "null")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- every format, read back


def test_a_saved_report_keeps_its_nans_as_nans(rep, tmp_path):
    assert np.isnan(rep.heads.loc["L1H5", "P"]) and np.isnan(rep.heads.loc["L1H5", "p_value"])
    d = Path(rep.export(tmp_path / "folder"))  # no extension: the save format
    assert (d / "report.json").is_file()
    back = tli.load_report(d)
    assert back.heads["P"].to_numpy().tobytes() == rep.heads["P"].to_numpy().tobytes()
    nan_keys = [k for k, v in rep.summary.items() if isinstance(v, float) and math.isnan(v)]
    raw = json.loads((d / "report.json").read_text())["summary"]
    for k in nan_keys:
        assert raw[k] == "NaN" and math.isnan(back.summary[k]), k


def test_csv_is_the_heads_table_label_first(rep, tmp_path):
    p = Path(rep.export(tmp_path / "heads.csv"))
    assert p.read_bytes() == rep.heads.to_csv(index=True, index_label="label").encode()  # the CLI's --csv, as before
    back = pd.read_csv(p, index_col="label")
    assert list(back.index) == list(rep.heads.index)
    np.testing.assert_array_equal(back["P"].to_numpy(), rep.heads["P"].to_numpy())  # NaN where P is NaN
    assert back.loc["L1H5", "reason"] == rep.heads.loc["L1H5", "reason"] != ""


def test_parquet_is_the_heads_table_exactly(rep, tmp_path):
    p = Path(rep.export(tmp_path / "heads.parquet"))
    back = pd.read_parquet(p)
    pd.testing.assert_frame_equal(back, rep.heads.reset_index(names="label"), check_exact=True)
    assert back["P"].to_numpy().tobytes() == rep.heads["P"].to_numpy().tobytes()


def test_json_is_the_export_with_nan_as_null(rep, tmp_path):
    p = Path(rep.export(tmp_path / "r.JSON"))  # the extension is case-insensitive
    back = json.loads(p.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    closed = rep.closed_heads
    assert [h["label"] for h in back["closed_heads"]] == list(closed.index) and len(closed) == 4
    assert [h["P"] for h in back["closed_heads"]] == closed["P"].tolist()
    for k, v in rep.summary.items():
        if isinstance(v, float) and math.isnan(v):
            assert back["summary"][k] is None, k
    from tl_idempotence.cli.report_command import summary_json

    assert p.read_text() == summary_json(rep) + "\n"  # --json prints what a .json output holds


def test_html_page_and_every_writer_is_atomic(rep, tmp_path):
    p = tmp_path / "r.html"
    p.write_text("old")
    assert rep.export(p, overwrite=True) == str(p) and p.read_text().startswith("<!DOCTYPE html>")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.html"]  # no temporary file left


def test_an_unknown_extension_is_refused_naming_the_known_ones(rep, tmp_path):
    with pytest.raises(OptionError) as e:
        rep.export(tmp_path / "r.txt")
    msg = str(e.value)
    assert "has the extension '.txt'" in msg and ".html or .htm (page)" in msg and ".json (JSON export)" in msg
    assert ".csv (CSV table)" in msg and ".parquet (parquet table)" in msg and "a folder (saved folder)" in msg
    with pytest.raises(OptionError, match=r"can be written as \.html or \.htm \(page\); give a file name"):
        rep.save_html(tmp_path / "r.csv")
    with pytest.raises(OptionError, match="has no extension"):
        rep.save_html(tmp_path / "report")
    assert list(tmp_path.iterdir()) == []
    folder = Path(rep.save(tmp_path / "run.2024"))  # save writes a folder whatever its name
    assert (folder / "report.json").is_file()


def test_a_format_the_result_does_not_offer_is_refused(tmp_path):
    out = Output("thing", page=lambda: "<p>x</p>")
    with pytest.raises(OptionError, match=r"the thing can be written as \.html or \.htm \(page\)"):
        write_output(out, tmp_path / "x.csv")
    assert write_output(out, tmp_path / "x.htm").read_text() == "<p>x</p>"
    with pytest.raises(ValueError, match="unknown output format"):
        output_format(tmp_path / "x.csv", ("xlsx",))
    assert [f.name for f in OUTPUT_FORMATS] == ["html", "json", "csv", "parquet", "folder"]


def test_paths_are_checked_before_anything_is_rendered(tmp_path):
    def boom() -> str:
        raise AssertionError("rendered before the path was checked")

    out = Output("report", page=boom, table=lambda: pd.DataFrame({"a": [1]}))
    for path, err, says in [
        (3, OptionTypeError, "path of the report output must be a file path; got int"),
        ("  ", OptionError, "must not be empty"),
        (tmp_path, OptionError, "it is a folder"),
        (tmp_path / "missing" / "r.html", OptionError, "does not exist"),
        (tmp_path / "r.xlsx", OptionError, "has the extension '.xlsx'"),
    ]:
        with pytest.raises(err, match=says):
            write_output(out, path)
    if os.geteuid() != 0:  # root writes whatever the mode
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(OptionError, match=r"Cannot write the report CSV table to .*r\.csv: Permission denied"):
                write_output(out, locked / "r.csv")
        finally:
            locked.chmod(0o700)


def test_every_format_refuses_an_output_over_an_input(tmp_path):
    ck, _, _ = llama_like(tmp_path / "CK", n_layers=2)
    rep = tli.idempotence_report(str(ck), progress=False)
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    for path in (ck / "config.json", ck / "model.safetensors.index.json", ck / "x.safetensors", ck):
        target = path if path.exists() else sorted(ck.glob("*.safetensors"))[0]
        with pytest.raises(OutputOverInputError, match="which this run reads"):
            rep.export(target)  # refused before its extension is looked at (.safetensors is no format)
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before


def test_comparison_exports(rep, tmp_path):
    cmp = tli.compare({"a": rep}, progress=False)
    p = Path(cmp.export(tmp_path / "cmp.csv"))
    back = pd.read_csv(p)
    assert list(back["model"]) == list(cmp.table["model"]) and len(back) == len(cmp.table)
    rec = json.loads(Path(cmp.export(tmp_path / "cmp.json")).read_text())
    assert rec["summary"]["n_models"] == 1 and [r["model"] for r in rec["table"]] == list(cmp.table["model"])
    with pytest.raises(OptionError, match="comparison can be written as"):
        cmp.export(tmp_path / "cmp_folder")  # a comparison has no folder format
    assert export_record(rep)["closed_heads"][0]["label"] == rep.closed_heads.index[0]


# --------------------------------------------------------------------------- export never replaces a file unasked


@pytest.mark.parametrize("name", ["keep.csv", "keep.json", "keep.parquet", "keep.html"])
def test_export_refuses_an_existing_file_unless_overwrite(rep, tmp_path, name):
    """``rep.export(path)`` has ``overwrite=False``: a user's file there is kept byte for byte (it was replaced)."""
    p = tmp_path / name
    p.write_bytes(b"a user's own file")
    with pytest.raises(OptionError, match=rf"{name}: the file exists; pass overwrite=True to replace it"):
        rep.export(p)
    assert p.read_bytes() == b"a user's own file"
    assert Path(rep.export(p, overwrite=True)) == p and p.read_bytes() != b"a user's own file"


def test_comparison_export_refuses_an_existing_file_unless_overwrite(rep, tmp_path):
    cmp = tli.compare({"a": rep}, progress=False)
    p = tmp_path / "cmp.csv"
    p.write_text("mine")
    with pytest.raises(OptionError, match="the file exists; pass overwrite=True"):
        cmp.export(p)
    assert p.read_text() == "mine"
    cmp.export(p, overwrite=True)
    assert pd.read_csv(p)["model"].tolist() == list(cmp.table["model"])
    with pytest.raises(OptionTypeError, match="overwrite"):
        cmp.export(p, overwrite="yes")  # type: ignore[arg-type]


def test_the_page_writers_still_replace_their_page(rep, tmp_path):
    """save_html (and the CLI's --out) replace an earlier page."""
    p = tmp_path / "r.html"
    p.write_text("old page")
    assert Path(rep.save_html(p)) == p and p.read_text().startswith("<!DOCTYPE html>")


def test_a_path_ending_in_a_separator_names_a_folder_and_no_file_is_written(rep, tmp_path):
    """``export("x.html/")``: Path() drops the trailing slash, so it used to write the file x.html; a path ending in a
    separator names a folder, and a file format there is refused naming the path as given. The folder format (the
    save format of a report) still takes such a path."""
    for name in ("x.html/", "x.json/", "x.csv/", "x.parquet/", "x.htm" + os.sep):
        target = f"{tmp_path}{os.sep}{name}"  # (a Path would drop the separator before export sees it)
        with pytest.raises(OptionError, match=r"to '.*x\.\w+/': a path ending in a separator names a folder"):
            rep.export(target)
        with pytest.raises(OptionError, match="a path ending in a separator names a folder"):
            rep.export(target, overwrite=True)
    with pytest.raises(OptionError, match="a path ending in a separator names a folder"):
        rep.save_html(f"{tmp_path}/page.html/")
    cmp = tli.compare({"a": rep}, progress=False)
    with pytest.raises(OptionError, match=r"cmp\.csv/': a path ending in a separator names a folder"):
        cmp.export(str(tmp_path / "cmp.csv") + "/")
    assert list(tmp_path.iterdir()) == []  # nothing written
    folder = Path(rep.export(str(tmp_path / "saved") + "/"))  # the save format: a folder, as the slash says
    assert folder.is_dir() and (folder / "report.json").is_file()


def _read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    """A reader of the named pipe ``path`` in a thread (a FIFO's writer blocks until a reader opens it)."""
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


def test_streams_are_written_as_the_format_the_caller_implies(rep, tmp_path):
    """/dev/null, /dev/stdout and a named pipe have no extension: each is written as the format the caller implies."""
    page = Output("thing", page=lambda: "<p>x</p>", table=lambda: pd.DataFrame({"a": [1, 2]}))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    t, got = _read_fifo(fifo)
    assert write_output(page, fifo, stream_format="csv") == fifo
    t.join(10)
    assert got == [b"a\n1\n2\n"] and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # written in place
    t, got = _read_fifo(fifo)
    write_output(page, fifo, stream_format="html")
    t.join(10)
    assert got == [b"<p>x</p>"]
    t, got = _read_fifo(fifo)
    write_output(page, fifo, ["html"])  # one file format allowed: that one, no stream_format needed
    t.join(10)
    assert got == [b"<p>x</p>"]
    with pytest.raises(OptionError, match=r"is a stream \(a device or a pipe\) with no extension to choose among"):
        write_output(page, "/dev/null")  # two formats and no stream_format: refused, never guessed
    assert output_format("/dev/null", ["html", "csv"], stream_format="csv").name == "csv"
    assert output_format("/dev/stdout", ["html", "json"], stream_format="json").name == "json"
    # the API writers: save_html writes one format, so a stream is its page; export chooses by extension, and a
    # stream has none: refused naming the formats (never guessed)
    assert rep.save_html("/dev/null") == "/dev/null"
    t, got = _read_fifo(fifo)
    rep.save_html(fifo)
    t.join(10)
    assert got and got[0].startswith(b"<!DOCTYPE html>") and b"L0H0" in got[0]
    with pytest.raises(OptionError, match=r"path /dev/null is a stream .* \.json \(JSON export\)"):
        rep.export("/dev/null")
    # a regular file keeps the extension check
    with pytest.raises(OptionError, match="has no extension"):
        write_output(page, tmp_path / "plain", stream_format="csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
