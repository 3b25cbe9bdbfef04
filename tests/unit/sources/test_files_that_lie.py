"""Files that lie (classes 1 to 4 below), checkpoint-source options checked where they enter (class 5), and a
norm after W_O recorded for checkpoint and transformers sources (class 6).

One table-driven test per class; every hostile input must raise the exact error type with a message that names
the file (and the field / tensor / argument). The good paths give back exactly the tensors the test wrote.

Classes: 1 ambiguous directories, 2 layer counts that lie, 3 malformed metadata, 4 broken files (say what is
wrong), 5 options of the checkpoint sources, 6 the post-attention norm.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import (
    assert_matches,
    llama_like,
    random_heads,
    run_unprivileged,
    world_traversable_dir,
    write_checkpoint,
    write_gguf_file,
)
from tl_idempotence.core.options import check_bool
from tl_idempotence.errors import (
    CheckpointError,
    MissingFileError,
    OptionError,
    OptionTypeError,
    UnknownOptionError,
)
from tl_idempotence.sources.architectures import (
    architecture_table,
    check_architecture,
    check_entry,
    supported_architectures,
)
from tl_idempotence.sources.checkpoint import _check_prefix, from_gguf, from_hf_dir, from_path, from_transformers
from tl_idempotence.sources.dispatch import head_source

INDEX = "model.safetensors.index.json"
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 123456\n"


def refused(exc: type[Exception], fn: Callable[[], object], *names: object) -> str:
    """``fn()`` raises exactly ``exc`` whose message holds every one of ``names``; returns the message."""
    with pytest.raises(Exception) as ei:
        fn()
    assert type(ei.value) is exc, f"{type(ei.value).__name__}: {ei.value}"
    msg = str(ei.value)
    for n in names:
        assert str(n) in msg, f"{n!r} not in: {msg}"
    return msg


def assert_exact(src, O, V) -> None:
    assert src.info.n_layers == len(O)
    for l in range(len(O)):
        lh = src.layer_heads(l)
        assert torch.equal(lh.O, O[l]) and torch.equal(lh.V, V[l]), l


def single(d: Path, **kw) -> tuple[Path, list, list]:
    """An unindexed one-file checkpoint: config.json + model.safetensors."""
    d, O, V = llama_like(d, n_shards=1, **kw)
    (d / INDEX).unlink()
    next(d.glob("model-*.safetensors")).rename(d / "model.safetensors")
    return d, O, V


def all_tensors(d: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def other_model(d: Path) -> dict[str, torch.Tensor]:
    """The same tensor names with other values (a stray save of another model)."""
    return {k: v + 1 for k, v in all_tensors(d).items()}


def read_index(d: Path) -> dict:
    return json.loads((d / INDEX).read_text())


def write_index(d: Path, doc) -> None:
    (d / INDEX).write_text(json.dumps(doc))


def edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def shard_of(d: Path, name: str) -> Path:
    return d / read_index(d)["weight_map"][name]


def truncate(f: Path, n: int) -> None:
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - n)


def append(f: Path, data: bytes) -> None:
    with open(f, "ab") as fh:
        fh.write(data)


def patch(f: Path, offset: int, data: bytes) -> None:
    with open(f, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def header_len(f: Path) -> int:
    return int.from_bytes(f.read_bytes()[:8], "little")


def flip_in_header(f: Path, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in the header by ``new`` (same length: the file keeps its size)."""
    assert len(old) == len(new)
    raw = f.read_bytes()
    n = header_len(f)
    i = raw.index(old, 8, 8 + n)
    patch(f, i, new)


def set_header(f: Path, header: dict | list | bytes) -> None:
    """Rewrite the JSON header (and its length field); the tensor data stays as it was."""
    raw = f.read_bytes()
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    f.write_bytes(len(hb).to_bytes(8, "little") + hb + raw[8 + header_len(f) :])


def _duplicate_entry(f: Path) -> None:
    """The header names V1 twice (JSON allows it; json.loads would silently keep the last)."""
    h = header_of(f)
    text = json.dumps(h)
    dup = json.dumps({V1: h[V1]})[1:-1]
    set_header(f, (text[:-1] + ", " + dup + "}").encode())


def header_of(f: Path) -> dict:
    return json.loads(f.read_bytes()[8 : 8 + header_len(f)])


# =========================================================================== class 1: ambiguous directories

V1 = "model.layers.1.self_attn.v_proj.weight"
O2 = "model.layers.2.self_attn.o_proj.weight"


def _stray_copy(name):
    def f(d):
        save_file(other_model(d), str(d / name))
        return [name, "model.safetensors", "ambiguous"]

    return f


def _stray_tensors(name, keys, rename=lambda k: k):
    def f(d):
        t = other_model(d)
        save_file({rename(k): t[k].contiguous() for k in keys(t)}, str(d / name))
        return [name]

    return f


def _stray_one(d):
    save_file({O2: other_model(d)[O2]}, str(d / "zz.safetensors"))
    return ["zz.safetensors", "model.safetensors", O2]


def _stray_other_root(d):
    t = other_model(d)
    save_file(
        {k.removeprefix("model."): v for k, v in t.items() if k.startswith("model.layers.")}, str(d / "zz.safetensors")
    )
    return ["zz.safetensors", "model.safetensors", "root ''", "root 'model.'"]


def _stray_dir(d):
    (d / "zz_old.safetensors").mkdir()
    return ["zz_old.safetensors", "is a directory"]


def _stray_dangling(d):
    os.symlink("gone/model.safetensors", d / "zz_old.safetensors")
    return ["zz_old.safetensors", "dangling symbolic link", "gone/model.safetensors"]


def _stray_truncated(d):
    save_file(other_model(d), str(d / "zz_old.safetensors"))
    truncate(d / "zz_old.safetensors", 10)
    return ["zz_old.safetensors", "truncated"]


def _stray_lfs(d):
    (d / "zz_old.safetensors").write_bytes(LFS)
    return ["zz_old.safetensors", "Git LFS pointer"]


UNINDEXED_AMBIGUOUS = {
    "full copy of another model, sorts last": _stray_copy("zz_old.safetensors"),
    "full copy of another model, sorts first": _stray_copy("aa_old.safetensors"),
    "one attention tensor twice": _stray_one,
    "a non-attention tensor twice": _stray_tensors("zz.safetensors", lambda t: ["model.embed_tokens.weight"]),
    "the same layers under another root": _stray_other_root,
    "a directory named *.safetensors": _stray_dir,
    "a dangling symlink named *.safetensors": _stray_dangling,
    "a truncated stray file": _stray_truncated,
    "a Git LFS pointer": _stray_lfs,
}


def _copy_of_a_shard(d):
    shutil.copy(shard_of(d, V1), d / "backup.safetensors")
    return ["backup.safetensors", shard_of(d, V1).name, "ambiguous"]


def _old_single_file(d):
    save_file(other_model(d), str(d / "model.safetensors"))
    return ["model.safetensors", INDEX, "attention tensor"]


def _idx_stray(name, keys, rename=lambda k: k):
    def f(d):
        t = other_model(d)
        save_file({rename(k): t[k].contiguous() for k in keys(t)}, str(d / name))
        return [name, INDEX, "attention tensor"]

    return f


def _idx_fifo(d):
    os.mkfifo(d / "zz.safetensors")
    return ["zz.safetensors", "FIFO"]


def _idx_truncated(d):
    save_file({O2: other_model(d)[O2]}, str(d / "zz.safetensors"))
    truncate(d / "zz.safetensors", 1)
    return ["zz.safetensors", "truncated"]


def _shard_with(extra_of):
    """Add to the shard holding V1 a tensor the index maps elsewhere (or not at all)."""

    def f(d):
        shard = shard_of(d, V1)
        t = load_file(str(shard))
        name, value = extra_of(d)
        t[name] = value
        save_file(t, str(shard))
        return [shard.name, INDEX, name]

    return f


INDEXED_AMBIGUOUS = {
    "a shard also holds a tensor the index maps to another shard": _shard_with(lambda d: (O2, other_model(d)[O2])),
    "a shard holds an attention tensor the index does not list": _shard_with(
        lambda d: ("old." + V1, other_model(d)[V1])
    ),
    "old single-file save next to the shards": _old_single_file,
    "stray copy of another model": _idx_stray("zz_old.safetensors", lambda t: list(t)),
    "stray with only one O tensor": _idx_stray("zz.safetensors", lambda t: [O2]),
    "stray under another root": _idx_stray(
        "zz.safetensors", lambda t: [V1, O2], rename=lambda k: k.removeprefix("model.")
    ),
    "stray holding a V tensor only under a deeper root": _idx_stray(
        "zz.safetensors", lambda t: [V1], rename=lambda k: "backup." + k
    ),
    "a FIFO next to the index": _idx_fifo,
    "a truncated unindexed file": _idx_truncated,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", [*UNINDEXED_AMBIGUOUS, "shards without index + copy of a shard"])
def test_ambiguous_unindexed_directories_are_refused(tmp_path, case):
    if case == "shards without index + copy of a shard":
        d, _, _ = llama_like(tmp_path / "ck", n_shards=3)
        names = _copy_of_a_shard(d)
        (d / INDEX).unlink()
    else:
        d, _, _ = single(tmp_path / "ck")
        names = UNINDEXED_AMBIGUOUS[case](d)
    refused(CheckpointError, lambda: from_path(d), *names)
    path = d / "model.safetensors" if (d / "model.safetensors").exists() else d  # a file path means its folder
    refused(CheckpointError, lambda: head_source(str(path)), *names[:1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(INDEXED_AMBIGUOUS))
def test_ambiguous_indexed_directories_are_refused(tmp_path, case):
    d, _, _ = llama_like(tmp_path / "ck", n_shards=3)
    names = INDEXED_AMBIGUOUS[case](d)
    refused(CheckpointError, lambda: from_hf_dir(d), *names)


def _safe_lora(d):
    t = all_tensors(d)
    save_file(
        {"base_model.model." + V1.replace("weight", "lora_A.weight"): torch.ones(4, t[V1].shape[1])},
        str(d / "adapter_model.safetensors"),
    )


def _safe_consolidated(d):
    # Mistral repos ship consolidated.safetensors (mistral-format names) next to the HF shards and index
    save_file({"layers.0.attention.wv.weight": torch.ones(16, 48)}, str(d / "consolidated.safetensors"))


def _safe_symlinks(d):
    blobs = d.parent / "blobs"
    blobs.mkdir()
    for f in [d / "config.json", *d.glob("*.safetensors"), d / INDEX]:
        if f.exists():
            target = blobs / f"sha-{f.name}"
            f.rename(target)
            os.symlink(os.path.relpath(target, d), f)


SAFE = {
    "unindexed disjoint shards": (3, True, None),
    "unindexed single file + LoRA adapter": (1, True, _safe_lora),
    "index + consolidated.safetensors with other names": (3, False, _safe_consolidated),
    "hf-cache symlinks to blobs (indexed)": (3, False, _safe_symlinks),
    "hf-cache symlinks to blobs (unindexed)": (1, True, _safe_symlinks),
}


@pytest.mark.parametrize("case", list(SAFE))
def test_unambiguous_directories_read_exactly(tmp_path, case):
    n_shards, drop_index, extra = SAFE[case]
    d, O, V = llama_like(tmp_path / "ck", n_shards=n_shards)
    if drop_index:
        (d / INDEX).unlink()
    if extra:
        extra(d)
    assert_exact(from_path(d), O, V)


def test_two_roots_in_one_file_pick_the_language_model(tmp_path):
    """A multimodal single file (vision tower with the same attention names) is one model, not an ambiguity."""
    _, O, V = llama_like(tmp_path / "src", n_shards=1)
    t = all_tensors(tmp_path / "src")
    t = {("language_model." + k if k.startswith("model.") else k): v for k, v in t.items()}
    g = torch.Generator().manual_seed(3)
    for l in range(3):
        for w in ("v", "o"):
            t[f"vision_tower.encoder.layers.{l}.self_attn.{w}_proj.weight"] = torch.randn(20, 20, generator=g)
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    d = write_checkpoint(tmp_path / "mm", cfg, t, n_shards=1)
    (d / INDEX).unlink()
    src = from_path(d)
    assert src.info.extra["tensor_root"] == "language_model.model."
    assert_exact(src, O, V)


# =========================================================================== class 2: layer counts that lie


def _extra_layer_shard(d, names):
    t = {n: torch.ones(4, 4) for n in names}
    save_file(t, str(d / "model-extra.safetensors"))
    doc = read_index(d)
    doc["weight_map"].update({n: "model-extra.safetensors" for n in names})
    write_index(d, doc)


LAYER_LIES = {
    # case: (mutate(d), exact error, strings the message must hold)
    "config says 1 of 3": (lambda d: edit_config(d, num_hidden_layers=1), ["declares 1 layers", "3 layers"]),
    "config says 2 of 3": (lambda d: edit_config(d, num_hidden_layers=2), ["declares 2 layers", "layers 0..2"]),
    "config says 4 of 3": (lambda d: edit_config(d, num_hidden_layers=4), ["declares 4 layers", "Missing tensor"]),
    "config says 40 of 3": (lambda d: edit_config(d, num_hidden_layers=40), ["declares 40 layers", "3 layers"]),
    "a 4th layer of MLP tensors only": (
        lambda d: _extra_layer_shard(d, ["model.layers.3.mlp.down_proj.weight"]),
        ["declares 3 layers", "model.layers.3.mlp.down_proj.weight", "model-extra.safetensors"],
    ),
    "a far layer (layer 17)": (
        lambda d: _extra_layer_shard(d, ["model.layers.17.input_layernorm.weight"]),
        ["declares 3 layers", "layers [0, 1, 2, 17]"],
    ),
    "two MTP layers, one declared": (
        lambda d: (
            edit_config(d, num_nextn_predict_layers=1),
            _extra_layer_shard(d, ["model.layers.3.eh_proj.weight", "model.layers.4.eh_proj.weight"]),
        ),
        ["+1 multi-token-prediction", "model.layers.4.eh_proj.weight"],
    ),
    "a gap: layer 1 missing": (
        lambda d: write_index(
            d,
            {"weight_map": {k: v for k, v in read_index(d)["weight_map"].items() if ".layers.1." not in k}},
        ),
        ["Missing tensor 'model.layers.1.self_attn.v_proj.weight'", "layers [0, 2]"],
    ),
}


@pytest.mark.parametrize("case", list(LAYER_LIES))
def test_layer_count_lies_in_config_are_refused(tmp_path, case):
    d, _, _ = llama_like(tmp_path / "ck", n_layers=3)
    mutate, names = LAYER_LIES[case]
    mutate(d)
    refused(CheckpointError, lambda: from_path(d), str(d / "config.json"), *names)


def test_layer_count_lie_in_unindexed_file_names_it(tmp_path):
    d, _, _ = single(tmp_path / "ck", n_layers=3)
    edit_config(d, num_hidden_layers=2)
    refused(CheckpointError, lambda: from_path(d), str(d / "model.safetensors"), "declares 2 layers", "3 layers")


def test_layer_count_lie_in_text_config(tmp_path):
    d, _, _ = llama_like(tmp_path / "ck", n_layers=3)
    cfg = json.loads((d / "config.json").read_text())
    text = {k: cfg.pop(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}
    cfg["text_config"] = {**text, "num_hidden_layers": 2}
    cfg.pop("num_hidden_layers")
    (d / "config.json").write_text(json.dumps(cfg))
    refused(CheckpointError, lambda: from_path(d), "config.json", "declares 2 layers", "3 layers")


def test_declared_mtp_layers_are_allowed_and_not_measured(tmp_path):
    d, O, V = llama_like(tmp_path / "ck", n_layers=3)
    edit_config(d, num_nextn_predict_layers=1)
    _extra_layer_shard(d, ["model.layers.3.eh_proj.weight"])
    assert_exact(from_path(d), O, V)


GGUF_LAYER_LIES = {
    "block_count 1 of 2": (dict(meta={"llama.block_count": 1}), ["block_count = 1", "2 layers", "blk.1."]),
    "block_count 3 of 2": (dict(meta={"llama.block_count": 3}), ["block_count = 3", "Missing tensor 'blk.2.attn_v"]),
    "a blk.2 norm only": (
        dict(tensors={"blk.2.ffn_norm.weight": np.ones(32, np.float32)}),
        ["block_count = 2", "blk.2.ffn_norm.weight"],
    ),
}


@pytest.mark.parametrize("case", list(GGUF_LAYER_LIES))
def test_layer_count_lies_in_gguf_are_refused(tmp_path, case):
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    kw, names = GGUF_LAYER_LIES[case]
    p = write_gguf_file(tmp_path / "m.gguf", O, V, **kw)
    refused(CheckpointError, lambda: from_path(p), str(p), *names)


# =========================================================================== class 3: malformed metadata

CONFIG_LIES = {
    # case: (config.json bytes or {field: value} changes, strings the message must hold besides the file)
    "a JSON list": (b"[1, 2, 3]", ["JSON list"]),
    "a JSON string": (b'"llama"', ["JSON str"]),
    "a JSON number": (b"3", ["JSON int"]),
    "JSON null": (b"null", ["JSON NoneType"]),
    "not UTF-8": (b'{"model_type": "llama\xff\xfe"}', ["not UTF-8"]),
    "UTF-16": ('{"model_type": "llama"}'.encode("utf-16"), ["not UTF-8"]),
    "cut JSON": (b'{"model_type": "llama", "hidden', ["not valid JSON"]),
    "empty": (b"", ["empty"]),
    "nesting 100000 deep": (b"[" * 100000 + b"]" * 100000, ["nests too deeply"]),
    "a 5000-digit integer": (b'{"num_attention_heads": ' + b"7" * 5000 + b"}", ["holds a value that cannot be read"]),
    "heads 'four'": ({"num_attention_heads": "four"}, ["'num_attention_heads'", "'four'", "not an integer"]),
    "heads 6.0": ({"num_attention_heads": 6.0}, ["'num_attention_heads'", "6.0", "float"]),
    "heads true": ({"num_attention_heads": True}, ["'num_attention_heads'", "True"]),
    "heads 0": ({"num_attention_heads": 0}, ["'num_attention_heads'", "positive"]),
    "heads -6": ({"num_attention_heads": -6}, ["'num_attention_heads'", "-6"]),
    "heads [6]": ({"num_attention_heads": [6]}, ["'num_attention_heads'", "list"]),
    "heads null": ({"num_attention_heads": None}, ["no n_heads", "num_attention_heads"]),
    "heads missing": ({"num_attention_heads": ...}, ["no n_heads"]),
    "hidden '48'": ({"hidden_size": "48"}, ["'hidden_size'", "'48'"]),
    "hidden 48.5": ({"hidden_size": 48.5}, ["'hidden_size'", "48.5"]),
    "hidden 0": ({"hidden_size": 0}, ["'hidden_size'", "positive"]),
    "hidden -48": ({"hidden_size": -48}, ["'hidden_size'", "-48"]),
    "layers '3'": ({"num_hidden_layers": "3"}, ["'num_hidden_layers'", "'3'"]),
    "layers 3.0": ({"num_hidden_layers": 3.0}, ["'num_hidden_layers'", "3.0"]),
    "layers 0": ({"num_hidden_layers": 0}, ["'num_hidden_layers'", "positive"]),
    "layers -1": ({"num_hidden_layers": -1}, ["'num_hidden_layers'", "-1"]),
    "layers false": ({"num_hidden_layers": False}, ["'num_hidden_layers'", "False"]),
    "kv heads 0 (was silently n_heads)": ({"num_key_value_heads": 0}, ["'num_key_value_heads'", "positive"]),
    "kv heads 2.0": ({"num_key_value_heads": 2.0}, ["'num_key_value_heads'", "2.0"]),
    "kv heads '2'": ({"num_key_value_heads": "2"}, ["'num_key_value_heads'", "'2'"]),
    "kv heads 4 (not a divisor of 6)": ({"num_key_value_heads": 4}, ["inconsistent", "n_kv_heads=4"]),
    "head_dim 0 (was silently d_model // n_heads)": ({"head_dim": 0}, ["'head_dim'", "positive"]),
    "head_dim '8'": ({"head_dim": "8"}, ["'head_dim'", "'8'"]),
    "kv heads 3 (the V shape says 2)": (
        {"num_key_value_heads": 3},
        ["layers.0.self_attn.v_proj.weight", "need [24, 48]"],
    ),
    "head_dim 16 (the shapes say 8)": ({"head_dim": 16}, ["layers.0.self_attn.v_proj.weight", "d_head=16"]),
    "hidden 96 (the shapes say 48)": ({"hidden_size": 96, "head_dim": ...}, ["v_proj.weight", "d_model=96"]),
    "no head_dim, hidden not a multiple of heads": (
        {"head_dim": ..., "hidden_size": 47},
        ["no head_dim", "d_model=47", "n_heads=6"],
    ),
    "text_config a list": ({"text_config": [1]}, ["'text_config'", "list"]),
    "mtp layers 'one'": ({"num_nextn_predict_layers": "one"}, ["'num_nextn_predict_layers'", "'one'"]),
    "unknown model_type": ({"model_type": "frobnicator", "architectures": ["Frob"]}, ["frobnicator", "llama"]),
}


@pytest.mark.parametrize("case", list(CONFIG_LIES))
def test_malformed_config_is_refused_naming_file_and_field(tmp_path, case):
    d, _, _ = llama_like(tmp_path / "ck", nq=6, nkv=2, dm=48, dh=8)
    change, names = CONFIG_LIES[case]
    if isinstance(change, bytes):
        (d / "config.json").write_bytes(change)
    else:
        edit_config(d, **change)
    refused(CheckpointError, lambda: from_path(d), str(d / "config.json"), *names)


def _wm(d):
    return read_index(d)["weight_map"]


INDEX_LIES = {
    # case: (new index document (or raw bytes), strings the message must hold besides the index file)
    "a JSON list": (lambda d: [_wm(d)], ["JSON list"]),
    "a JSON string": (lambda d: "weights", ["JSON str"]),
    "no weight_map": (lambda d: {"metadata": {}}, ["no 'weight_map'"]),
    "weight_map a list": (lambda d: {"weight_map": list(_wm(d).items())}, ["'weight_map' is a JSON list"]),
    "weight_map a string": (lambda d: {"weight_map": "model.safetensors"}, ["'weight_map' is a JSON str"]),
    "weight_map null": (lambda d: {"weight_map": None}, ["'weight_map' is a JSON NoneType"]),
    "weight_map empty": (lambda d: {"weight_map": {}}, ["empty"]),
    "a value 7": (lambda d: {"weight_map": {**_wm(d), V1: 7}}, [V1, "int", "not a file name"]),
    "a value null": (lambda d: {"weight_map": {**_wm(d), V1: None}}, [V1, "NoneType"]),
    "a value a list": (lambda d: {"weight_map": {**_wm(d), V1: [_wm(d)[V1]]}}, [V1, "list"]),
    "a value ../x": (lambda d: {"weight_map": {**_wm(d), V1: "../x.safetensors"}}, [V1, "'../x.safetensors'"]),
    "a value ..": (lambda d: {"weight_map": {**_wm(d), V1: ".."}}, [V1, "'..'"]),
    "an absolute value": (lambda d: {"weight_map": {**_wm(d), V1: "/etc/x.safetensors"}}, [V1, "/etc/x"]),
    "a value in a subfolder": (lambda d: {"weight_map": {**_wm(d), V1: "sub/x.safetensors"}}, [V1, "sub/x"]),
    "an empty value": (lambda d: {"weight_map": {**_wm(d), V1: ""}}, [V1, "''"]),
    "a .bin value": (lambda d: {"weight_map": {**_wm(d), V1: "pytorch_model.bin"}}, [V1, "not a .safetensors"]),
    "not UTF-8": (lambda d: b'{"weight_map": {"\xff": "a.safetensors"}}', ["not UTF-8"]),
    "cut JSON": (lambda d: json.dumps({"weight_map": _wm(d)}).encode()[:-20], ["not valid JSON"]),
    "empty file": (lambda d: b"", ["empty"]),
}


@pytest.mark.parametrize("case", list(INDEX_LIES))
def test_malformed_index_is_refused_naming_file_and_field(tmp_path, case):
    d, _, _ = llama_like(tmp_path / "ck")
    make, names = INDEX_LIES[case]
    doc = make(d)
    (d / INDEX).write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    refused(CheckpointError, lambda: from_path(d), str(d / INDEX), *names)


GGUF_META_LIES = {
    # case: (write_gguf_file keywords, strings the message must hold besides the file)
    "head_count 0": (dict(meta={"llama.attention.head_count": 0}), ["llama.attention.head_count = 0", "positive"]),
    "head_count -4": (dict(meta={"llama.attention.head_count": -4}), ["llama.attention.head_count = -4"]),
    "head_count missing": (dict(drop=["llama.attention.head_count"]), ["lacks llama.attention.head_count"]),
    "head_count 'four'": (dict(meta={"llama.attention.head_count": "four"}), ["head_count = 'four'", "str"]),
    "head_count 4.0": (dict(meta={"llama.attention.head_count": 4.0}), ["head_count = 4.0", "float"]),
    "head_count true": (dict(meta={"llama.attention.head_count": True}), ["head_count = True", "bool"]),
    "head_count varies by layer": (dict(meta={"llama.attention.head_count": [4, 2]}), ["varies by layer"]),
    "head_count_kv 0": (dict(meta={"llama.attention.head_count_kv": 0}), ["head_count_kv = 0"]),
    "head_count_kv 3 (not a divisor of 4)": (dict(meta={"llama.attention.head_count_kv": 3}), ["inconsistent"]),
    "embedding_length 0": (dict(meta={"llama.embedding_length": 0}), ["llama.embedding_length = 0"]),
    "embedding_length missing": (dict(drop=["llama.embedding_length"]), ["lacks llama.embedding_length"]),
    "block_count 0": (dict(meta={"llama.block_count": 0}), ["llama.block_count = 0"]),
    "block_count missing": (dict(drop=["llama.block_count"]), ["lacks llama.block_count"]),
    "block_count '2'": (dict(meta={"llama.block_count": "2"}), ["llama.block_count = '2'"]),
    "key_length 0": (dict(meta={"llama.attention.key_length": 0}), ["key_length = 0"]),
    "value_length 0": (dict(meta={"llama.attention.value_length": 0}), ["value_length = 0"]),
    "value_length 16 (V is 8 wide)": (dict(meta={"llama.attention.value_length": 16}), ["attn_v.weight", "[16, 32]"]),
    "no key_length, width not a multiple of heads": (
        dict(drop=["llama.attention.key_length"], meta={"llama.embedding_length": 30}),
        ["no llama.attention.value_length or key_length", "30"],
    ),
    "architecture key missing": (dict(drop=["general.architecture"]), ["no general.architecture"]),
    "architecture key an integer": (dict(meta={"general.architecture": 5}), ["general.architecture = 5"]),
    "architecture names other keys": (
        dict(meta={"general.architecture": "qwen9"}),
        ["lacks qwen9.attention.head_count"],
    ),
}


@pytest.mark.parametrize("case", list(GGUF_META_LIES))
def test_malformed_gguf_metadata_is_refused_naming_file_and_key(tmp_path, case):
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    kw, names = GGUF_META_LIES[case]
    p = write_gguf_file(tmp_path / "m.gguf", O, V, **kw)
    refused(CheckpointError, lambda: from_path(p), str(p), *names)


# =========================================================================== class 4: say what is wrong with a file


def _symlink_loop(f: Path) -> None:
    f.unlink()
    os.symlink(f.name, f)


def _dangling(f: Path) -> None:
    f.unlink()
    os.symlink("blobs/gone", f)


def _directory(f: Path) -> None:
    f.unlink()
    f.mkdir()


def _fifo(f: Path) -> None:
    f.unlink()
    os.mkfifo(f)


def _socket(f: Path) -> None:
    import socket

    f.unlink()
    here = os.getcwd()
    os.chdir(f.parent)  # AF_UNIX paths are limited to ~107 bytes: bind the short relative name
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(f.name)
        s.close()
    finally:
        os.chdir(here)


def _length_field(value: Callable[[Path], int]) -> Callable[[Path], None]:
    return lambda f: patch(f, 0, value(f).to_bytes(8, "little"))


def _shape_digit(f: Path) -> None:
    """One digit of V1's shape changed in place: [16, 48] -> [17, 48] (the file keeps its size)."""
    flip_in_header(f, f'"{V1}":{{"dtype":"F32","shape":[16,'.encode(), f'"{V1}":{{"dtype":"F32","shape":[17,'.encode())


def _cut_json(f: Path) -> None:
    """The length field shortened into the JSON itself (past the header's padding spaces)."""
    text = f.read_bytes()[8 : 8 + header_len(f)]
    patch(f, 0, (len(text.rstrip()) - 1).to_bytes(8, "little"))


def _offsets(f: Path, fn) -> None:
    h = header_of(f)
    h = {k: v for k, v in h.items() if k != "__metadata__"}
    last = max(h, key=lambda k: h[k]["data_offsets"][1])
    h[last]["data_offsets"] = fn(h[last]["data_offsets"])
    set_header(f, {**header_of(f), last: h[last]})


def _entry(f: Path, fn) -> None:
    h = header_of(f)
    name = next(k for k in h if k.endswith("v_proj.weight"))
    h[name] = fn(h[name])
    set_header(f, h)


def _dtype_f33(f: Path) -> None:
    _entry(f, lambda e: {**e, "dtype": "F33"})


def _permission_access(f: Path, monkeypatch) -> None:
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if Path(p) == f else real(p, m, *a, **k))


def _permission_open(f: Path, monkeypatch) -> None:
    real = builtins.open

    def fake(p, *a, **k):
        if isinstance(p, (str, os.PathLike)) and Path(p) == f:
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *a, **k)

    monkeypatch.setattr(builtins, "open", fake)


BROKEN_SAFETENSORS = {
    # case: (break(file) or break(file, monkeypatch), strings the message must hold besides the file's name)
    "truncated by 1 byte": (lambda f: truncate(f, 1), ["is truncated", "1 missing"]),
    "truncated by 100 bytes": (lambda f: truncate(f, 100), ["is truncated", "100 missing"]),
    "cut after the header": (lambda f: truncate(f, os.path.getsize(f) - 8 - header_len(f)), ["is truncated"]),
    "cut inside the header": (lambda f: truncate(f, os.path.getsize(f) - 50), ["truncated within its header"]),
    "cut to 5 bytes": (lambda f: truncate(f, os.path.getsize(f) - 5), ["5 bytes", "too short"]),
    "empty": (lambda f: f.write_bytes(b""), ["is empty"]),
    "1 trailing byte": (lambda f: append(f, b"x"), ["1 trailing bytes"]),
    "8 trailing zero bytes": (lambda f: append(f, bytes(8)), ["8 trailing bytes"]),
    "itself appended": (lambda f: append(f, f.read_bytes()), ["trailing bytes"]),
    "length field 2**40": (_length_field(lambda f: 2**40), ["header length of 1099511627776"]),
    "length field = file size": (_length_field(lambda f: os.path.getsize(f)), ["truncated within its header"]),
    "length field into the JSON": (_cut_json, ["not valid JSON"]),
    "length field + 3": (_length_field(lambda f: header_len(f) + 3), ["corrupt header"]),
    "a brace flipped": (lambda f: patch(f, 8, b"X"), ["not valid JSON"]),
    "a byte 0xff in the header": (lambda f: patch(f, 10, b"\xff"), ["not UTF-8"]),
    "a shape digit flipped": (_shape_digit, ["corrupt header", V1, "shape [17, 48]", "data_offsets"]),
    "last data_offsets end + 4": (lambda f: _offsets(f, lambda o: [o[0], o[1] + 4]), ["corrupt header"]),
    "last data_offsets moved by 4": (lambda f: _offsets(f, lambda o: [o[0] + 4, o[1] + 4]), ["leaves a gap"]),
    "data_offsets reversed": (
        lambda f: _entry(f, lambda e: {**e, "data_offsets": e["data_offsets"][::-1]}),
        ["data_offsets"],
    ),
    "no data_offsets": (
        lambda f: _entry(f, lambda e: {"dtype": e["dtype"], "shape": e["shape"]}),
        ["no 'data_offsets'"],
    ),
    "negative shape": (lambda f: _entry(f, lambda e: {**e, "shape": [-1, 48]}), ["'shape' = [-1, 48]"]),
    "shape a string": (lambda f: _entry(f, lambda e: {**e, "shape": "16x48"}), ["'shape' = '16x48'"]),
    "entry a list": (lambda f: _entry(f, lambda e: [e["dtype"]]), ["is a JSON list"]),
    "unknown dtype F33": (_dtype_f33, ["safetensors library refuses"]),
    "header a JSON list": (lambda f: set_header(f, [1, 2]), ["a JSON list, not an object"]),
    "a tensor named twice": (_duplicate_entry, [V1, "appears twice"]),
    "nesting 100000 deep": (lambda f: set_header(f, b"[" * 100000 + b"]" * 100000), ["corrupt header"]),
    "a 5000-digit integer": (
        lambda f: set_header(f, b'{"x": {"dtype": "F32", "shape": [' + b"7" * 5000 + b'], "data_offsets": [0, 4]}}'),
        ["corrupt header"],
    ),
    "a Git LFS pointer": (lambda f: f.write_bytes(LFS), ["Git LFS pointer"]),
    "an HTML page": (lambda f: f.write_bytes(b"<!DOCTYPE html><html><body>404 Not Found</body></html>"), ["HTML page"]),
    "a GGUF file": (lambda f: f.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64)), ["GGUF file"]),
    "a zip (.bin) file": (lambda f: f.write_bytes(b"PK\x03\x04" + bytes(64)), ["zip archive"]),
    "a directory": (_directory, ["is a directory"]),
    "a FIFO": (_fifo, ["FIFO", "not opened"]),
    "a socket": (_socket, ["socket"]),
    "a symlink loop": (_symlink_loop, ["symbolic-link loop"]),
    "a dangling symlink": (_dangling, ["dangling symbolic link", "blobs/gone"]),
    "permission denied (access)": (_permission_access, ["permission denied"]),
    "permission denied (open)": (_permission_open, ["permission denied"]),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("indexed", [False, True], ids=["single-file", "sharded"])
@pytest.mark.parametrize("case", list(BROKEN_SAFETENSORS))
def test_broken_safetensors_file_says_what_is_wrong(tmp_path, monkeypatch, case, indexed):
    if indexed:
        d, _, _ = llama_like(tmp_path / "ck")
        f = shard_of(d, V1)
    else:
        d, _, _ = single(tmp_path / "ck")
        f = d / "model.safetensors"
    breaker, names = BROKEN_SAFETENSORS[case]
    if breaker.__code__.co_argcount == 2:
        breaker(f, monkeypatch)
    else:
        breaker(f)
    refused(CheckpointError, lambda: from_path(d), str(f), *names)


def test_unreadable_file_for_real():
    """A file of mode 0, read by a user (as root, tests drop to uid 65534: root reads anything)."""
    top = world_traversable_dir()
    try:
        d, _, _ = single(top / "ck")
        f = d / "model.safetensors"
        from_path(d)  # readable: it opens (and the child, which cannot read root's Python, has every import)
        f.chmod(0)
        run_unprivileged(lambda: refused(CheckpointError, lambda: from_path(d), str(f), "permission denied"))
    finally:
        shutil.rmtree(top)


def test_folder_that_cannot_be_listed_is_diagnosed_as_such(tmp_path, monkeypatch):
    """Not "has no config.json": the folder is there, this process may not list it (root lists anything,
    so the refusal of the OS is replayed for that one folder)."""
    d, _, _ = single(tmp_path / "ck")
    real = os.scandir

    def scandir(path="."):
        if Path(path) == d:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    msg = refused(CheckpointError, lambda: from_path(d), str(d), "cannot be listed", "Permission denied")
    assert "config.json" not in msg


def test_folder_that_cannot_be_listed_for_real():
    """A folder of mode 0, opened by a user (as root, tests drop to uid 65534: root lists any folder)."""
    top = world_traversable_dir()
    try:
        d, _, _ = single(top / "ck")
        from_path(d)  # listable: it opens (and the child, which cannot read root's Python, has every import)
        d.chmod(0)
        run_unprivileged(lambda: refused(CheckpointError, lambda: from_path(d), str(d), "cannot be listed"))
    finally:
        d.chmod(0o755)
        shutil.rmtree(top)


def test_truncated_and_trailing_messages_differ(tmp_path):
    msgs = []
    for name, breaker in (("cut", lambda f: truncate(f, 4)), ("long", lambda f: append(f, bytes(4)))):
        d, _, _ = single(tmp_path / name)
        breaker(d / "model.safetensors")
        msg = refused(CheckpointError, lambda d=d: from_path(d), "model.safetensors")
        msgs.append(msg.replace(str(tmp_path), ""))
    assert "truncated" in msgs[0] and "trailing" not in msgs[0]
    assert "trailing" in msgs[1] and "truncated" not in msgs[1]


BROKEN_CONFIG = {
    "a directory": (_directory, CheckpointError, ["is a directory"]),
    "a FIFO": (_fifo, CheckpointError, ["FIFO"]),
    "a symlink loop": (_symlink_loop, CheckpointError, ["symbolic-link loop"]),
    "a dangling symlink": (_dangling, CheckpointError, ["dangling symbolic link"]),
    "permission denied": (_permission_access, CheckpointError, ["permission denied"]),
    "missing": (lambda f: f.unlink(), MissingFileError, ["has no config.json"]),
}


# (a missing index is no error: the shards are then read as unindexed files, class 1)
CONFIG_TARGETS = [(c, t) for t in ("config.json", INDEX) for c in BROKEN_CONFIG if (c, t) != ("missing", INDEX)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("case", "target"), CONFIG_TARGETS)
def test_broken_config_or_index_file_says_what_is_wrong(tmp_path, monkeypatch, case, target):
    d, _, _ = llama_like(tmp_path / "ck")
    f = d / target
    breaker, exc, names = BROKEN_CONFIG[case]
    if breaker.__code__.co_argcount == 2:
        breaker(f, monkeypatch)
    else:
        breaker(f)
    refused(exc, lambda: from_path(d), str(f) if exc is CheckpointError else str(d), *names)


def _gguf_version(f: Path) -> None:
    patch(f, 4, (99).to_bytes(4, "little"))


BROKEN_GGUF = {
    "truncated by 3 bytes": (lambda f: truncate(f, 3), ["is truncated", "tensor data ends early"]),
    "truncated by half": (lambda f: truncate(f, os.path.getsize(f) // 2), ["is truncated"]),
    "cut inside the metadata": (lambda f: truncate(f, os.path.getsize(f) - 100), ["cut-off metadata"]),
    "cut to 3 bytes": (lambda f: truncate(f, os.path.getsize(f) - 3), ["not a GGUF file"]),
    "1 trailing byte": (lambda f: append(f, b"x"), ["1 trailing bytes"]),
    "64 trailing bytes": (lambda f: append(f, bytes(64)), ["64 trailing bytes"]),
    "itself appended": (lambda f: append(f, f.read_bytes()), ["trailing bytes"]),
    "magic flipped": (lambda f: patch(f, 0, b"GGUG"), ["not a GGUF file", "GGUG"]),
    "a safetensors file": (lambda f: f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b" " * 14), ["not a GGUF"]),
    "a Git LFS pointer": (lambda f: f.write_bytes(LFS), ["Git LFS pointer"]),
    "version 99": (_gguf_version, ["GGUF version"]),
    "empty": (lambda f: f.write_bytes(b""), ["is empty"]),
    "a directory": (_directory, ["is a directory"]),
    "a FIFO": (_fifo, ["FIFO"]),
    "a symlink loop": (_symlink_loop, ["symbolic-link loop"]),
    "a dangling symlink": (_dangling, ["dangling symbolic link"]),
    "permission denied (access)": (_permission_access, ["permission denied"]),
    "permission denied (open)": (_permission_open, ["permission denied"]),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(BROKEN_GGUF))
def test_broken_gguf_file_says_what_is_wrong(tmp_path, monkeypatch, case):
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    f = write_gguf_file(tmp_path / "m.gguf", O, V, tensors={"token_embd.weight": np.ones((40, 32), np.float32)})
    breaker, names = BROKEN_GGUF[case]
    if breaker.__code__.co_argcount == 2:
        breaker(f, monkeypatch)
    else:
        breaker(f)
    refused(CheckpointError, lambda: from_gguf(f), str(f), *names)
    if case not in ("a directory",):  # a directory path is taken for a model directory by from_path
        refused(CheckpointError, lambda: from_path(f), str(f))


def test_gguf_with_two_tensors_of_one_name(tmp_path):
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    f = write_gguf_file(tmp_path / "m.gguf", O, V, tensors={"blk.0.attn_v.weighX": np.ones((16, 32), np.float32)})
    raw = f.read_bytes()
    f.write_bytes(raw.replace(b"blk.0.attn_v.weighX", b"blk.0.attn_v.weight"))
    refused(CheckpointError, lambda: from_path(f), str(f), "blk.0.attn_v.weight", "two tensors of one name")


def _tensor_info_pos(f: Path, name: str) -> tuple[int, int]:
    """File offsets of a tensor's type (u32) and data offset (u64) fields in a GGUF tensor table."""
    import gguf

    r = gguf.GGUFReader(str(f))
    t = next(t for t in r.tensors if t.name == name)
    type_pos = int(t.field.offset) + 8 + len(name.encode()) + 4 + 8 * len(t.shape)
    return type_pos, type_pos + 4


def _gguf_type(name: str, ggml_type: int):
    def edit(f: Path) -> None:
        patch(f, _tensor_info_pos(f, name)[0], ggml_type.to_bytes(4, "little"))

    return edit


def _gguf_offset(name: str, new: Callable[[int], int]):
    def edit(f: Path) -> None:
        pos = _tensor_info_pos(f, name)[1]
        old = int.from_bytes(f.read_bytes()[pos : pos + 8], "little")
        patch(f, pos, new(old).to_bytes(8, "little"))

    return edit


#: A tensor table edited after writing: each tensor's bytes no longer fit the space its neighbours leave.
EDITED_GGUF_TABLE = {
    "type F32 -> F16 (half the bytes: a gap)": (_gguf_type("blk.0.attn_v.weight", 1), ["leaves a gap", "F16"]),
    "type F32 -> F64 (twice the bytes: an overlap)": (_gguf_type("blk.0.attn_v.weight", 28), ["overlaps", "F64"]),
    "offset not aligned": (_gguf_offset("blk.0.attn_output.weight", lambda o: o + 4), ["not a multiple", "alignment"]),
    "offset onto the previous tensor": (_gguf_offset("blk.0.attn_output.weight", lambda o: 0), ["overlaps"]),
    "first offset past the data start": (_gguf_offset("blk.0.attn_v.weight", lambda o: o + 32), ["first tensor"]),
    # a type field that is no ggml type, or one whose blocks or bytes do not fit: named as such, not "truncated"
    "type 200 (no ggml type)": (
        _gguf_type("blk.0.attn_v.weight", 200),
        ["'blk.0.attn_v.weight' has ggml type 200, which is not a valid ggml type", "types 0..", "pip install -U gguf"],
    ),
    "type 4 (Q4_2, removed from ggml)": (_gguf_type("blk.1.attn_output.weight", 4), ["ggml type 4, which is not"]),
    "type F32 -> Q4_K (rows of 32, blocks of 256)": (
        _gguf_type("blk.0.attn_output.weight", 12),
        ["'blk.0.attn_output.weight' has ggml type Q4_K, whose blocks hold 256 values, but its rows hold 32"],
    ),
    "last tensor F32 -> F16 (the file holds more)": (
        _gguf_type("blk.1.ffn_norm.weight", 1),
        ["'blk.1.ffn_norm.weight' (the last one) has ggml type F16: 64 bytes", "holds 128 bytes", "in F32 or I32"],
    ),
    "last tensor F32 -> F64 (the file holds less)": (
        _gguf_type("blk.1.ffn_norm.weight", 28),
        ["'blk.1.ffn_norm.weight' (the last one) has ggml type F64: 256 bytes", "type field does not match its size"],
    ),
}


@pytest.mark.parametrize("case", list(EDITED_GGUF_TABLE))
def test_gguf_tensor_table_that_lies_is_refused(tmp_path, case):
    """Like a safetensors header whose shape does not fill its data_offsets: refused, naming file and tensor."""
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    f = write_gguf_file(tmp_path / "m.gguf", O, V)
    edit, names = EDITED_GGUF_TABLE[case]
    edit(f)
    msg = refused(CheckpointError, lambda: from_path(f), str(f), "corrupt tensor table", *names)
    assert "truncated" not in msg and "trailing" not in msg, msg


def test_split_gguf_part_is_refused(tmp_path):
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    f = write_gguf_file(tmp_path / "m-00001-of-00002.gguf", O, V, meta={"split.count": 2, "split.no": 0})
    refused(CheckpointError, lambda: from_path(f), str(f), "part 1 of 2", "merge")


@pytest.mark.parametrize(
    "meta",
    [{}, {"llama.attention.key_length": 12, "llama.attention.value_length": 8}],
    ids=["key_length", "value_length differs from key_length"],
)
def test_good_gguf_reads_exactly(tmp_path, meta):
    """V and O are value_length wide (MLA-style files have key_length != value_length)."""
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    f = write_gguf_file(tmp_path / "m.gguf", O, V, meta=meta)
    assert_exact(from_path(f), O, V)


BAD_PATHS = {
    "a FIFO": (lambda p: os.mkfifo(p), CheckpointError, ["FIFO"]),
    "a symlink loop": (lambda p: os.symlink(p.name, p), CheckpointError, ["symbolic-link loop"]),
    "a dangling symlink": (lambda p: os.symlink("nowhere", p), CheckpointError, ["dangling symbolic link"]),
    "another suffix": (lambda p: p.write_bytes(b"x"), CheckpointError, ["not a .gguf file"]),
    "nothing there": (lambda p: None, MissingFileError, ["not an existing file"]),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(BAD_PATHS))
def test_bad_paths_say_what_they_are(tmp_path, case):
    p = tmp_path / "weights.bin"
    make, exc, names = BAD_PATHS[case]
    make(p)
    refused(exc, lambda: from_path(p), str(p), *names)
    refused(exc, lambda: head_source(str(p)), str(p), *names)


def test_from_hf_dir_on_a_file(tmp_path):
    d, _, _ = single(tmp_path / "ck")
    refused(CheckpointError, lambda: from_hf_dir(d / "model.safetensors"), "model.safetensors", "not a directory")


# =========================================================================== class 5: options checked where they enter

ENTRY = {
    "layer": "layers.{l}.",
    "v": {"tensor": "self_attn.v_proj.weight", "layout": "linear"},
    "o": {"tensor": "self_attn.o_proj.weight", "layout": "linear"},
}


def _e(**changes):
    out = json.loads(json.dumps(ENTRY))
    for k, v in changes.items():
        if v is ...:
            out.pop(k)
        else:
            out[k] = v
    return out


# One table per validator, run on the validator itself; then each route (ENTRIES) shows once per option that it
# refuses through that validator (its error is the validator's, message for message): 29 + 6 + 3 cases instead of
# the 29 options x 3 routes the routes would multiply.

#: check_architecture (sources/architectures.py): value -> (exact error, strings the message must hold).
ARCHITECTURE_LIES = {
    "5": (5, OptionTypeError, ["architecture", "int 5"]),
    "3.5": (3.5, OptionTypeError, ["architecture", "float"]),
    "['llama']": (["llama"], OptionTypeError, ["architecture", "list"]),
    "b'llama'": (b"llama", OptionTypeError, ["architecture", "bytes"]),
    "'lama'": ("lama", OptionError, ["architecture='lama'", "did you mean 'llama'"]),
    "''": ("", OptionError, ["architecture=''", "not in the architecture table"]),
    "'Llama'": ("Llama", OptionError, ["did you mean", "llama"]),
    "entry without o": (_e(o=...), OptionError, ["lacks ['o']"]),
    "entry key typo": (_e(layr="x"), OptionError, ["'layr'", "did you mean 'layer'"]),
    "entry layout typo": (
        _e(v={"tensor": "a", "layout": "linaer"}),
        OptionError,
        ["['v']['layout'] = 'linaer'", "did you mean 'linear'"],
    ),
    "entry O with a fused layout": (
        _e(o={"tensor": "a", "layout": "fused_qkv"}),
        OptionError,
        ["['o']['layout'] = 'fused_qkv'"],
    ),
    "entry V with the conv1d (O) layout": (
        _e(v={"tensor": "a", "layout": "conv1d"}),
        OptionError,
        ["['v']['layout'] = 'conv1d'"],
    ),
    "entry part key typo": (
        _e(v={"tensr": "a", "layout": "linear"}),
        OptionError,
        ["'tensr'", "did you mean 'tensor'"],
    ),
    "entry tensor not a string": (_e(v={"tensor": 3, "layout": "linear"}), OptionError, ["['v']['tensor']"]),
    "entry part not a dict": (_e(o="self_attn.o_proj.weight"), OptionError, ["['o'] must be"]),
    "entry layer without {l}": (_e(layer="layers.0."), OptionError, ["['layer']", "'layers.0.'"]),
    "entry layer with {x}": (_e(layer="layers.{l}.{x}"), OptionError, ["no other"]),
    "entry layer with {l} twice": (_e(layer="l{l}.{l}."), OptionError, ["exactly once"]),
    "entry layer not a string": (_e(layer=0), OptionError, ["['layer']"]),
    "entry post_attention_norm 1": (_e(post_attention_norm=1), OptionError, ["post_attention_norm"]),
}
#: the prefix check: value -> (exact error, strings the message must hold).
PREFIX_LIES = {
    "5": (5, OptionTypeError, ["prefix", "int"]),
    "b'model.'": (b"model.", OptionTypeError, ["prefix", "bytes"]),
    "['model.']": (["model."], OptionTypeError, ["prefix", "list"]),
}
#: check_bool(x, "check_finite") (core/options.py).
CHECK_FINITE_LIES = {
    "1": (1, OptionTypeError, ["check_finite", "int 1"]),
    "'yes'": ("yes", OptionTypeError, ["check_finite", "'yes'"]),
    "None": (None, OptionTypeError, ["check_finite", "None"]),
}
#: strict_kwargs (core/kwargs.py) on a route's signature: keywords -> strings the UnknownOptionError must hold.
KEYWORD_TYPOS = {
    "prefx=": (dict(prefx="model."), ["'prefx'", "did you mean 'prefix'"]),
    "arch=": (dict(arch="llama"), ["'arch'", "'architecture'"]),
    "check_finit=": (dict(check_finit=True), ["'check_finit'", "'check_finite'"]),
}
ENTRIES = {"from_hf_dir": from_hf_dir, "from_path": from_path, "head_source": head_source}


@pytest.mark.parametrize("case", list(ARCHITECTURE_LIES))
def test_bad_architecture_is_refused_by_its_validator(case):
    value, exc, names = ARCHITECTURE_LIES[case]
    refused(exc, lambda: check_architecture(value), *names)


#: The two prefix checks: the checkpoint readers' (from_hf_dir, from_path) and head_source's own.
PREFIX_CHECKS: dict[str, Callable[[object], object]] = {
    "checkpoint": _check_prefix,
    "head_source": lambda value: head_source("no such model", prefix=value),
}


@pytest.mark.parametrize("check", list(PREFIX_CHECKS))
@pytest.mark.parametrize("case", list(PREFIX_LIES))
def test_bad_prefix_is_refused_by_its_validator(case, check):
    value, exc, names = PREFIX_LIES[case]
    refused(exc, lambda: PREFIX_CHECKS[check](value), *names)


@pytest.mark.parametrize("case", list(CHECK_FINITE_LIES))
def test_bad_check_finite_is_refused_by_its_validator(case):
    value, exc, names = CHECK_FINITE_LIES[case]
    refused(exc, lambda: check_bool(value, "check_finite"), *names)


@pytest.mark.parametrize("case", list(KEYWORD_TYPOS))
def test_a_keyword_typo_is_refused_with_the_closest_name(tmp_path, case):
    kw, names = KEYWORD_TYPOS[case]
    refused(UnknownOptionError, lambda: from_hf_dir(tmp_path / "nowhere", **kw), "from_hf_dir()", *names)


def _message(fn: Callable[[], object]) -> tuple[type, str]:
    with pytest.raises(Exception) as ei:
        fn()
    return type(ei.value), str(ei.value)


@pytest.mark.parametrize("route", list(ENTRIES))
def test_each_route_refuses_its_options_through_the_validators(tmp_path, route):
    """Each route, on a real checkpoint, raises exactly what the validator raises, once per option: so the
    tables above hold for every route."""
    d, _, _ = single(tmp_path / "ck")
    fn = ENTRIES[route]
    prefix_check = PREFIX_CHECKS["head_source" if route == "head_source" else "checkpoint"]
    for kw, validator in (
        (dict(architecture="lama"), lambda: check_architecture("lama")),
        (dict(architecture=_e(layr="x")), lambda: check_architecture(_e(layr="x"))),
        (dict(prefix=5), lambda: prefix_check(5)),
        (dict(check_finite="yes"), lambda: check_bool("yes", "check_finite")),
    ):
        assert _message(lambda kw=kw: fn(d, **kw)) == _message(validator), (route, kw)
    exc, msg = _message(lambda: fn(d, prefx="model."))
    assert exc is UnknownOptionError and f"{fn.__qualname__}()" in msg and "did you mean 'prefix'" in msg, msg


def test_options_are_checked_before_the_files(tmp_path):
    """A bad option is reported even when the path does not exist (nothing is read first)."""
    for fn in ENTRIES.values():
        refused(OptionTypeError, lambda fn=fn: fn(tmp_path / "nowhere", prefix=5), "prefix")
    refused(OptionTypeError, lambda: from_gguf(tmp_path / "nowhere.gguf", check_finite="no"), "check_finite")
    refused(UnknownOptionError, lambda: from_gguf(tmp_path / "x.gguf", architecture="llama"), "'architecture'")


BAD_PATH_ARGS = {
    "5": (5, OptionTypeError, ["path", "int 5"]),
    "None": (None, OptionTypeError, ["path", "None"]),
    "bytes": (b"/tmp", OptionTypeError, ["path", "bytes"]),
    "''": ("", OptionError, ["path", "empty"]),
}


@pytest.mark.parametrize("fn", ["from_hf_dir", "from_path", "from_gguf"])
@pytest.mark.parametrize("case", list(BAD_PATH_ARGS))
def test_bad_path_arguments(case, fn):
    value, exc, names = BAD_PATH_ARGS[case]
    f = {"from_hf_dir": from_hf_dir, "from_path": from_path, "from_gguf": from_gguf}[fn]
    refused(exc, lambda: f(value), *names)


def test_option_misfits(tmp_path):
    d, O, V = single(tmp_path / "ck")
    refused(CheckpointError, lambda: from_path(d, prefix="nope."), "'nope.layers.0.self_attn.v_proj.weight'")
    O2_, V2_, _ = random_heads(2, 4, 2, 32, 8)
    g = write_gguf_file(tmp_path / "m.gguf", O2_, V2_)
    refused(OptionError, lambda: from_path(g, architecture="llama"), str(g), "architecture=")
    # the documented escapes still work, exactly
    assert_exact(from_path(d, architecture="llama", prefix="model.", check_finite=False), O, V)
    assert_exact(from_path(d, architecture=_e(post_attention_norm="input_layernorm.weight")), O, V)
    assert_exact(from_path(d, architecture="LlamaForCausalLM"), O, V)  # an alias
    assert_exact(from_path(d, check_finite=np.bool_(True)), O, V)


def test_every_table_entry_is_a_valid_entry():
    t = architecture_table()
    for name in supported_architectures():
        check_entry(t["architectures"][name], name)
    gguf_entry = {k: v for k, v in t["gguf"].items() if k != "v_fused"}
    check_entry(gguf_entry, "gguf")
    with_norm = sorted(k for k, e in t["architectures"].items() if "post_attention_norm" in e)
    assert {"gemma2", "gemma3", "gemma3_text", "olmo2", "olmo3"} <= set(with_norm)
    # Llama-family names: their post_attention_layernorm is the pre-MLP norm, never noted
    assert not {"llama", "mistral", "qwen2", "qwen3", "gemma", "olmo", "phi3"} & set(with_norm)


# =========================================================================== class 6: post-attention norm


def norm_checkpoint(d: Path, model_type: str, norm: str | None, layers=(0, 1, 2), root="model.", **cfg):
    """A llama-like checkpoint of ``model_type`` with a ``norm`` tensor in each of ``layers``."""
    src, O, V = llama_like(d.parent / (d.name + "_src"))
    t = all_tensors(src)
    if norm:
        for l in layers:
            t[f"model.layers.{l}.{norm}"] = torch.full((48,), 2.0)
    t = {(root + k.removeprefix("model.") if k.startswith("model.") else k): v for k, v in t.items()}
    config = {**json.loads((src / "config.json").read_text()), "model_type": model_type, **cfg}
    return write_checkpoint(d, config, t, n_shards=2), O, V


NORM_CASES = {
    # case: (model_type, norm tensor, layers holding it, root, extra config, note expected)
    "gemma2": ("gemma2", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, "every layer"),
    "gemma3 (alias)": ("gemma3", "post_attention_layernorm.weight", (0, 1, 2), "language_model.model.", {}, "every"),
    "gemma3_text": ("gemma3_text", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, "every layer"),
    "olmo2": ("olmo2", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, "every layer"),
    "gemma2, 2 of 3 layers": ("gemma2", "post_attention_layernorm.weight", (0, 2), "model.", {}, "2 of 3 layers"),
    "gemma2 without the tensor": ("gemma2", None, (), "model.", {}, None),
    "llama (pre-MLP norm of that name)": ("llama", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, None),
    "qwen2 (pre-MLP)": ("qwen2", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, None),
    "mistral (pre-MLP)": ("mistral", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, None),
    "gemma (v1, pre-MLP)": ("gemma", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, None),
    "olmo (v1)": ("olmo", "post_attention_layernorm.weight", (0, 1, 2), "model.", {}, None),
}


@pytest.mark.parametrize("case", list(NORM_CASES))
def test_post_attention_norm_is_recorded_from_the_tensors(tmp_path, case):
    model_type, norm, layers, root, cfg, expected = NORM_CASES[case]
    d, O, V = norm_checkpoint(tmp_path / "ck", model_type, norm, layers, root, **cfg)
    src = from_path(d)
    note = src.info.extra.get("post_attention_norm")
    if expected is None:
        assert note is None
    else:
        assert expected in note and f"{root}layers.{layers[0]}.{norm}" in note and "after W_O" in note
    assert_exact(src, O, V)  # the norm changes nothing that is measured


def test_post_attention_norm_reaches_the_report_summary(tmp_path):
    import tl_idempotence as tli

    d, O, V = norm_checkpoint(tmp_path / "g2", "gemma2", "post_attention_layernorm.weight")
    rep = tli.idempotence_report(str(d), progress=False)
    assert_matches(rep, O, V, 6, 2)
    (note,) = rep.summary["notes"]
    assert "model.layers.0.post_attention_layernorm.weight" in note and "measured on W_O alone" in note
    assert rep.summary["source"]["post_attention_norm"] in note
    d2, _, _ = norm_checkpoint(tmp_path / "ll", "llama", "post_attention_layernorm.weight")
    assert "notes" not in tli.idempotence_report(str(d2), progress=False).summary


@pytest.mark.parametrize("post_norm", [True, False])
def test_post_attention_norm_in_gguf(tmp_path, post_norm):
    O, V, _ = random_heads(2, 4, 2, 32, 8)
    f = write_gguf_file(tmp_path / "m.gguf", O, V, post_norm=post_norm)  # every file also has blk.{l}.ffn_norm
    note = from_path(f).info.extra.get("post_attention_norm")
    assert (note is not None) == post_norm
    if post_norm:
        assert "'blk.0.post_attention_norm.weight', every layer" in note


def test_post_attention_norm_from_transformers_models():
    """Real transformers classes: the table's names are theirs; Llama's post_attention_layernorm is not noted."""
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8)  # fmt: skip
    torch.manual_seed(0)
    for cls, cfg_cls, noted in (
        ("Gemma2ForCausalLM", "Gemma2Config", True),
        ("Gemma3ForCausalLM", "Gemma3TextConfig", True),
        ("Olmo2ForCausalLM", "Olmo2Config", True),
        ("LlamaForCausalLM", "LlamaConfig", False),
        ("Qwen2ForCausalLM", "Qwen2Config", False),
    ):
        model = getattr(transformers, cls)(getattr(transformers, cfg_cls)(**small))
        assert any("post_attention_layernorm" in n for n, _ in model.named_parameters()), cls
        src = from_transformers(model)
        note = src.info.extra.get("post_attention_norm")
        assert (note is not None) == noted, cls
        if noted:
            assert "'model.layers.0.post_attention_layernorm.weight', every layer" in note
        lh = src.layer_heads(1)
        w = model.model.layers[1].self_attn.o_proj.weight.detach()
        assert torch.equal(lh.O, w.reshape(32, 4, 8).permute(1, 0, 2))
    # a transformers model whose config declares fewer layers than it has
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**small))
    model.config.num_hidden_layers = 1
    refused(CheckpointError, lambda: from_transformers(model), "LlamaForCausalLM.config", "declares 1 layers")
    refused(UnknownOptionError, lambda: from_transformers(model, prefx="model."), "did you mean 'prefix'")
    refused(OptionTypeError, lambda: from_transformers(model, architecture=7), "architecture")
