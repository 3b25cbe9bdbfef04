"""The name rule of ``sources/names.py`` checked value by value (the mutation target
``name_resolver`` runs these): the zoo prefix cut exactly, ``~`` expanded,
a dangling link taken for a path, every message in full, which folder a checkpoint file names and its label
whatever the case of its suffix or the working folder.

Expected values are written here (the zoo's three names, the messages' words), never computed by the module.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tl_idempotence.errors import MissingFileError, OptionError, OptionTypeError, UnknownModelError
from tl_idempotence.sources.names import (
    ZOO_PREFIX,
    Named,
    checkpoint_of,
    close_zoo_names,
    hub_offline,
    in_hub_cache,
    is_hub_id,
    known_and_close,
    missing_path_error,
    named_inputs,
    path_label,
    resolve_name,
)

ZOO_NAMES = "gemma-3-270m, minilm-l6, smollm2-135m"  # data/models.json, sorted


def test_the_zoo_prefix_is_cut_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ZOO_PREFIX == "zoo:"
    assert resolve_name("zoo:smollm2-135m") == Named("zoo", "smollm2-135m")
    (tmp_path / "zoo:minilm-l6").mkdir()  # a folder spelled like the prefixed name: the prefix still wins
    assert resolve_name("zoo:minilm-l6") == Named("zoo", "minilm-l6")
    with pytest.raises(UnknownModelError, match=r"Unknown zoo model 'minilm'\. Known models: " + ZOO_NAMES):
        resolve_name("zoo:minilm")
    assert resolve_name("ZOO:minilm-l6") == Named("unknown", "ZOO:minilm-l6")  # the prefix is lower case


def test_paths_strings_and_links(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "ck").mkdir(parents=True)
    got = resolve_name("~/ck")
    assert got == Named("path", tmp_path / "home" / "ck") and got.kind == "path"
    assert resolve_name(Path("~/nowhere")) == Named("path", tmp_path / "home" / "nowhere")  # a Path: no check
    os.symlink(tmp_path / "gone", tmp_path / "dangling")  # lexists, not exists: the file route says what it is
    assert resolve_name("dangling") == Named("path", Path("dangling"))
    (tmp_path / "plain").mkdir()
    assert resolve_name("plain") == Named("path", Path("plain"))
    assert resolve_name("gemma-3-270m") == Named("zoo", "gemma-3-270m")  # no such folder here
    assert resolve_name("nothing-here") == Named("unknown", "nothing-here")


def test_messages_in_full(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").mkdir()
    with pytest.raises(OptionError) as e:
        resolve_name("smollm2-135m", where="items['a']")
    assert str(e.value) == (
        "items['a']: 'smollm2-135m' is both a zoo model name and an existing path (smollm2-135m/ here). Write "
        "'zoo:smollm2-135m' for the zoo model, or './smollm2-135m' (or pathlib.Path('smollm2-135m')) for the folder."
    )
    with pytest.raises(OptionTypeError) as t:
        resolve_name(3.5, where="ITEM")  # type: ignore[arg-type]
    assert str(t.value) == "ITEM must be a str or a path; got float."
    with pytest.raises(OptionTypeError, match=r"^model must be a str or a path; got NoneType\.$"):
        resolve_name(None)  # type: ignore[arg-type]
    err = missing_path_error(Path("a/b"), where="items['x']")
    assert isinstance(err, MissingFileError)
    assert str(err) == (
        "items['x']: 'a/b' is not an existing file or folder, nor a zoo model name "
        f"({ZOO_NAMES}); nothing is downloaded for paths."
    )
    assert str(missing_path_error("q")).startswith("model: 'q' is not an existing file or folder")


def test_which_checkpoint_a_path_names(tmp_path):
    ck = tmp_path / "ckpt"
    ck.mkdir()
    for f in ("model.safetensors", "config.json", "MODEL.SAFETENSORS", "Config.JSON"):
        (ck / f).write_bytes(b"")
        assert checkpoint_of(ck / f) == ck, f
    assert checkpoint_of(ck) == ck
    assert checkpoint_of(tmp_path / "missing" / "model.safetensors") == tmp_path / "missing"  # not a folder
    assert checkpoint_of(tmp_path / "w.gguf") == tmp_path / "w.gguf"
    assert checkpoint_of(tmp_path / "w.bin") == tmp_path / "w.bin"
    odd = tmp_path / "run.json"  # a folder whose name ends like a checkpoint file is itself
    odd.mkdir()
    assert checkpoint_of(odd) == odd
    assert checkpoint_of(str(ck / "config.json")) == ck  # type: ignore[arg-type]


def test_what_a_run_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_IDEMPOTENCE_CACHE", str(tmp_path / "cache"))
    assert named_inputs(Named("zoo", "minilm-l6")) == [("the zoo cache", tmp_path / "cache")]
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"")
    assert named_inputs(Named("path", ck / "model.safetensors")) == [("the checkpoint", ck)]
    assert named_inputs(Named("path", str(ck))) == [("the checkpoint", ck)]
    assert named_inputs(Named("unknown", "org/model")) == []


def test_labels(tmp_path, monkeypatch):
    ck = tmp_path / "step_7"
    ck.mkdir()
    (ck / "weights.SafeTensors").write_bytes(b"")
    (ck / "config.json").write_text("{}")
    monkeypatch.chdir(ck)
    assert path_label(Path(".")) == "step_7"  # the absolute folder's name, not ''
    assert path_label(Path("weights.SafeTensors")) == "step_7"
    assert path_label(Path("config.json")) == "step_7"
    assert path_label(tmp_path / "m.Q4_K.GGUF") == "m.Q4_K"
    assert path_label(tmp_path / "w.bin") == "w.bin"
    d = tmp_path / "folder.gguf"
    d.mkdir()
    assert path_label(d) == "folder.gguf"  # a folder keeps its whole name


def test_the_nearest_zoo_names_of_a_mistyped_name():
    assert close_zoo_names("smollm2-13m") == ["smollm2-135m"]
    assert close_zoo_names("SmolLM2-135M") == ["smollm2-135m"]  # case-folded
    assert close_zoo_names("zoo:minilm") == ["minilm-l6"]  # the prefix is ignored
    assert close_zoo_names("HuggingFaceTB/SmolLM2-135") == ["smollm2-135m"]  # the name after the owner
    assert close_zoo_names("gemma3-270m") == ["gemma-3-270m"]
    assert close_zoo_names("gpt2") == [] and close_zoo_names("") == []
    assert known_and_close("smollm2-13m") == ZOO_NAMES + "; did you mean 'smollm2-135m'?"
    assert known_and_close("gpt2") == ZOO_NAMES
    assert str(missing_path_error("smollm2-13m")) == (
        f"model: 'smollm2-13m' is not an existing file or folder, nor a zoo model name ({ZOO_NAMES}; did you mean "
        "'smollm2-135m'?); nothing is downloaded for paths."
    )
    with pytest.raises(UnknownModelError, match=r"Known models: " + ZOO_NAMES + r"\. Did you mean 'smollm2-135m'\? "):
        resolve_name("zoo:smollm2-13m")


@pytest.mark.parametrize(
    ("name", "hub"),
    [
        ("HuggingFaceTB/SmolLM2-135M", True),
        ("openai-community/gpt2", True),
        ("EleutherAI/pythia-70m-deduped", True),
        ("a/b", True),
        ("smollm2-13m", False),  # a bare name: a zoo name, mistyped or not, never goes to the network
        ("gpt2", False),
        ("owner/name/extra", False),
        ("/abs/path", False),
        ("./rel", False),
        ("owner/", False),
        ("/name", False),
        ("a--b/c", False),
        ("a/b..c", False),
        ("-a/b", False),
        ("a/.b", False),
        ("own er/name", False),
        ("owner/model.gguf", False),
        ("owner/model.safetensors", False),
        ("owner/" + "x" * 96, True),
        ("owner/" + "x" * 97, False),
        ("", False),
    ],
)
def test_what_a_hub_id_is(name, hub):
    assert is_hub_id(name) is hub


def test_the_hub_switches_and_the_local_cache(tmp_path, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    assert hub_offline() is None
    for value, off in [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("", False)]:
        monkeypatch.setenv("TRANSFORMERS_OFFLINE", value)
        assert hub_offline() == ("TRANSFORMERS_OFFLINE" if off else None), value
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_offline() == "HF_HUB_OFFLINE"
    # the cache layout huggingface_hub writes: models--OWNER--NAME/{refs/main, snapshots/HASH/config.json}
    cache = tmp_path / "hub"
    repo = cache / "models--owner--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    assert not in_hub_cache("owner/tiny", cache)  # a snapshot without config.json is not a model
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert in_hub_cache("owner/tiny", cache)
    assert not in_hub_cache("owner/other", cache) and not in_hub_cache("other/tiny", cache)
    assert not in_hub_cache("tiny", cache)  # not a hub id
    assert not in_hub_cache("owner/tiny", tmp_path / "nowhere")
