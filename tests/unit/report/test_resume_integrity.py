"""Resumed and cached results are what the weights say.

Every part of a resume directory is keyed on the sha256 of its layer's exact O and V bytes and
on the options; a part made from other weights, copied to another layer's name, kept after the
manifest was deleted, or damaged on disk is recomputed with a warning that names the file (the
numbers then equal a fresh report bit for bit); a manifest made with other options is refused
naming the option; nothing in the directory is a pickle. The trajectory cache is keyed the same
way, so a checkpoint whose bytes changed while its name, size and mtime did not is recomputed.
Analysis runs are counted by wrapping ``report.report.run_layer`` (no timing).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

import tl_idempotence as tli
from helpers import llama_like
from tl_idempotence.errors import ResumeError

OPTS = dict(nulls=4, progress=False)


def same(a, b) -> None:
    """Bit for bit the same per-head and per-layer tables."""
    pd.testing.assert_frame_equal(a.heads, b.heads, check_exact=True)
    pd.testing.assert_frame_equal(a.layers, b.layers, check_exact=True)


def report(model, resume=None, **kw):
    return tli.idempotence_report(model, resume=resume, **{**OPTS, **kw})


def stale_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, UserWarning) and "Resume part" in str(w.message)]


# ------------------------------------------------------------------ TransformerBridge: seed 1 in seed 0's directory


@pytest.fixture(scope="module")
def bridges(tmp_path_factory):
    from tl_idempotence.sources.tl import bridge_from_dir
    from tl_idempotence.testing import tiny_hf_dir

    out = []
    for seed in (0, 1):
        d = tiny_hf_dir(
            tmp_path_factory.mktemp(f"seed{seed}") / "tiny",
            n_layers=2,
            d_model=32,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=64,
            seed=seed,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(bridge_from_dir(d))
    return out


def test_other_model_resumed_in_a_directory_recomputes_every_layer(bridges, tmp_path, analysed):
    m0, m1 = bridges
    rd = tmp_path / "parts"
    first = report(m0, rd)
    assert analysed == [0, 1]
    fresh1 = report(m1)
    analysed.clear()
    with pytest.warns(UserWarning) as rec:
        resumed = report(m1, rd)
    assert analysed == [0, 1]  # nothing of seed 0 was reused
    msgs = stale_warnings(rec)
    for layer in (0, 1):
        assert any(f"layer_{layer:05d}.json" in m and "weights changed" in m for m in msgs), msgs
    same(resumed, fresh1)
    assert not (resumed.heads["P"].to_numpy() == first.heads["P"].to_numpy()).all()
    # and the directory now holds seed 1's parts: a third run reuses them all
    analysed.clear()
    again = report(m1, rd)
    assert analysed == [] and again.summary["n_layers_resumed"] == 2
    same(again, fresh1)


# --------------------------------------------------------------------------- checkpoint directories


@pytest.fixture
def ckpt(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck", n_layers=4, nq=6, nkv=2, dm=32, dh=4)
    return d


def resave_with(d: Path, tensor: str, fn) -> None:
    """Re-save the shard holding ``tensor`` with ``fn(tensor)`` in its place (the index is unchanged)."""
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = d / index["weight_map"][tensor]
    tensors = load_file(str(shard))
    tensors[tensor] = fn(tensors[tensor].clone()).contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})


def test_checkpoint_resaved_with_layer_2_changed_recomputes_layer_2_only(ckpt, tmp_path, analysed):
    rd = tmp_path / "parts"
    before = report(str(ckpt), rd)
    assert analysed == [0, 1, 2, 3]
    resave_with(ckpt, "model.layers.2.self_attn.v_proj.weight", lambda t: t * 1.5 + 0.01)
    analysed.clear()
    with pytest.warns(UserWarning) as rec:
        resumed = report(str(ckpt), rd)
    assert analysed == [2]
    assert [m for m in stale_warnings(rec) if "layer_00002.json" in m], stale_warnings(rec)
    assert resumed.summary["n_layers_resumed"] == 3
    fresh = report(str(ckpt))
    same(resumed, fresh)
    changed = resumed.heads["layer"] == 2
    assert (resumed.heads.loc[changed, "P"] != before.heads.loc[changed, "P"]).all()
    pd.testing.assert_frame_equal(resumed.heads[~changed], before.heads[~changed], check_exact=True)


def test_part_copied_to_another_layer_is_recomputed(ckpt, tmp_path, analysed):
    rd = tmp_path / "parts"
    fresh = report(str(ckpt), rd)
    for f in rd.glob("layer_00001.*"):
        shutil.copyfile(f, rd / f.name.replace("layer_00001", "layer_00002"))
    analysed.clear()
    with pytest.warns(UserWarning) as rec:
        resumed = report(str(ckpt), rd)
    assert analysed == [2]
    assert any("layer_00002.json" in m and "records layer 1" in m for m in stale_warnings(rec)), stale_warnings(rec)
    same(resumed, fresh)


def test_only_the_record_copied_is_recomputed_too(ckpt, tmp_path, analysed):
    rd = tmp_path / "parts"
    fresh = report(str(ckpt), rd)
    shutil.copyfile(rd / "layer_00000.json", rd / "layer_00003.json")
    analysed.clear()
    with pytest.warns(UserWarning, match="layer_00003.json"):
        resumed = report(str(ckpt), rd)
    assert analysed == [3]
    same(resumed, fresh)


def test_parts_kept_after_the_manifest_is_deleted_are_used_only_when_their_fingerprint_matches(
    ckpt, tmp_path, analysed
):
    rd = tmp_path / "parts"
    fresh = report(str(ckpt), rd)
    (rd / "manifest.json").unlink()
    analysed.clear()
    resumed = report(str(ckpt), rd)  # same weights, same options: every part matches
    assert analysed == [] and resumed.summary["n_layers_resumed"] == 4
    same(resumed, fresh)
    # other weights (layer 0 changed), manifest deleted again: layer 0's part no longer matches
    resave_with(ckpt, "model.layers.0.self_attn.o_proj.weight", lambda t: -t)
    (rd / "manifest.json").unlink()
    analysed.clear()
    with pytest.warns(UserWarning, match="layer_00000.json"):
        resumed2 = report(str(ckpt), rd)
    assert analysed == [0]
    same(resumed2, report(str(ckpt)))


@pytest.mark.parametrize("other", [{"seed": 1}, {"nulls": 5}, {"threshold": 0.5}], ids=["seed", "nulls", "threshold"])
def test_parts_kept_after_the_manifest_is_deleted_are_not_taken_for_other_options(ckpt, tmp_path, analysed, other):
    """A report with seed=0, nulls=4 into DIR, DIR/manifest.json deleted, then a report with
    other options: every layer is recomputed (with a warning naming the part), so the result labelled with the
    new options holds the new options' numbers, never the old ones (it equals a fresh report bit for bit)."""
    rd = tmp_path / "parts"
    report(str(ckpt), rd, seed=0)
    (rd / "manifest.json").unlink()
    analysed.clear()
    with pytest.warns(UserWarning, match="made with other options"):
        resumed = report(str(ckpt), rd, **{"seed": 0, **other})
    assert analysed == [0, 1, 2, 3] and resumed.summary["n_layers_resumed"] == 0
    fresh = report(str(ckpt), **{"seed": 0, **other})
    same(resumed, fresh)
    if "seed" in other:  # the seed changes the scramble's draws: the old numbers would be visible
        old = report(str(ckpt), seed=0)
        assert not resumed.heads["P_scrambled_median"].equals(old.heads["P_scrambled_median"])


def flip_byte(f: Path, offset: int) -> None:
    b = bytearray(f.read_bytes())
    b[offset] ^= 0x01
    f.write_bytes(bytes(b))


def edit_row_number(f: Path) -> None:
    rec = json.loads(f.read_text())
    rec["row"]["median_P"] = 0.99  # a plausible number, valid JSON: only the digest can tell
    f.write_text(json.dumps(rec, indent=1, sort_keys=True))


DAMAGE = {
    "truncated heads parquet": ("layer_00001.heads.parquet", lambda f: f.write_bytes(f.read_bytes()[:-40])),
    "flipped byte in heads parquet": ("layer_00001.heads.parquet", lambda f: flip_byte(f, len(f.read_bytes()) // 2)),
    "bytes appended to a table": (
        "layer_00001.scramble_draws.parquet",
        lambda f: f.write_bytes(f.read_bytes() + b"xx"),
    ),
    "table deleted": ("layer_00001.mismatch_pairs.parquet", lambda f: f.unlink()),
    "edited number in the record": ("layer_00001.json", edit_row_number),
    "edited fingerprint in the record": (
        "layer_00001.json",
        lambda f: f.write_text(f.read_text().replace('"fingerprint": "', '"fingerprint": "0')),
    ),
    "flipped byte in the record": ("layer_00001.json", lambda f: flip_byte(f, 40)),
    "truncated record": ("layer_00001.json", lambda f: f.write_bytes(f.read_bytes()[:100])),
    "record not UTF-8": ("layer_00001.json", lambda f: f.write_bytes(b"\xff\xfe" + f.read_bytes())),
    "record is a list": ("layer_00001.json", lambda f: f.write_text("[1, 2]")),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_damaged_part_is_recomputed_with_a_warning_naming_the_file(ckpt, tmp_path, analysed, name):
    rd = tmp_path / "parts"
    fresh = report(str(ckpt), rd)
    fname, damage = DAMAGE[name]
    damage(rd / fname)
    analysed.clear()
    with pytest.warns(UserWarning) as rec:
        resumed = report(str(ckpt), rd)
    assert analysed == [1]
    msgs = stale_warnings(rec)
    assert any("layer_00001" in m and "recomputing layer 1" in m for m in msgs), msgs
    if fname.endswith(".parquet"):
        assert any(fname in m for m in msgs), msgs
    same(resumed, fresh)
    # the damaged part was rewritten: the next run reuses it
    analysed.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        report(str(ckpt), rd)
    assert analysed == []


@pytest.mark.parametrize(
    "other,differs",
    [
        (dict(nulls=8), "options.nulls: 4 -> 8"),
        (dict(seed=3), "options.seed: 0 -> 3"),
        (dict(threshold=0.5), "options.threshold: 0.9 -> 0.5"),
        (dict(search=True), "options.search"),
        (dict(compute_dtype="float32"), "options.compute_dtype: 'float64' -> 'float32'"),
    ],
)
def test_manifest_with_other_options_is_refused_naming_the_option(ckpt, tmp_path, other, differs):
    rd = tmp_path / "parts"
    report(str(ckpt), rd, layers=[0])
    with pytest.raises(ResumeError) as ei:
        report(str(ckpt), rd, **other)
    assert type(ei.value) is ResumeError
    assert differs in str(ei.value) and str(rd) in str(ei.value)


@pytest.mark.parametrize(
    "content,words",
    [
        (b"{not json", ["manifest.json", "not valid JSON"]),
        (b"\xff\xfe", ["manifest.json", "UTF-8"]),
        (b"[1]", ["manifest.json", "format"]),
        (b'{"format": "other/1"}', ["manifest.json", "'other/1'"]),
    ],
    ids=["not JSON", "not UTF-8", "a list", "another format"],
)
def test_damaged_manifest_is_an_error_naming_it(ckpt, tmp_path, content, words):
    rd = tmp_path / "parts"
    report(str(ckpt), rd, layers=[0])
    (rd / "manifest.json").write_bytes(content)
    with pytest.raises(ResumeError) as ei:
        report(str(ckpt), rd)
    assert type(ei.value) is ResumeError
    for w in words:
        assert w in str(ei.value)


def test_record_that_is_a_directory_is_an_error_naming_it(ckpt, tmp_path):
    rd = tmp_path / "parts"
    report(str(ckpt), rd)
    (rd / "layer_00001.json").unlink()
    (rd / "layer_00001.json").mkdir()
    with pytest.warns(UserWarning, match="layer_00001.json"), pytest.raises(ResumeError) as ei:
        report(str(ckpt), rd)
    assert type(ei.value) is ResumeError and "layer_00001.json" in str(ei.value)


def test_resume_path_that_is_a_file(ckpt, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ResumeError, match="is a file"):
        report(str(ckpt), f)


def test_nothing_in_the_directory_is_a_pickle(ckpt, tmp_path):
    rd = tmp_path / "parts"
    report(str(ckpt), rd, search=True, algebra=True)
    files = sorted(rd.iterdir())
    assert files
    for f in files:
        data = f.read_bytes()
        assert not data.startswith(b"\x80"), f"{f.name} looks like a pickle"
        if f.suffix == ".parquet":
            assert data[:4] == b"PAR1" and data[-4:] == b"PAR1", f.name
        else:
            assert f.suffix == ".json", f.name
            json.loads(data.decode("utf-8"))
    assert {f.suffix for f in files} == {".json", ".parquet"}


# --------------------------------------------------------------------------- trajectory cache


def rewrite_value_in_place(d: Path, tensor: str) -> Path:
    """Change one value of ``tensor`` in its shard without changing the file's size or mtime."""
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = d / index["weight_map"][tensor]
    st = shard.stat()
    raw = bytearray(shard.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    start = 8 + n + header[tensor]["data_offsets"][0]
    old = torch.frombuffer(bytearray(raw[start : start + 4]), dtype=torch.float32).item()
    raw[start : start + 4] = torch.tensor([old * 3.0 + 1.0], dtype=torch.float32).view(torch.uint8).numpy().tobytes()
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    return shard


def test_trajectory_cache_recomputes_a_checkpoint_whose_bytes_changed_with_same_name_size_and_mtime(
    ckpt, tmp_path, analysed
):
    cache = tmp_path / "cache"
    t1 = tli.trajectory([("step100", ckpt)], cache_dir=cache, progress=False)
    assert analysed == [0, 1, 2, 3] and not bool(t1.checkpoints["cached"].iloc[0])
    analysed.clear()
    t2 = tli.trajectory([("step100", ckpt)], cache_dir=cache, progress=False)
    assert analysed == [] and bool(t2.checkpoints["cached"].iloc[0])
    pd.testing.assert_frame_equal(t1.heads, t2.heads, check_exact=True)

    rewrite_value_in_place(ckpt, "model.layers.3.self_attn.v_proj.weight")
    analysed.clear()
    with pytest.warns(UserWarning, match="layer_00003.json"):
        t3 = tli.trajectory([("step100", ckpt)], cache_dir=cache, progress=False)
    assert analysed == [3] and not bool(t3.checkpoints["cached"].iloc[0])
    fresh = tli.idempotence_report(str(ckpt), progress=False)
    got = t3.heads.drop(columns=["checkpoint", "order", "step"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, fresh.heads.reset_index(drop=True), check_exact=True)
    assert t3.checkpoints["weights_fingerprint"].iloc[0] != t1.checkpoints["weights_fingerprint"].iloc[0]


# --------------------------------------------------------------------------- saved reports (rep.save / load_report)


def _edit_summary(f: Path) -> None:
    rec = json.loads(f.read_text())
    rec["summary"]["n_closed"] = rec["summary"]["n_closed"] + 5  # valid JSON, plausible number
    f.write_text(json.dumps(rec, indent=1, sort_keys=True))


SAVED_DAMAGE = {
    "edited summary number": ("report.json", _edit_summary, "ReportFileError", "digest"),
    "edited options": (
        "report.json",
        lambda f: f.write_text(f.read_text().replace('"threshold": 0.9', '"threshold": 0.5')),
        "ReportFileError",
        "digest",
    ),
    "flipped byte in heads": ("heads.parquet", lambda f: flip_byte(f, 100), "ReportFileError", "sha256"),
    "truncated layers": ("layers.parquet", lambda f: f.write_bytes(f.read_bytes()[:50]), "ReportFileError", "sha256"),
    "table deleted": ("scramble_draws.parquet", lambda f: f.unlink(), "MissingFileError", "missing"),
    "record not JSON": ("report.json", lambda f: f.write_text("{"), "ReportFileError", "not valid JSON"),
}


@pytest.mark.parametrize("name", list(SAVED_DAMAGE))
def test_a_changed_saved_report_is_refused_naming_the_file(ckpt, tmp_path, name):
    rep = report(str(ckpt))
    rep.save(tmp_path / "saved")
    fname, damage, exc, word = SAVED_DAMAGE[name]
    damage(tmp_path / "saved" / fname)
    with pytest.raises(tli.errors.TLIError) as ei:
        tli.load_report(tmp_path / "saved")
    assert type(ei.value).__name__ == exc and fname in str(ei.value) and word in str(ei.value), str(ei.value)


def test_saved_report_round_trip_is_exact_and_save_checks_its_arguments(ckpt, tmp_path):
    rep = report(str(ckpt))
    rep.save(tmp_path / "saved")
    same(tli.load_report(tmp_path / "saved"), rep)
    with pytest.raises(tli.errors.OptionTypeError, match="overwrite"):
        rep.save(tmp_path / "saved", overwrite="no")  # a truthy string must not delete the folder
    assert (tmp_path / "saved" / "report.json").is_file()
    with pytest.raises(tli.errors.OptionTypeError, match="path"):
        rep.save(3)
    with pytest.raises(tli.errors.OptionTypeError, match="path"):
        tli.load_report(3)


def test_part_made_by_another_package_version_is_recomputed(ckpt, tmp_path, analysed, monkeypatch):
    import tl_idempotence.report.parts as parts_mod

    rd = tmp_path / "parts"
    fresh = report(str(ckpt), rd, layers=[0, 1])
    monkeypatch.setattr(parts_mod, "_VERSION", "99.0")
    analysed.clear()
    with pytest.warns(UserWarning, match="made by tl_idempotence '0"):
        resumed = report(str(ckpt), rd, layers=[0, 1])
    assert analysed == [0, 1]
    same(resumed, fresh)


def test_opening_a_resume_directory_removes_only_its_own_temp_files(ckpt, tmp_path):
    rd = tmp_path / "parts"
    rd.mkdir()
    (rd / "notes.tmp.txt").write_text("a user's file")
    (rd / "layer_00001.json.tmp123").write_text("{")  # a killed writer's temp file
    report(str(ckpt), rd, layers=[0])
    assert (rd / "notes.tmp.txt").read_text() == "a user's file"
    assert not (rd / "layer_00001.json.tmp123").exists()


def digest_of(rec: dict) -> str:
    """A part record's digest, from its definition (sha256 of the canonical JSON of the record without
    ``digest``: sorted keys, no spaces), so an edit can be made to pass the digest check."""
    import hashlib

    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def edit_part(rd: Path, layer: int, edit, redigest: bool = True) -> Path:
    f = rd / f"layer_{layer:05d}.json"
    rec = json.loads(f.read_text())
    edit(rec, rd)
    if redigest:
        rec["digest"] = digest_of(rec)
    f.write_text(json.dumps(rec, indent=1, sort_keys=True))
    return f


def not_parquet(rec: dict, rd: Path) -> None:
    """heads table replaced by bytes that are no parquet file, its recorded sha256 updated to match."""
    import hashlib

    t = rd / "layer_00001.heads.parquet"
    t.write_bytes(b"not a parquet file at all")
    rec["files"]["heads"] = hashlib.sha256(t.read_bytes()).hexdigest()


def damaged_footer(rec: dict, rd: Path) -> None:
    """heads table replaced by a parquet file whose footer metadata is garbage (pyarrow raises an OSError
    without errno for it), its recorded sha256 updated to match."""
    import hashlib
    import struct

    t = rd / "layer_00001.heads.parquet"
    t.write_bytes(b"PAR1" + b"\0" * 20 + b"\xff" * 30 + struct.pack("<i", 30) + b"PAR1")
    rec["files"]["heads"] = hashlib.sha256(t.read_bytes()).hexdigest()


PART_EDITS = {  # (edit of layer 1's record, recompute the digest, the exact reason the warning gives)
    "other format": (lambda r, _: r.update(format="other/1"), True, "not a part record of this format"),
    "stale digest": (
        lambda r, _: r.update(fingerprint="0" * 64),
        False,
        "its record does not match its recorded sha256 digest (edited or damaged)",
    ),
    "other options": (lambda r, _: r["options"].update(seed=7), True, "it was made with other options"),
    "other code": (
        lambda r, _: r.update(code="0" * 64),
        True,
        "it was made by other code of tl_idempotence (the package's code sha256 differs)",
    ),
    "no table files": (lambda r, _: r.update(files={}), True, "its record lists no table files"),
    "row keys differ": (lambda r, _: r.update(row_keys=["nope"]), True, "its layer row is malformed"),
    "row not a mapping": (lambda r, _: r.update(row=list(r["row_keys"])), True, "its layer row is malformed"),
    # a part without its row, or with an empty one, and row_keys [] to match (taken, it would load as a
    # layer without values)
    "no row": (lambda r, _: (r.pop("row"), r.update(row_keys=[])), True, "its layer row is malformed"),
    "empty row": (lambda r, _: r.update(row={}, row_keys=[]), True, "its layer row is malformed"),
    "not parquet": (not_parquet, True, "layer_00001.heads.parquet is not a readable parquet file (Arrow"),
    "damaged footer": (  # the reader's own words when the OSError has no strerror (never "None")
        damaged_footer,
        True,
        "layer_00001.heads.parquet cannot be read (Could not open Parquet input source '",
    ),
}


@pytest.mark.parametrize("case", list(PART_EDITS))
def test_each_stale_part_says_exactly_why(ckpt, tmp_path, analysed, case):
    """A part that cannot be taken is recomputed with a UserWarning naming its file and the exact reason;
    the result equals a fresh report bit for bit."""
    edit, redigest, reason = PART_EDITS[case]
    rd = tmp_path / "parts"
    fresh = report(str(ckpt), rd)
    f = edit_part(rd, 1, edit, redigest)
    if case == "other options":  # the manifest would refuse the folder first: only the part's key is tested
        (rd / "manifest.json").unlink()
    analysed.clear()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resumed = report(str(ckpt), rd)
    got = [w for w in record if "Resume part" in str(w.message)]
    assert [w.category for w in got] == [UserWarning], [str(w.message) for w in record]
    assert str(got[0].message).startswith(f"Resume part {f}: {reason}"), str(got[0].message)
    assert str(got[0].message).endswith("; recomputing layer 1.")
    assert analysed == [1]
    same(resumed, fresh)


def test_a_part_that_is_not_json_says_so(ckpt, tmp_path, analysed):
    rd = tmp_path / "parts"
    report(str(ckpt), rd)
    f = rd / "layer_00002.json"
    f.write_text("{not json")
    with pytest.warns(UserWarning) as record:
        report(str(ckpt), rd)
    msgs = [str(w.message) for w in record if "Resume part" in str(w.message)]
    assert msgs == [
        f"Resume part {f}: resume part {f} is not valid JSON (line 1, column 2: Expecting property name "
        "enclosed in double quotes); recomputing layer 2."
    ], msgs


def test_a_stale_part_warning_points_at_the_users_line(ckpt, tmp_path):
    """The warning is attributed to the caller's line (core.kwargs.warn_at_caller), not to the package's report
    loop, so filters and tracebacks name the user's code (a wrong stacklevel in ResumeDir.load
    would fail)."""
    rd = tmp_path / "parts"
    tli.idempotence_report(str(ckpt), resume=rd, **OPTS)
    shutil.copyfile(rd / "layer_00000.json", rd / "layer_00003.json")
    with pytest.warns(UserWarning, match="layer_00003.json") as rec:
        tli.idempotence_report(str(ckpt), resume=rd, **OPTS)  # <- the line the warning must name
    (w,) = [w for w in rec if "Resume part" in str(w.message)]
    assert Path(w.filename).resolve() == Path(__file__).resolve()
    assert (
        "tli.idempotence_report(str(ckpt), resume=rd, **OPTS)  # <- the line"
        in Path(__file__).read_text("utf-8").splitlines()[w.lineno - 1]
    )
