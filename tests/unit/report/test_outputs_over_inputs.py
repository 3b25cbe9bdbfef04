"""An output never replaces an input: ``rep.save_html``, ``rep.save``, ``resume=`` and the
comparison page refuse a path that is (or links to) a file or folder the report was read from.

Each test makes a small checkpoint (and a resume folder, a saved report) in tmp_path, asks for an output over
it the way a user would, and checks the refusal names both paths and every input file is byte-identical.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from pathlib import Path

import pytest

import tl_idempotence as tli
from helpers import llama_like, random_heads, write_gguf_file
from tl_idempotence.errors import OptionError, OutputOverInputError
from tl_idempotence.sources.checkpoint import from_path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def digests(d: Path) -> dict[str, str]:
    """sha256 of every file under ``d`` (relative path -> hex)."""
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()
    }


@pytest.fixture
def ck(tmp_path):
    d, _, _ = llama_like(tmp_path / "CK", n_layers=2)
    return d


def test_save_html_and_save_refuse_the_checkpoints_files(ck, tmp_path):
    before = digests(ck)
    rep = tli.idempotence_report(str(ck), progress=False)
    shard = sorted(ck.glob("*.safetensors"))[0]
    (tmp_path / "to_config").symlink_to(ck / "config.json")
    os.link(shard, tmp_path / "hard.safetensors")
    for path, says in [
        (shard, f"path {shard} is a file of the checkpoint {ck}"),
        (ck / "config.json", f"path {ck / 'config.json'} is a file of the checkpoint {ck}"),
        (ck / "model.safetensors.index.json", "model.safetensors.index.json is a file of the checkpoint"),
        (tmp_path / "to_config", f"is a symbolic link to {ck / 'config.json'}, a file of the checkpoint {ck}"),
        (tmp_path / "hard.safetensors", f"is the same file (a hard link) as {shard}"),
    ]:
        with pytest.raises(OutputOverInputError, match="which this run reads") as e:
            rep.save_html(path)
        assert says in str(e.value), str(e.value)
    with pytest.raises(OutputOverInputError, match=re.escape(f"path {ck} is the checkpoint {ck}")):
        rep.save(ck, overwrite=True)
    assert digests(ck) == before
    # a re-thresholded copy keeps what it was read from
    with pytest.raises(OutputOverInputError):
        rep.with_threshold(0.5).save_html(ck / "config.json")
    # beside the checkpoint, a new file is fine (and the checkpoint still reads)
    page = Path(rep.save_html(ck / "report.html"))
    assert page.stat().st_size > 1000 and {**before, "report.html": digests(ck)["report.html"]} == digests(ck)
    assert tli.idempotence_report(str(ck), progress=False).heads.equals(rep.heads)


def test_a_source_object_and_a_single_file_route_know_their_files(ck, tmp_path):
    rep = tli.idempotence_report(from_path(ck / "config.json"), progress=False)  # a CheckpointSource
    assert ("the checkpoint", ck) in rep.inputs
    with pytest.raises(OutputOverInputError, match=re.escape("config.json is a file of the checkpoint")):
        rep.save_html(ck / "config.json")
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    gguf = write_gguf_file(tmp_path / "m.gguf", O, V)
    before = gguf.read_bytes()
    rep = tli.idempotence_report(gguf, progress=False)
    with pytest.raises(OutputOverInputError, match=re.escape(f"path {gguf} is the checkpoint {gguf}")):
        rep.save_html(gguf)
    assert gguf.read_bytes() == before


def test_a_relative_checkpoint_path_is_kept_absolute(ck, tmp_path, monkeypatch):
    monkeypatch.chdir(ck.parent)
    rep = tli.idempotence_report("CK", resume="parts", progress=False)
    assert ("the checkpoint", ck) in rep.inputs and ("the resume folder", tmp_path / "parts") in rep.inputs
    monkeypatch.chdir(tmp_path / "parts")  # the report is saved from elsewhere
    with pytest.raises(OutputOverInputError, match=re.escape(f"a file of the checkpoint {ck}")):
        rep.save_html("../CK/config.json")


def test_resume_folder_parts_are_inputs_and_resume_is_never_the_checkpoint(ck, tmp_path):
    before = digests(ck)
    with pytest.raises(OutputOverInputError, match=re.escape(f"resume {ck} is the checkpoint {ck}")):
        tli.idempotence_report(str(ck), resume=ck, progress=False)
    link = tmp_path / "ck_link"
    link.symlink_to(ck, target_is_directory=True)
    says = f"resume {link} is a symbolic link to the checkpoint {ck}"
    with pytest.raises(OutputOverInputError, match=re.escape(says)):
        tli.idempotence_report(str(ck), resume=link, progress=False)
    assert digests(ck) == before  # no manifest, no part was written into the checkpoint

    parts = tmp_path / "parts"
    rep = tli.idempotence_report(str(ck), resume=parts, progress=False)
    kept = digests(parts)
    assert "manifest.json" in kept
    part = sorted(p for p in parts.iterdir() if p.name.endswith(".heads.parquet"))[0]
    for path in (parts / "manifest.json", part):
        with pytest.raises(OutputOverInputError, match=re.escape(f"a file of the resume folder {parts}")):
            rep.save_html(path)
    with pytest.raises(OutputOverInputError, match=re.escape(f"path {parts} is the resume folder {parts}")):
        rep.save(parts, overwrite=True)
    assert digests(parts) == kept
    # the parts still resume every layer
    again = tli.idempotence_report(str(ck), resume=parts, progress=False)
    assert again.summary["n_layers_resumed"] == 2 and again.heads.equals(rep.heads)


def test_a_loaded_report_is_never_saved_over_itself(ck, tmp_path):
    rep = tli.idempotence_report(str(ck), progress=False)
    d = Path(rep.save(tmp_path / "saved"))
    kept = digests(d)
    back = tli.load_report(d)
    with pytest.raises(OutputOverInputError, match=re.escape(f"path {d} is the saved report {d}")):
        back.with_threshold(0.5).save(d, overwrite=True)
    with pytest.raises(OutputOverInputError, match=re.escape(f"report.json is a file of the saved report {d}")):
        back.save_html(d / "report.json")
    assert digests(d) == kept
    assert tli.load_report(d).heads.equals(rep.heads)
    back.save(tmp_path / "copy")  # elsewhere: fine
    assert digests(tmp_path / "copy") == kept


def test_the_comparison_page_refuses_its_items_files(ck, tmp_path):
    other, _, _ = llama_like(tmp_path / "other", n_layers=2, nq=4, nkv=4, dm=32)
    before = digests(ck)
    saved = Path(tli.idempotence_report(str(other), progress=False).save(tmp_path / "saved_other"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cmp = tli.compare({"a": str(ck), "b": saved}, progress=False)
    for path, says in [
        (ck / "config.json", f"a file of the checkpoint {ck}"),
        (saved / "heads.parquet", f"a file of the saved report {saved}"),
    ]:
        with pytest.raises(OutputOverInputError, match="which this run reads") as e:
            cmp.save_html(path)
        assert says in str(e.value) and isinstance(e.value, OptionError)
    assert digests(ck) == before
    assert Path(cmp.save_html(tmp_path / "cmp.html")).is_file()
