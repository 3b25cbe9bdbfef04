"""The architecture table: every covered model type read from a tiny real checkpoint, refusals that say why,
and the generated table checked against the installed transformer-lens and transformers.

The reference is independent of the table: ``tl_idempotence.testing.ov_by_forward`` measures each head's
value read and output write by running the transformers model (float64, loaded back from the saved
safetensors), so a wrong tensor, layout, head order, kv grouping or size field shows up as a wrong P.
"""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch

import tl_idempotence as tli
from helpers import dense_closure
from tl_idempotence.errors import CheckpointError, OptionError
from tl_idempotence.sources.architectures import (
    architecture_table,
    check_entry,
    refused_architectures,
    resolve_architecture,
    sizes_from_config,
    supported_architectures,
)
from tl_idempotence.sources.checkpoint import from_path

# integration tier: a tiny transformers checkpoint per model type
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
DERIVED = json.loads((ROOT / "src/tl_idempotence/data/architectures_derived.json").read_text())

#: One type per layout / route property; run in the default suite (the rest are slow).
FAST = {"llama", "gpt2", "gpt_neox", "phi3", "bert", "gemma3_text", "falcon", "distilbert", "opt", "codegen"}


def _cases() -> list:
    out = []
    for mt, e in sorted(DERIVED["architectures"].items()):
        configs = [e["source"].get("config", {}), *e["source"].get("variant_configs", [])]
        for i, cfg in enumerate(configs):
            marks = [] if mt in FAST else [pytest.mark.slow]
            out.append(pytest.param(mt, cfg, id=f"{mt}-{i}" if i else mt, marks=marks))
    return out


def _reference(model_dir: Path, mt: str, cfg: dict) -> tuple[list, list, bool]:
    """Per-layer dense alpha, P (float64) from the forward-pass measurement of the model loaded from the files."""
    import transformers

    from tl_idempotence.testing import ov_by_forward, post_norm_by_forward

    src = DERIVED["architectures"][mt]["source"]
    mods = src["modules"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, src["hf_class"]).from_pretrained(str(model_dir), dtype=torch.float64)
    model.eval()
    text = getattr(model.config, "text_config", None) or model.config
    nq, n_layers = int(text.num_attention_heads), int(text.num_hidden_layers)
    layers = mods["layers"]
    names = dict(model.named_modules())
    if f"{layers}.0" not in names:
        (layers,) = [n[: -len(".0")] for n in names if n.endswith(f".{layers}.0")]
    alphas, Ps = [], []
    for layer in range(n_layers):
        V, O = ov_by_forward(model, f"{layers}.{layer}.{mods['v']}", f"{layers}.{layer}.{mods['o']}", nq)
        ref = dense_closure(O, V)
        alphas.append(ref["alpha"])
        Ps.append(ref["P"])
    post = post_norm_by_forward(model, f"{layers}.0", f"{layers}.0.{mods['o']}") is not None
    return alphas, Ps, post


@pytest.mark.parametrize(("model_type", "config"), _cases())
def test_tiny_checkpoint_of_every_covered_type_matches_the_forward_pass(tmp_path, model_type, config, request):
    """save_pretrained (safetensors, the names real checkpoints have) -> idempotence_report(path) -> every head's
    P and alpha equal a dense float64 computation from the heads measured by running the model (<= 1e-9)."""
    import transformers

    from tl_idempotence.testing import tiny_model

    if transformers.utils.logging.is_progress_bar_enabled():  # off for this test only (the next tests see it on)
        transformers.utils.logging.disable_progress_bar()
        request.addfinalizer(transformers.utils.logging.enable_progress_bar)
    src = DERIVED["architectures"][model_type]["source"]
    model = tiny_model(model_type, src["hf_class"], **config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == model_type
    rep = tli.idempotence_report(str(tmp_path), progress=False)
    alphas, Ps, post = _reference(tmp_path, model_type, config)
    heads = rep.heads.sort_values(["layer", "head"])
    assert len(heads) == sum(len(p) for p in Ps)
    for layer, (a_ref, p_ref) in enumerate(zip(alphas, Ps)):
        rows = heads[heads.layer == layer]
        assert rows["head"].tolist() == list(range(len(p_ref)))
        P, alpha = torch.tensor(rows.P.to_numpy()), torch.tensor(rows.alpha.to_numpy())
        assert torch.allclose(P, p_ref, rtol=0, atol=1e-9), (layer, (P - p_ref).abs().max())
        scale = a_ref.abs().max().item()
        assert torch.allclose(alpha, a_ref, rtol=0, atol=1e-9 * max(scale, 1.0)), (layer, (alpha - a_ref).abs().max())
    notes = rep.summary.get("notes", [])
    assert post == any("norm after W_O" in n for n in notes), (post, notes)


def _layouts(entries) -> set:
    return {(x["v"]["layout"], x["o"]["layout"]) for e in entries for x in [e, *e.get("variants", [])]}


def test_the_fast_subset_covers_every_layout():
    archs = DERIVED["architectures"]
    assert _layouts(archs.values()) <= _layouts(archs[m] for m in FAST)
    assert any("post_attention_norm" in archs[m] for m in FAST)


# ----------------------------------------------------------------------------- refusals


def _config_only(d: Path, config: dict) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}, "latent attention"),
        ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "encoder-decoder"),
        ({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}, "no attention layers"),
        ({"model_type": "jamba", "architectures": ["JambaForCausalLM"]}, "only some layers"),
        ({"model_type": "gemma4_text"}, "v_norm"),
        ({"model_type": "internlm2", "architectures": ["InternLM2ForCausalLM"]}, "remote code"),
    ],
)
def test_unreadable_types_are_refused_naming_why(tmp_path, config, why):
    d = _config_only(tmp_path / "m", {**config, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2})
    with pytest.raises(CheckpointError, match=rf"config\.json: .*cannot be measured as T = O V\^T per head: .*{why}"):
        from_path(d)


def test_a_type_not_in_the_table_is_never_guessed(tmp_path):
    # llama-like tensor names, but a model type nobody described: refused, not read as llama
    d = _config_only(tmp_path / "m", {"model_type": "llamalike", "architectures": ["LlamaLikeForCausalLM"]})
    with pytest.raises(CheckpointError, match=r"no attention-tensor layout is known for model_type='llamalike'"):
        from_path(d)
    with pytest.raises(CheckpointError, match=r"Supported model types \(\d+\): .*bert.*llama"):
        from_path(d)


def test_refusal_covers_the_text_config_and_explicit_entries_still_work():
    t = architecture_table()
    assert not set(t["refused"]) & set(t["architectures"])
    # a multimodal config whose own type is not derived is read through its text_config's type
    key, entry = resolve_architecture({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}}, None)
    assert key == "llama4_text" and entry["v"]["layout"] == "linear"
    # architecture= overrides a refusal: the user says which tensors to read
    custom = {"layer": "layers.{l}.", **{k: t["architectures"]["llama"][k] for k in ("v", "o")}}
    assert resolve_architecture({"model_type": "jamba"}, custom)[0] == "custom"


def test_variants_pick_the_layout_from_the_config():
    base = {"model_type": "falcon", "num_attention_heads": 8, "hidden_size": 64, "num_hidden_layers": 2}
    mq = resolve_architecture({**base, "multi_query": True, "new_decoder_architecture": False}, None)[1]
    assert (mq["v"]["layout"], mq["n_kv_heads"]) == ("fused_qkv", 1)
    new = resolve_architecture({**base, "multi_query": False, "new_decoder_architecture": True}, None)[1]
    assert new["v"]["layout"] == "grouped_qkv" and "n_kv_heads" not in new
    old = resolve_architecture({**base, "multi_query": False, "new_decoder_architecture": False}, None)[1]
    assert old["v"]["layout"] == "neox_qkv" and "n_kv_heads" not in old
    assert "variants" not in mq
    # transformers ignores multi_query under new_decoder_architecture (FalconConfig's default is True), and reads
    # an absent field as its default: new_decoder_architecture False, multi_query True
    for mq_field in ({"multi_query": True}, {}):
        grouped = resolve_architecture({**base, **mq_field, "new_decoder_architecture": True}, None)[1]
        assert grouped["v"]["layout"] == "grouped_qkv" and "n_kv_heads" not in grouped, mq_field
    absent = resolve_architecture({**base, "multi_query": False}, None)[1]
    assert absent["v"]["layout"] == "neox_qkv"
    default = resolve_architecture(base, None)[1]
    assert (default["v"]["layout"], default["n_kv_heads"]) == ("fused_qkv", 1)


def _falcon_reference(model) -> tuple[list, list]:
    """Per-layer dense float64 alpha, P of a FalconForCausalLM under new_decoder_architecture, from its parameters.

    modeling_falcon splits the fused query_key_value output as ``view(..., n_kv, n_heads // n_kv + 2, d_head)``:
    per kv group its query heads, then k, then v; query head ``h`` (flattened [n_kv, g]) reads group ``h // g``;
    ``dense`` takes the heads' outputs concatenated, head ``h`` = columns ``h*d_head:(h+1)*d_head``. That reading
    is checked against the model's own forward pass (transformers' public API: a forward with the value input
    replaced by basis vectors and the output projection's input captured, :func:`tl_idempotence.testing.ov_by_forward`),
    not against a private method of the attention module.
    """
    from tl_idempotence.testing import ov_by_forward

    cfg = model.config
    nq, nkv = cfg.num_attention_heads, cfg.num_kv_heads
    d = cfg.hidden_size
    dh, g = d // nq, nq // nkv
    alphas, Ps = [], []
    for i, block in enumerate(model.transformer.h):
        attn = block.self_attention
        W = attn.query_key_value.weight.detach().double()  # [(nq + 2 nkv) dh, d]
        Wv = W.view(nkv, g + 2, dh, d)[:, -1]  # [nkv, dh, d]: group k's value rows
        V = torch.stack([Wv[h // g].T for h in range(nq)])  # column form [nq, d, dh]
        Wo = attn.dense.weight.detach().double()  # [d, nq dh]
        O = torch.stack([Wo[:, h * dh : (h + 1) * dh] for h in range(nq)])
        # the model's forward pass gives the same per-head values and output writes
        layer = f"transformer.h.{i}.self_attention"
        V_fwd, O_fwd = ov_by_forward(model, f"{layer}.query_key_value", f"{layer}.dense", nq)
        assert torch.allclose(V_fwd, V, rtol=0, atol=1e-12), (i, (V_fwd - V).abs().max())
        assert torch.allclose(O_fwd, O, rtol=0, atol=1e-12), (i, (O_fwd - O).abs().max())
        T = O @ V.transpose(1, 2)  # T_h = O_h V_h^T, [nq, d, d]
        T2 = T @ T
        inner = (T2 * T).sum((-1, -2))
        nT2, nT22 = (T * T).sum((-1, -2)), (T2 * T2).sum((-1, -2))
        alphas.append(inner / nT2)
        Ps.append(inner**2 / (nT22 * nT2))
    return alphas, Ps


def saved_falcon(cfg, path) -> None:
    """A FalconForCausalLM of ``cfg`` (seed 0, every parameter moved by 0.05 N(0, 1)) saved to ``path``."""
    import transformers

    torch.manual_seed(0)
    model = transformers.FalconForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)


@pytest.mark.parametrize("n_head", [4, 8])
@pytest.mark.parametrize("multi_query", ["default", True, False, "absent"])
def test_falcon_new_decoder_architecture_with_grouped_kv_heads(tmp_path, n_head, multi_query):
    """FalconConfig(new_decoder_architecture=True, num_kv_heads=2) saved by save_pretrained, whatever multi_query
    says (transformers ignores it there; "absent": the field deleted from config.json) -> idempotence_report(path)
    -> each head's alpha and P equal a dense float64 T = O_h V_h^T from the model's own parameters (<= 1e-9)."""
    import transformers

    kw = {} if multi_query in ("default", "absent") else {"multi_query": multi_query}
    cfg = transformers.FalconConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=n_head,
        num_kv_heads=2,
        new_decoder_architecture=True,
        **kw,
    )
    saved_falcon(cfg, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["new_decoder_architecture"] is True and config["num_kv_heads"] == 2
    if multi_query == "absent":
        del config["multi_query"]
        (tmp_path / "config.json").write_text(json.dumps(config))
    else:
        assert config["multi_query"] is (True if multi_query == "default" else multi_query)
    with warnings.catch_warnings():  # transformers loads it back (the same layout)
        warnings.simplefilter("ignore")
        loaded = transformers.FalconForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64)
    alphas, Ps = _falcon_reference(loaded)
    rep = tli.idempotence_report(str(tmp_path), progress=False)
    assert (rep.info.n_heads, rep.info.n_kv_heads) == (n_head, 2)
    heads = rep.heads.sort_values(["layer", "head"])
    assert len(heads) == 2 * n_head
    for layer, (a_ref, p_ref) in enumerate(zip(alphas, Ps)):
        rows = heads[heads.layer == layer]
        assert rows["head"].tolist() == list(range(n_head))
        P, alpha = torch.tensor(rows.P.to_numpy()), torch.tensor(rows.alpha.to_numpy())
        assert torch.allclose(P, p_ref, rtol=0, atol=1e-9), (layer, (P - p_ref).abs().max())
        assert torch.allclose(alpha, a_ref, rtol=0, atol=1e-9 * max(a_ref.abs().max().item(), 1.0)), layer
    # heads of one kv group share V, not P: the grouping is read, not one kv head for all
    assert len({round(float(p), 12) for p in heads.P}) == 2 * n_head
    # the loaded transformers model (its config object, multi_query as transformers keeps it): the same heads
    loaded_rep = tli.idempotence_report(loaded, progress=False)
    assert (loaded_rep.info.n_heads, loaded_rep.info.n_kv_heads) == (n_head, 2)
    np.testing.assert_allclose(
        loaded_rep.heads.sort_values(["layer", "head"]).P.to_numpy(), heads.P.to_numpy(), rtol=0, atol=1e-9
    )


def _falcon_heads_reference(model) -> tuple[int, list]:
    """Transformers' own kv-head count of a FalconForCausalLM (its attention module's ``num_kv_heads``) and each
    layer's dense float64 P from the parameters, split the way modeling_falcon splits the fused output: grouped
    ``[n_kv, g + 2, d_head]`` under new_decoder_architecture, ``[n_heads, 3, d_head]`` otherwise (multi-head)."""
    cfg = model.config
    nq, d = cfg.num_attention_heads, cfg.hidden_size
    dh = d // nq
    nkv = model.transformer.h[0].self_attention.num_kv_heads
    Ps = []
    for block in model.transformer.h:
        attn = block.self_attention
        W = attn.query_key_value.weight.detach().double()
        if cfg.new_decoder_architecture:
            g = nq // nkv
            Wv = W.view(nkv, g + 2, dh, d)[:, -1]
            V = torch.stack([Wv[h // g].T for h in range(nq)])
        else:
            V = W.view(nq, 3, dh, d)[:, 2].transpose(1, 2)
        Wo = attn.dense.weight.detach().double()
        O = torch.stack([Wo[:, h * dh : (h + 1) * dh] for h in range(nq)])
        T = O @ V.transpose(1, 2)
        T2 = T @ T
        inner = (T2 * T).sum((-1, -2))
        Ps.append(inner**2 / ((T2 * T2).sum((-1, -2)) * (T * T).sum((-1, -2))))
    return nkv, Ps


@pytest.mark.parametrize(
    ("new_decoder", "num_kv_heads", "num_key_value_heads"),
    [
        (True, 4, 2),  # transformers: 4 kv heads (the tensor holds 4); read as 2, it was refused
        (True, 2, 4),  # transformers: 2 kv heads; read as 4, it was refused
        (True, None, 2),  # num_kv_heads absent: transformers' default n_heads (4), not num_key_value_heads
        (False, None, 2),  # multi-head (multi_query=False): 4 kv heads; read as 2, a GQA split of MHA weights
        (False, 2, 4),  # multi-head with num_kv_heads=2: transformers' forward fails; it must be refused
    ],
)
def test_falcon_kv_heads_are_read_from_the_field_transformers_reads(
    tmp_path, new_decoder, num_kv_heads, num_key_value_heads
):
    """A Falcon config.json whose num_kv_heads and num_key_value_heads disagree (FalconConfig(...) built with
    both, saved by save_pretrained): transformers' FalconAttention reads num_kv_heads; tl_idempotence reads the
    same field, and measures what transformers loads and runs (P per head against a dense float64 reference
    from the loaded model's parameters) or refuses what transformers' forward pass refuses."""
    import transformers

    kw = {"num_kv_heads": num_kv_heads} if num_kv_heads is not None else {}
    cfg = transformers.FalconConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        new_decoder_architecture=new_decoder,
        multi_query=False,
        num_key_value_heads=num_key_value_heads,
        **kw,
    )
    saved_falcon(cfg, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_key_value_heads"] == num_key_value_heads
    assert config["num_kv_heads"] != num_key_value_heads  # the two fields disagree in the saved file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = transformers.FalconForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float64)
    try:  # transformers' own verdict: a forward pass
        with torch.no_grad():
            loaded(torch.tensor([[1, 2, 3]]))
        runs = True
    except RuntimeError:
        runs = False
    assert runs is not (not new_decoder and num_kv_heads == 2)
    if not runs:
        for src in (str(tmp_path), loaded):
            with pytest.raises(CheckpointError, match=r"one kv head per query head; .* 4 heads, 2 kv heads"):
                tli.idempotence_report(src, progress=False)
        return
    nkv, Ps = _falcon_heads_reference(loaded)
    assert nkv == config["num_kv_heads"] != num_key_value_heads
    for src in (str(tmp_path), loaded):
        rep = tli.idempotence_report(src, progress=False)
        assert (rep.info.n_heads, rep.info.n_kv_heads) == (4, nkv)
        heads = rep.heads.sort_values(["layer", "head"])
        for layer, p_ref in enumerate(Ps):
            P = torch.tensor(heads[heads.layer == layer].P.to_numpy())
            assert torch.allclose(P, p_ref, rtol=0, atol=1e-9), (layer, (P - p_ref).abs().max())


def test_tiny_falcon_writes_consistent_kv_head_fields(tmp_path):
    """testing.tiny_model("falcon", num_kv_heads=...) saves a config whose num_key_value_heads is what FalconConfig
    derives (num_kv_heads, or 1 under multi_query), never the tiny-size default 2 beside another num_kv_heads."""
    from tl_idempotence.testing import tiny_model

    for kw, want in [
        ({"new_decoder_architecture": True, "num_kv_heads": 4}, 4),
        ({"new_decoder_architecture": False, "multi_query": False, "num_kv_heads": 4}, 4),
        ({"new_decoder_architecture": False, "multi_query": True, "num_kv_heads": 4}, 1),
    ]:
        m = tiny_model("falcon", "FalconForCausalLM", **kw)
        cfg = m.config.to_dict()  # what save_pretrained writes
        assert m.transformer.h[0].self_attention.num_kv_heads == want, kw  # transformers' own count
        # no second kv-head field that disagrees (FalconConfig of transformers >= 5.25 derives one)
        assert cfg["num_kv_heads"] == 4 and cfg.get("num_key_value_heads", want) == want, kw
        assert sizes_from_config(cfg, "config.json", resolve_architecture(cfg, None)[1]).n_kv_heads == want, kw


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"n_kv_heads": 0}, "n_kv_heads"),
        ({"n_kv_heads": True}, "n_kv_heads"),
        ({"n_kv_heads": "1"}, "n_kv_heads"),
        ({"n_kv_heads": 10**9}, "n_kv_heads"),
        ({"variants": {"multi_query": True}}, "variants"),
        ({"variants": [{"v": {"tensor": "x", "layout": "linear"}}]}, r"variants'\]\[0\]"),
        ({"variants": [{"config": {"a": 1}, "layers": 2}]}, "unknown key 'layers'"),
        ({"variants": [{"config": {"a": 1}, "v": {"tensor": "x", "layout": "neox"}}]}, "neox_qkv"),
    ],
)
def test_hostile_entries_are_refused(bad, match):
    e = {"layer": "layers.{l}.", **{k: architecture_table()["architectures"]["llama"][k] for k in ("v", "o")}}
    with pytest.raises(OptionError, match=match):
        check_entry({**e, **bad})


def test_every_table_entry_is_valid_and_every_layout_documented():
    t = architecture_table()
    documented = set(t["_format"]["layouts"])
    for name in supported_architectures():
        e = check_entry(t["architectures"][name], name)
        assert e["v"]["layout"] in documented and e["o"]["layout"] in documented, name
    assert all(isinstance(r, str) and len(r) > 20 for r in refused_architectures().values())


# ----------------------------------------------------------------------------- the generated table itself


def _generator():
    spec = importlib.util.spec_from_file_location("derive_architectures", ROOT / "scripts/derive_architectures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _require_the_table_libraries() -> None:
    """Fail (never skip) when this install is not the one the architecture table was derived with: the main
    stage installs with constraints.txt, whose versions the table records; a difference is drift, named with the
    command that updates both (CI's unpinned stage reports it with scripts/derive_architectures.py --drift)."""
    g = DERIVED["_generated"]
    have = {"transformer_lens": version("transformer-lens"), "transformers": version("transformers")}
    differ = {k: (g[k], v) for k, v in have.items() if g[k] != v}
    if differ:
        pytest.fail(
            "drift: the architecture table was derived with "
            + ", ".join(f"{k} {was}" for k, (was, _now) in differ.items())
            + "; this install has "
            + ", ".join(f"{k} {now}" for k, (_was, now) in differ.items())
            + ". Install with `pip install -c constraints.txt ...` (README), or adopt the new release: "
            "`python scripts/update_constraints.py` (rewrites constraints*.txt and the table; CONTRIBUTING.md)",
            pytrace=False,
        )


def test_every_transformer_lens_adapter_type_is_covered_or_refused():
    """Each TransformerBridge adapter class transformers builds has a table entry, a refusal or a recorded
    reason it could not be derived; adapter classes transformers lacks are refused by class name."""
    _require_the_table_libraries()
    cands, remote = _generator()._tl_candidates()
    t = architecture_table()
    known = set(t["architectures"]) | set(t["refused"]) | set(DERIVED["not_derived"])
    missing = sorted({mt for mt, _arch, _ad in cands} - known)
    assert not missing
    assert set(remote) <= set(t["refused"])
    # the not-derived ones are few and each says why (the types themselves have standard V/O projections)
    assert len(DERIVED["not_derived"]) <= 6, DERIVED["not_derived"]


@pytest.mark.slow
def test_generated_table_is_what_the_installed_libraries_give():
    """scripts/derive_architectures.py --check, in-process: the committed JSON is regenerated bit for bit, and the
    process is left as it was (transformers' progress bars and verbosity, warning filters, logging)."""
    import logging

    from transformers.utils import logging as hf_logging

    _require_the_table_libraries()
    gen = _generator()
    before = (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity(), list(warnings.filters))
    disabled = logging.root.manager.disable
    assert gen.dumps(gen.generate()) == (ROOT / "src/tl_idempotence/data/architectures_derived.json").read_text()
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity(), list(warnings.filters)) == before
    assert logging.root.manager.disable == disabled


def test_file_route_imports_neither_transformer_lens_nor_transformers(tmp_path):
    """The derived table is data: resolving and reading a checkpoint imports no transformer_lens/transformers."""
    import subprocess
    import sys

    from helpers import llama_like

    d, _O, _V = llama_like(tmp_path / "ck")
    code = (
        "import sys, tl_idempotence as tli\n"
        f"rep = tli.idempotence_report({str(d)!r}, progress=False)\n"
        "bad = [m for m in ('transformer_lens', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(len(rep.heads))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) == 18
    assert math.isfinite(len(supported_architectures()))
