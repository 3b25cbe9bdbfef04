"""The zoo package's public face and its one loader of a local folder (sources/zoo/loaders.py: model_from_dir),
which tli.models.load, tl.bridge_from_dir and tl_idempotence.testing all load through. No model is built here:
the loader's two builders are replaced by recorders."""

from __future__ import annotations

import pytest

import tl_idempotence as tli
from tl_idempotence import testing
from tl_idempotence.errors import DeviceError, MissingFileError, OptionError, OptionTypeError
from tl_idempotence.sources import tl as tl_source
from tl_idempotence.sources import zoo
from tl_idempotence.sources.zoo import loaders as zoo_load


def test_every_public_name_of_the_zoo_is_reachable_as_before():
    assert tli.models is zoo
    for name in zoo.__all__:
        assert getattr(tli.models, name) is getattr(zoo, name), name
    from tl_idempotence.sources.zoo import cache_dir, checkpoint_dir, known_models, model_spec, source  # noqa: F401

    assert zoo.load is zoo_load.load and zoo.source is zoo_load.source and zoo.model_from_dir is zoo_load.model_from_dir
    assert zoo.MARKER == "tli_cache.json" and zoo.CACHE_ENV == "TL_IDEMPOTENCE_CACHE"
    assert zoo.known_models() == ["gemma-3-270m", "minilm-l6", "smollm2-135m"]


@pytest.fixture
def recorded(monkeypatch):
    """model_from_dir's builders replaced by recorders: (builder, folder, processing, device, extra)."""
    calls: list[tuple] = []

    def boot(hf, processing, device, **boot):
        calls.append(("bridge", hf, processing, device, boot))
        return "bridge-model", {}, []

    def build(hf, processing, device, hf_model=None):
        calls.append(("hooked", hf, processing, device, hf_model))
        return "hooked-model", {}, []

    monkeypatch.setattr(zoo_load, "_boot_bridge", boot)
    monkeypatch.setattr(zoo_load, "_build_hooked", build)
    return calls


def test_the_tiny_test_models_load_through_the_zoo_loader(recorded, tmp_path):
    assert testing.bridge_from_dir(tmp_path) == "bridge-model"
    assert tl_source.bridge_from_dir(tmp_path, device="cpu", dtype="float32") == "bridge-model"
    assert testing.hooked_from_dir(str(tmp_path), hf_model="hf") == "hooked-model"
    assert recorded == [
        ("bridge", tmp_path, "raw", "cpu", {}),
        ("bridge", tmp_path, "raw", "cpu", {"dtype": "float32"}),
        ("hooked", tmp_path, "raw", "cpu", "hf"),
    ]


def test_model_from_dir_passes_processing_and_device(recorded, tmp_path):
    zoo.model_from_dir(tmp_path, "tl", "hooked", device="cpu")
    zoo.model_from_dir(tmp_path, processing="tl")
    assert [c[:4] for c in recorded] == [("hooked", tmp_path, "tl", "cpu"), ("bridge", tmp_path, "tl", "cpu")]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"path": 3}, OptionTypeError, r"path must be a str or os\.PathLike folder; got int"),
        ({"path": b"x"}, OptionTypeError, "got bytes"),
        ({"processing": "folded"}, OptionError, r"processing must be 'raw' or 'tl'; got 'folded'"),
        ({"processing": 1}, OptionTypeError, "processing must be a string; got int"),
        ({"cls": "Hooked"}, OptionError, r"cls must be 'bridge' \(TransformerBridge\) or 'hooked'"),
        ({"cls": "bridge", "hf_model": object()}, OptionError, "hf_model= is for cls='hooked'"),
        ({"cls": "hooked", "dtype": "float32"}, OptionError, r"dtype= are TransformerBridge\.boot_transformers"),
        ({"device": "nonsense:0"}, DeviceError, "nonsense"),
    ],
)
def test_model_from_dir_refuses_bad_arguments_before_loading(recorded, tmp_path, kwargs, error, match):
    kwargs = {"path": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        zoo.model_from_dir(**kwargs)
    assert recorded == []


def test_a_missing_folder_is_named(recorded, tmp_path):
    with pytest.raises(MissingFileError, match=r"no-such.* is not a folder"):
        testing.bridge_from_dir(tmp_path / "no-such")
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(MissingFileError, match=r"f\.json is not a folder"):
        zoo.model_from_dir(tmp_path / "f.json", cls="hooked")
    assert recorded == []


def test_load_refuses_a_hooked_encoder_before_anything_is_fetched(monkeypatch, tmp_path):
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))  # empty: a fetch would need the network
    with pytest.raises(OptionError, match="cls='hooked' is not available for minilm-l6"):
        zoo.load("minilm-l6", cls="hooked", progress=False)
    with pytest.raises(OptionError, match="cls='hooked' is not available for gemma-3-270m"):
        zoo.load("gemma-3-270m", cls="hooked", progress=False)
    assert not (tmp_path / "cache").exists()


def test_the_zoo_modules_import_only_the_jobs_before_them():
    """registry <- cache <- download <- convert <- folders <- loaders (docs/architecture.md): no job reaches back."""
    import ast
    from pathlib import Path

    order = ["registry", "cache", "download", "convert", "folders", "loaders"]
    root = Path(zoo.__file__).parent
    assert sorted(p.stem for p in root.glob("*.py")) == sorted([*order, "__init__"])
    seen = {}
    for i, mod in enumerate(order):
        tree = ast.parse((root / f"{mod}.py").read_text(encoding="utf-8"))
        siblings = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}
        seen[mod] = siblings
        assert siblings <= set(order[:i]), f"{mod} imports {siblings - set(order[:i])}"
    assert seen["loaders"] == {"folders", "registry"} and seen["registry"] == set()
