"""The V/O tensor layouts, each one object (sources/layouts.py): exact constructions of every stored layout from
known heads, read back bit for bit; the table's documentation and the derivation script agree with the registry;
a new layout is one object that the entry check, the shape check and the reader all pick up."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tl_idempotence.core.heads import Sizes
from tl_idempotence.errors import CheckpointError, OptionError
from tl_idempotence.sources.architectures import architecture_table, check_entry
from tl_idempotence.sources.checkpoint import from_hf_dir
from tl_idempotence.sources.layouts import O_LAYOUTS, V_LAYOUTS, Layout, get_layout, layout_docs

ROOT = Path(__file__).resolve().parents[3]


class DictReader:
    """The reader protocol over a dict of stored 2-D tensors (rows, then columns, as the stores slice)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def read(self, name: str, rows: slice = slice(None), cols: slice = slice(None)) -> torch.Tensor:
        return self.tensors[name][rows][:, cols]


def _heads(s: Sizes, seed: int = 0) -> dict[str, torch.Tensor]:
    """Known per-head matrices (column form, [heads, d_model, d_head]) for Q, K, V and O; every entry distinct."""
    g = torch.Generator().manual_seed(seed)
    nq, nkv, dm, dh = s.n_heads, s.n_kv_heads, s.d_model, s.d_head
    return {
        "Q": torch.randn(nq, dm, dh, generator=g, dtype=torch.float64),
        "K": torch.randn(nkv, dm, dh, generator=g, dtype=torch.float64),
        "V": torch.randn(nkv, dm, dh, generator=g, dtype=torch.float64),
        "O": torch.randn(nq, dm, dh, generator=g, dtype=torch.float64),
    }


def _rows(X: torch.Tensor) -> torch.Tensor:
    """Heads [n, d_model, d_head] as a Linear weight's rows [n*d_head, d_model] (head i = rows i*dh:(i+1)*dh)."""
    return torch.cat([x.T for x in X])


def _stored_v(layout: str, s: Sizes, h: dict[str, torch.Tensor]) -> torch.Tensor:
    """The stored tensor of each V layout, built from its documented description (not from the reader)."""
    Q, K, V = h["Q"], h["K"], h["V"]
    nq, nkv = s.n_heads, s.n_kv_heads
    if layout == "linear":
        return _rows(V)
    if layout == "fused_qkv":
        return torch.cat([_rows(Q), _rows(K), _rows(V)])
    if layout == "neox_qkv":  # per head: q, k, v
        return torch.cat([torch.cat([Q[i].T, K[i].T, V[i].T]) for i in range(nq)])
    if layout == "conv1d_qkv":  # Conv1D: [in, out], columns q; k; v
        return torch.cat([_rows(Q), _rows(K), _rows(V)]).T
    if layout == "grouped_qkv":  # per kv group: its query heads, its k, its v
        g = nq // nkv
        return torch.cat([torch.cat([_rows(Q[k * g : (k + 1) * g]), K[k].T, V[k].T]) for k in range(nkv)])
    if layout == "codegen_qkv":  # 4 blocks of [q; v; k], n_heads/4 heads each
        per = nq // 4
        blocks = [slice(b * per, (b + 1) * per) for b in range(4)]
        return torch.cat([torch.cat([_rows(Q[b]), _rows(V[b]), _rows(K[b])]) for b in blocks])
    raise AssertionError(layout)


def _stored_o(layout: str, h: dict[str, torch.Tensor]) -> torch.Tensor:
    if layout == "linear":  # [d_model, n_heads*d_head], head h = columns
        return torch.cat(list(h["O"]), dim=1)
    if layout == "conv1d":  # [n_heads*d_head, d_model], head h = rows
        return _rows(h["O"])
    raise AssertionError(layout)


#: GQA sizes for the layouts that allow them, one kv head per query head (and heads in 4 blocks) for the others;
#: d_head * n_heads != d_model so that a transposed tensor cannot have the right shape.
GQA = Sizes(n_layers=1, n_heads=8, n_kv_heads=2, d_model=12, d_head=5)
MHA = Sizes(n_layers=1, n_heads=8, n_kv_heads=8, d_model=12, d_head=5)


@pytest.mark.parametrize("name", list(V_LAYOUTS))
def test_every_v_layout_reads_the_heads_it_stores(name):
    lay = V_LAYOUTS[name]
    s = MHA if name in ("neox_qkv", "codegen_qkv") else GQA
    h = _heads(s)
    W = _stored_v(name, s, h)
    assert tuple(W.shape) == lay.shape(s) == get_layout("v", name).shape(s)
    got = lay.read(DictReader({"w": W}), "w", s)
    assert got.shape == (s.n_kv_heads, s.d_model, s.d_head)
    assert torch.equal(got, h["V"])


@pytest.mark.parametrize("name", list(O_LAYOUTS))
def test_every_o_layout_reads_the_heads_it_stores(name):
    lay = O_LAYOUTS[name]
    h = _heads(GQA)
    W = _stored_o(name, h)
    assert tuple(W.shape) == lay.shape(GQA) == get_layout("o", name).shape(GQA)
    assert torch.equal(lay.read(DictReader({"w": W}), "w", GQA), h["O"])


def test_a_fused_layout_reads_only_the_value_rows():
    """A reader that refuses any slice outside V's rows: the fused layouts never touch Q or K."""
    s = GQA
    W = _stored_v("fused_qkv", s, _heads(s))
    lo = (s.n_heads + s.n_kv_heads) * s.d_head

    class OnlyV(DictReader):
        def read(self, name, rows=slice(None), cols=slice(None)):
            assert rows.start is not None and rows.start >= lo, rows
            return super().read(name, rows, cols)

    assert torch.equal(V_LAYOUTS["fused_qkv"].read(OnlyV({"w": W}), "w", s), _heads(s)["V"])


@pytest.mark.parametrize(
    ("name", "sizes", "match"),
    [
        ("neox_qkv", GQA, r"^arch: the neox_qkv layout has one kv head per query head; cfg says 8 heads, 2 kv heads\."),
        ("codegen_qkv", GQA, r"^arch: the codegen_qkv layout has one kv head per query head; cfg says 8 heads"),
        (
            "codegen_qkv",
            Sizes(n_layers=1, n_heads=6, n_kv_heads=6, d_model=12, d_head=2),
            r"^arch: the codegen_qkv layout splits the heads into 4 blocks; cfg says 6 heads, not a multiple of 4\.$",
        ),
    ],
)
def test_sizes_a_layout_cannot_hold_are_refused_with_the_reason(name, sizes, match):
    with pytest.raises(CheckpointError, match=match):
        V_LAYOUTS[name].check_sizes(sizes, "arch", "cfg")


@pytest.mark.parametrize("name", ["linear", "fused_qkv", "conv1d_qkv", "grouped_qkv"])
def test_gqa_layouts_accept_gqa_and_mha(name):
    for s in (GQA, MHA):
        V_LAYOUTS[name].check_sizes(s, "arch", "cfg")  # no error


def test_unknown_layout_names_the_valid_ones():
    with pytest.raises(CheckpointError, match=r"Unknown value tensor layout 'neox' \(valid: linear, fused_qkv, "):
        get_layout("v", "neox")
    with pytest.raises(CheckpointError, match=r"Unknown output tensor layout 'fused_qkv' \(valid: linear, conv1d\)"):
        get_layout("o", "fused_qkv")
    with pytest.raises(CheckpointError, match="Unknown output tensor layout"):
        get_layout("o", "conv1d_qkv").shape(GQA)


def test_the_table_documents_exactly_the_registered_layouts():
    docs = architecture_table()["_format"]["layouts"]
    assert docs == layout_docs()
    assert list(docs) == ["linear", "conv1d", "fused_qkv", "neox_qkv", "conv1d_qkv", "grouped_qkv", "codegen_qkv"]
    assert set(docs) == set(V_LAYOUTS) | set(O_LAYOUTS)
    assert docs["linear"].startswith("torch.nn.Linear weight [out_features, in_features]. V: [n_kv_heads*d_head")
    assert "O: [d_model, n_heads*d_head]" in docs["linear"]
    hand = json.loads((ROOT / "src/tl_idempotence/data/architectures.json").read_text())
    assert "layouts" not in hand["_format"]  # one place: the objects


def test_the_derivation_script_decodes_the_same_layouts():
    spec = importlib.util.spec_from_file_location("derive_architectures", ROOT / "scripts/derive_architectures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.V_LAYOUTS == tuple(V_LAYOUTS) and mod.O_LAYOUTS == tuple(O_LAYOUTS)
    s = GQA
    h = _heads(s)  # its independent decoder agrees with the library's readers on every GQA layout
    for name in ("linear", "fused_qkv", "conv1d_qkv", "grouped_qkv"):
        W = _stored_v(name, s, h)
        assert torch.equal(mod._decode_v(W, name, s.n_heads, s.n_kv_heads, s.d_head, s.d_model), h["V"]), name


def test_a_new_layout_is_one_object(tmp_path, monkeypatch):
    """Register one Layout (V stored with its kv heads in reverse order): the entry check accepts it, the
    source checks the shape and reads the heads through it; nothing else changes."""
    s = Sizes(n_layers=2, n_heads=4, n_kv_heads=2, d_model=6, d_head=3)

    def read_reversed(r, name, sz):
        return r.read(name).reshape(sz.n_kv_heads, sz.d_head, sz.d_model).flip(0).transpose(1, 2)

    new = Layout(
        "reversed_linear",
        "v",
        "a Linear value weight whose kv heads are stored last to first",
        lambda sz: (sz.n_kv_heads * sz.d_head, sz.d_model),
        read_reversed,
    )
    entry = {
        "layer": "layers.{l}.",
        "v": {"tensor": "self_attn.v_proj.weight", "layout": "reversed_linear"},
        "o": {"tensor": "self_attn.o_proj.weight", "layout": "linear"},
    }
    with pytest.raises(OptionError, match="'reversed_linear' is not a layout of a value tensor"):
        check_entry(entry)
    monkeypatch.setitem(V_LAYOUTS, "reversed_linear", new)
    assert check_entry(entry) == entry
    heads = [_heads(s, seed=l) for l in range(s.n_layers)]
    tensors = {}
    for l, h in enumerate(heads):
        tensors[f"model.layers.{l}.self_attn.v_proj.weight"] = _rows(h["V"].flip(0)).float().contiguous()
        tensors[f"model.layers.{l}.self_attn.o_proj.weight"] = _stored_o("linear", h).float().contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {
        "model_type": "llama",
        "hidden_size": s.d_model,
        "num_attention_heads": s.n_heads,
        "num_key_value_heads": s.n_kv_heads,
        "num_hidden_layers": s.n_layers,
        "head_dim": s.d_head,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    src = from_hf_dir(tmp_path, architecture=entry)
    for l, h in enumerate(heads):
        lh = src.layer_heads(l)
        assert torch.equal(lh.V, h["V"].float()) and torch.equal(lh.O, h["O"].float())
    bad = dict(tensors)
    bad["model.layers.1.self_attn.v_proj.weight"] = torch.zeros(s.n_kv_heads * s.d_head + 1, s.d_model)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"layout 'reversed_linear' need \[6, 6\]"):
        from_hf_dir(tmp_path, architecture=entry)


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({"new_decoder_architecture": True, "num_kv_heads": 4, "num_key_value_heads": 2}, 4),
        ({"new_decoder_architecture": True, "num_kv_heads": 2, "num_key_value_heads": 4}, 2),
        ({"new_decoder_architecture": True, "num_key_value_heads": 2}, 8),  # FalconConfig: absent -> n_heads
        ({"multi_query": False, "num_key_value_heads": 2}, 8),
        ({"multi_query": True, "num_kv_heads": 4, "num_key_value_heads": 4}, 1),  # old multi-query: always 1
    ],
)
def test_falcon_kv_heads_come_from_num_kv_heads_as_in_transformers(fields, want):
    """FalconAttention reads num_kv_heads (1 under old multi-query); num_key_value_heads, which FalconConfig derives
    but a config.json may carry disagreeing, is never read for Falcon (checked against transformers itself in
    tests/integration/sources/test_architectures.py)."""
    from tl_idempotence.sources.architectures import resolve_architecture, sizes_from_config

    config = {"model_type": "falcon", "num_attention_heads": 8, "hidden_size": 64, "num_hidden_layers": 2, **fields}
    _key, entry = resolve_architecture(config, None)
    assert sizes_from_config(config, "config.json", entry).n_kv_heads == want
    _key, forced = resolve_architecture(config, "falcon")  # architecture="falcon" forced: the same field
    assert sizes_from_config(config, "config.json", forced).n_kv_heads == want
    # another type keeps config_fields' order (num_key_value_heads first)
    llama = {**config, "model_type": "llama", "num_kv_heads": 4, "num_key_value_heads": 2}
    assert sizes_from_config(llama, "config.json", resolve_architecture(llama, None)[1]).n_kv_heads == 2


def test_an_entry_kv_heads_field_must_be_a_field_name():
    e = {"layer": "layers.{l}.", **{k: architecture_table()["architectures"]["llama"][k] for k in ("v", "o")}}
    for bad in ("", 4, ["num_kv_heads"]):
        with pytest.raises(OptionError, match="n_kv_heads_field"):
            check_entry({**e, "n_kv_heads_field": bad})
    assert check_entry({**e, "n_kv_heads_field": "num_kv_heads"})["n_kv_heads_field"] == "num_kv_heads"
