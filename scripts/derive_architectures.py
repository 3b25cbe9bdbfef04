"""Derive ``src/tl_idempotence/data/architectures_derived.json`` from the installed transformer-lens and transformers.

For every model type that has a TransformerBridge adapter in transformer-lens (and a class in transformers),
and for the extra encoders listed in :data:`EXTRA`:

1. build a tiny random model of the type (:func:`tl_idempotence.testing.tiny_model`) and save it with
   ``save_pretrained`` (safetensors, the on-disk tensor names real checkpoints have);
2. measure each head's value read ``V_h`` and output write ``O_h`` by running the model
   (:func:`tl_idempotence.testing.ov_by_forward`) in the first and last layer, with the value and output
   modules the adapter names;
3. find the saved tensor and layout that give exactly those ``V_h`` (every layout of the table is tried)
   and the tensor and layout that give ``O_h``; the layer template comes from their names;
4. find a norm applied to the attention output after ``W_O`` by the same forward pass
   (:func:`tl_idempotence.testing.post_norm_by_forward`);
5. read the saved checkpoint with the table entry through ``tl_idempotence``'s own file route and check
   every layer's O and V against the measured ones.

A type that fails a step is written under ``refused`` with the reason (the categories no entry can express
are named: encoder-decoder, no attention, multi-head latent attention, attention on only some layers, a
non-linear step between V and W_O). Config-dependent fused layouts (Falcon, GPTBigCode) are derived once per
variant in :data:`VARIANTS`.

    python scripts/derive_architectures.py            # rewrite the JSON
    python scripts/derive_architectures.py --check    # exit 1 if the committed JSON differs
    python scripts/derive_architectures.py --drift    # exit 1, naming each difference, if these libraries
                                                      # would change the table (the versions aside)

Needs transformer-lens 3.9 and transformers as pinned in constraints.txt (the JSON records the versions;
``scripts/update_constraints.py`` rewrites the pins and this table together). CI's unpinned stage runs ``--drift``
with the newest releases: the versions recorded aside, any difference is named with the command that adopts them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parents[1] / "src" / "tl_idempotence" / "data" / "architectures_derived.json"

#: Encoders without a TransformerBridge adapter: model type -> (class, layers path, value module, output module).
#: The names are given here; the layouts, the layer template and the post-norm are derived as for the others.
EXTRA: dict[str, tuple[str, str, str, str]] = {
    "roberta": ("RobertaModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "xlm-roberta": ("XLMRobertaModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "camembert": ("CamembertModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "electra": ("ElectraModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "data2vec-text": ("Data2VecTextModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "ernie": ("ErnieModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "roberta-prelayernorm": (
        "RobertaPreLayerNormModel",
        "encoder.layer",
        "attention.self.value",
        "attention.output.dense",
    ),
    "xlm-roberta-xl": ("XLMRobertaXLModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "megatron-bert": ("MegatronBertModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
    "mpnet": ("MPNetModel", "encoder.layer", "attention.attn.v", "attention.attn.o"),
    "exaone": ("LlamaForCausalLM", "model.layers", "self_attn.v_proj", "self_attn.o_proj"),
    "distilbert": ("DistilBertModel", "transformer.layer", "attention.v_lin", "attention.out_lin"),
    "deberta-v2": ("DebertaV2Model", "encoder.layer", "attention.self.value_proj", "attention.output.dense"),
    "modernbert": ("ModernBertModel", "layers", "attn.Wqkv", "attn.Wo"),
    "esm": ("EsmModel", "encoder.layer", "attention.self.value", "attention.output.dense"),
}

#: Config-dependent layouts: model type -> [(the config values a variant is chosen by, more tiny-model config)];
#: the first is the entry, the others its ``variants``. A variant matches the values a config holds (a field
#: absent from config.json matches nothing), and the first that matches wins: each variant is chosen by the
#: fields transformers itself decides on, in its order, and the entry is what transformers' defaults give.
VARIANTS: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {
    "falcon": [
        ({"new_decoder_architecture": False, "multi_query": True}, {}),
        # Falcon-40B/180B: grouped kv heads (num_kv_heads); transformers ignores multi_query (default True) here
        ({"new_decoder_architecture": True}, {}),
        ({"multi_query": False}, {"new_decoder_architecture": False, "num_kv_heads": 4}),  # Falcon-RW: MHA
    ],
    "gpt_bigcode": [({"multi_query": True}, {}), ({"multi_query": False}, {})],
}

#: Reasons for types whose derivation fails for a cause the steps cannot name themselves.
HAND_REFUSED: dict[str, str] = {
    "bitnet": (
        "BitNet quantizes its weights to ternary values at run time and normalizes the heads' outputs "
        "(attn_sub_norm) before W_O, so the stored V and O are not the head's linear map"
    ),
    "jetmoe": "mixture-of-attention-heads: each token's query and output heads are chosen by a router",
    "gemma4": "values are normalized per head (v_norm) after W_V, so the head's OV map is not linear",
    "gemma4_unified": "values are normalized per head (v_norm) after W_V, so the head's OV map is not linear",
    "gemma4_text": "values are normalized per head (v_norm) after W_V, so the head's OV map is not linear",
    "gemma3n": "values are normalized per head (v_norm) and later layers reuse earlier layers' keys and values",
    "laguna": "an input-dependent gate (g_proj) multiplies the heads' outputs before W_O",
    "afmoe": "an input-dependent gate (gate_proj) multiplies the heads' outputs before W_O",
}

V_LAYOUTS = ("linear", "fused_qkv", "neox_qkv", "conv1d_qkv", "grouped_qkv", "codegen_qkv")
O_LAYOUTS = ("linear", "conv1d")


class Underivable(Exception):
    """The type cannot be read as per-head V/O pairs (the message is the reason; ``structural``: the attention
    itself has no per-head linear V/O pair, else the derivation could not be run for it)."""

    def __init__(self, reason: str, structural: bool = True):
        super().__init__(reason)
        self.structural = structural


def _decode_v(W: torch.Tensor, layout: str, nq: int, nkv: int, dh: int, d: int) -> torch.Tensor:
    """``[n_kv, d, dh]`` from a stored value (or fused QKV) weight in ``layout`` (an independent reading of the
    layouts of ``tl_idempotence.sources.layouts``, used only to search; the entry is then checked through the
    library's own reader)."""
    if layout == "linear":
        return W.reshape(nkv, dh, d).transpose(1, 2)
    if layout == "fused_qkv":
        return W[(nq + nkv) * dh :].reshape(nkv, dh, d).transpose(1, 2)
    if layout == "neox_qkv":
        return W.reshape(nq, 3, dh, d)[:, 2].transpose(1, 2)
    if layout == "conv1d_qkv":
        return W[:, (nq + nkv) * dh :].reshape(d, nkv, dh).permute(1, 0, 2)
    if layout == "grouped_qkv":
        return W.reshape(nkv, nq // nkv + 2, dh, d)[:, -1].transpose(1, 2)
    if layout == "codegen_qkv":
        return W.reshape(4, 3, nq // 4, dh, d)[:, 1].reshape(nq, dh, d).transpose(1, 2)
    raise ValueError(layout)


def _decode_o(W: torch.Tensor, layout: str, nq: int, dh: int, d: int) -> torch.Tensor:
    if layout == "linear":
        return W.reshape(d, nq, dh).permute(1, 0, 2)
    return W.reshape(nq, dh, d).transpose(1, 2)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=1e-10, atol=1e-12))


def _text_config(cfg: Any) -> Any:
    sub = getattr(cfg, "text_config", None)
    return sub if sub is not None else cfg


def _layer_template(name: str, layer: int) -> tuple[str, str, str]:
    """``(root, template, suffix)`` of an on-disk tensor name of ``layer``: the first ``.<layer>.`` component
    is the layer index; the template keeps the path component before it (and ``encoder``/``decoder``
    before that); the rest of the prefix is the root the reader detects."""
    m = re.search(rf"(^|\.)({layer})\.", name)
    if not m:
        raise Underivable(f"the layer index {layer} is not a path component of {name!r}")
    pre, suf = name[: m.start(2)], name[m.end(2) + 1 :]
    comps = pre.rstrip(".").split(".")
    keep = 2 if len(comps) >= 2 and comps[-2] in ("encoder", "decoder") else 1
    root = ".".join(comps[:-keep])
    tpl = ".".join(comps[-keep:]) + ".{l}."
    return (root + "." if root else ""), tpl, suf


def derive(
    model_type: str, hf_class: str, layers: str, v_mod: str, o_mod: str, config: dict[str, Any], source: dict
) -> dict[str, Any]:
    """One table entry (see the module docstring), or :class:`Underivable`."""
    from safetensors import safe_open

    from tl_idempotence.core.heads import kv_layout
    from tl_idempotence.sources.architectures import sizes_from_config
    from tl_idempotence.sources.checkpoint import from_hf_dir
    from tl_idempotence.testing import ov_by_forward, post_norm_by_forward, tiny_model

    try:
        model = tiny_model(model_type, hf_class, **config)
    except Exception as e:
        raise Underivable(
            f"transformers cannot build a tiny {hf_class}: {type(e).__name__}: {str(e)[:160]}", structural=False
        ) from e
    text = _text_config(model.config)
    nq, n_layers = int(text.num_attention_heads), int(text.num_hidden_layers)
    with tempfile.TemporaryDirectory(prefix="tli-derive-") as td:
        model.save_pretrained(td)
        saved: dict[str, torch.Tensor] = {}
        for f in sorted(os.listdir(td)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(td, f), "pt") as st:
                    saved.update({k: st.get_tensor(k) for k in st.keys()})
        cfg_json = json.loads(Path(td, "config.json").read_text())
        mods = dict(model.named_modules())
        if f"{layers}.0" not in mods:  # the adapter's path below the base model (HubertForCTC: hubert.encoder...)
            found = [n[: -len(".0")] for n in mods if n.endswith(f".{layers}.0")]
            if len(found) == 1:
                layers = found[0]
        measured = {}
        for layer in sorted({0, n_layers - 1}):
            v_path, o_path = f"{layers}.{layer}.{v_mod}", f"{layers}.{layer}.{o_mod}"
            if v_path not in mods or o_path not in mods:
                raise Underivable(
                    f"attention on only some layers: layer {layer} has no {v_mod!r}/{o_mod!r} (a hybrid of attention "
                    "and state-space, convolution or linear-attention layers)"
                )
            try:
                measured[layer] = ov_by_forward(model, v_path, o_path, nq)
            except Exception as e:
                raise Underivable(
                    f"the forward-pass measurement failed: {type(e).__name__}: {str(e)[:160]}", structural=False
                ) from e
        V0, O0 = measured[0]
        d, dh = V0.shape[1], V0.shape[2]
        # 3. which saved tensor and layout give the measured V and O of layer 0
        v_hits, o_hits = [], []
        for name, W in saved.items():
            if W.ndim != 2 or not re.search(r"(^|\.)0\.", name):
                continue
            for nkv in [k for k in range(1, nq + 1) if nq % k == 0]:
                kv = kv_layout(nq, nkv)
                for lay in V_LAYOUTS:
                    if (lay in ("neox_qkv", "codegen_qkv") and nkv != nq) or (lay == "codegen_qkv" and nq % 4):
                        continue
                    try:
                        V = _decode_v(W.double(), lay, nq, nkv, dh, d)
                    except RuntimeError:
                        continue
                    if _close(V[kv], V0):
                        v_hits.append((name, lay, nkv))
            for lay in O_LAYOUTS:
                try:
                    if _close(_decode_o(W.double(), lay, nq, dh, d), O0):
                        o_hits.append((name, lay))
                except RuntimeError:
                    continue
        # layouts that read the same rows for this type (neox_qkv and grouped_qkv with one query head per kv
        # head, fused_qkv and grouped_qkv with one kv head): the first in V_LAYOUTS order, the simpler one
        v_hits = [h for i, h in enumerate(v_hits) if all(h[0] != g[0] or h[2] != g[2] for g in v_hits[:i])]
        if len(v_hits) != 1 or len(o_hits) != 1:
            raise Underivable(
                "no single saved tensor and layout reproduces the heads' measured "
                + ("values" if len(v_hits) != 1 else "output weights")
                + f" (V candidates {v_hits[:3]}, O candidates {o_hits[:3]}): a non-linear or input-dependent step "
                "between W_V and W_O, or a layout the table does not know"
            )
        (v_name, v_lay, nkv), (o_name, o_lay) = v_hits[0], o_hits[0]
        root, tpl, v_suf = _layer_template(v_name, 0)
        o_root, o_tpl, o_suf = _layer_template(o_name, 0)
        if (root, tpl) != (o_root, o_tpl):
            raise Underivable(f"V {v_name!r} and O {o_name!r} are not under one layer prefix")
        entry: dict[str, Any] = {
            "layer": tpl,
            "v": {"tensor": v_suf, "layout": v_lay},
            "o": {"tensor": o_suf, "layout": o_lay},
        }
        try:
            cfg_nkv = sizes_from_config(cfg_json, "config.json").n_kv_heads
        except Exception as e:
            raise Underivable(f"the config's sizes are not readable: {e}", structural=False) from e
        if config and nkv == 1 < nq:  # a multi-query variant: older configs of it do not say so in a size field
            cfg_nkv = -1
        if cfg_nkv != nkv:
            if nkv != 1:
                raise Underivable(f"the config gives {cfg_nkv} kv heads, the weights hold {nkv}")
            entry["n_kv_heads"] = 1
        # 4. a norm of the attention output after W_O
        norm = post_norm_by_forward(model, f"{layers}.0", f"{layers}.0.{o_mod}")
        if norm is not None:
            w = getattr(mods[f"{layers}.0.{norm}"], "weight", None)
            hits = [k for k, t in saved.items() if w is not None and t.shape == w.shape and torch.equal(t, w.detach())]
            hits = [k for k in hits if k.startswith(root + tpl.format(l=0))]
            if len(hits) != 1:
                raise Underivable(f"a norm ({norm}) follows W_O but its weight is not one saved tensor ({hits[:3]})")
            entry["post_attention_norm"] = hits[0][len(root + tpl.format(l=0)) :]
        # 5. the library's own reader on the saved checkpoint, every layer
        try:
            src = from_hf_dir(td, architecture=entry)
        except Exception as e:
            msg = str(e).replace(td, "<tiny checkpoint>")  # the JSON stays the same from run to run
            if "Missing tensor" in msg:
                raise Underivable(
                    "attention on only some layers (a hybrid of attention and state-space, convolution or "
                    "linear-attention layers): the file route reads every layer"
                ) from e
            raise Underivable(
                f"the file route refuses the tiny checkpoint: {type(e).__name__}: {msg[:200]}", structural=False
            ) from e
        if src.info.n_layers != n_layers:
            raise Underivable(f"the file route sees {src.info.n_layers} layers, the model has {n_layers}")
        for layer, (V, O) in measured.items():
            lh = src.layer_heads(layer)
            if not (_close(lh.O, O) and _close(lh.V[lh.kv_head_of], V)):
                raise Underivable(f"layer {layer}: the file route's O/V differ from the measured ones")
        if bool(norm) != bool(src.info.extra.get("post_attention_norm")):
            raise Underivable("the post-attention norm is not found in the saved files")
        entry["source"] = {**source, "hf_class": hf_class, "modules": {"layers": layers, "v": v_mod, "o": o_mod}}
        if config:
            entry["source"]["config"] = config
        return entry


def _tl_candidates() -> tuple[list[tuple[str, str, Any]], dict[str, str]]:
    """``[(model_type, hf_class, adapter class)]`` for every TL adapter class transformers builds, and
    ``{hf_class: reason}`` for adapter classes transformers does not have (remote code)."""
    import transformers
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    out, remote = [], {}
    for arch, adapter in SUPPORTED_ARCHITECTURES.items():
        cls = getattr(transformers, arch, None)
        if cls is None:
            remote[arch] = (
                f"{arch} is not built into transformers {version('transformers')} (remote code): no tiny model "
                f"can verify a layout for it (transformer-lens adapter {adapter.__name__})"
            )
            continue
        # a type whose config class saves another model_type (gpt-sw3 saves "gpt2") is that type's checkpoint
        types = [mt for mt, c in CONFIG_MAPPING.items() if c is cls.config_class and c.model_type == mt]
        for mt in types:
            out.append((mt, arch, adapter))
    return out, remote


def _adapter_names(model_type: str, arch: str, adapter: Any) -> tuple[str, str, str] | str:
    """``(layers path, value module, output module)`` from the adapter's component mapping, or a refusal."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources.transformers import map_default_transformer_lens_config
    from transformers import AutoConfig

    try:
        tl = map_default_transformer_lens_config(AutoConfig.for_model(model_type))
        bc = TransformerBridgeConfig.from_dict(dict(tl.__dict__))
        bc.architecture = arch
        mapping = adapter(bc).component_mapping
    except ImportError as e:
        return f"the transformer-lens adapter needs an optional package to be built ({str(e)[:120]})"
    blocks = mapping.get("blocks")
    if blocks is None:
        return (
            "encoder-decoder: separate encoder and decoder stacks (decoder layers also cross-attend); to measure "
            "one stack pass architecture={...} with its layer template"
        )
    attn = blocks.submodules.get("attn")
    if attn is None:
        return "no attention layers (a state-space or recurrent model)"
    subs = attn.submodules or {}
    if "kv_b_proj" in subs or "kv_a_proj_with_mqa" in subs:
        return (
            "multi-head latent attention (MLA): every head's values are read from a normalized shared latent "
            "(kv_a_proj, kv_a_layernorm, kv_b_proj), so there is no per-head linear V"
        )
    v = subs.get("qkv") or subs.get("v")
    if v is None or "o" not in subs:
        return f"the adapter names no value or output projection ({type(attn).__name__})"
    return blocks.name, f"{attn.name}.{v.name}", f"{attn.name}.{subs['o'].name}"


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Warnings, logging below ERROR and transformers' progress bars off while the table is derived, and every one
    of them as it was afterwards (the tests call :func:`generate` in-process: a bar or a warning filter left off
    would change what later tests see)."""
    import transformers

    hf = transformers.utils.logging
    level, verbosity, bars = logging.root.manager.disable, hf.get_verbosity(), hf.is_progress_bar_enabled()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        hf.set_verbosity_error()
        hf.disable_progress_bar()
        try:
            yield
        finally:
            logging.disable(level)
            hf.set_verbosity(verbosity)
            if bars:
                hf.enable_progress_bar()


def generate() -> dict[str, Any]:
    """The derived table (``architectures_derived.json``'s content), with the libraries quiet while it runs."""
    with _quiet_libraries():
        return _generate()


def _generate() -> dict[str, Any]:
    entries: dict[str, Any] = {}
    refused: dict[str, str] = {}
    not_derived: dict[str, str] = {}
    aliases: dict[str, str] = {}
    cands, remote = _tl_candidates()
    refused.update(remote)
    jobs: list[tuple[str, str, Any, dict[str, str]]] = []
    for mt, arch, adapter in cands:
        names = _adapter_names(mt, arch, adapter)
        if isinstance(names, str):
            refused.setdefault(mt, names)
            continue
        jobs.append((mt, arch, names, {"adapter": adapter.__name__}))
    for mt, (cls, layers, v, o) in EXTRA.items():
        jobs.append((mt, cls, (layers, v, o), {"names": "scripts/derive_architectures.py EXTRA"}))
    done: set[str] = set()
    for mt, arch, (layers, v, o), source in jobs:
        if mt in done:
            continue
        configs = VARIANTS.get(mt, [({}, {})])
        try:
            if mt in HAND_REFUSED:
                raise Underivable(HAND_REFUSED[mt])
            base = derive(mt, arch, layers, v, o, {**configs[0][0], **configs[0][1]}, source)
            variants = []
            for match, extra in configs[1:]:
                e = derive(mt, arch, layers, v, o, {**match, **extra}, source)
                var = {"config": match, "v": e["v"], "o": e["o"]}
                for k in ("n_kv_heads", "post_attention_norm"):  # null: not in this variant, whatever the base says
                    if k in e or k in base:
                        var[k] = e.get(k)
                variants.append(var)
            if variants:
                base["variants"] = variants
                base["source"]["variant_configs"] = [{**m, **x} for m, x in configs[1:]]
            entries[mt] = base
            refused.pop(mt, None)
            aliases.setdefault(arch, mt)
            done.add(mt)
            print(f"ok      {mt:24s} {base['layer']}{base['v']['tensor']} ({base['v']['layout']})", file=sys.stderr)
        except Underivable as e:
            (refused if e.structural else not_derived)[mt] = str(e)
            done.add(mt)
            print(f"{'refused' if e.structural else 'not derived'} {mt:24s} {e}", file=sys.stderr)
    owners: dict[str, set[str]] = {}
    for _mt, arch, _names, _src in jobs:
        owners.setdefault(arch, set()).add(_mt)
    aliases = {a: mt for a, mt in aliases.items() if a not in entries and len(owners.get(a, ())) == 1}
    return {
        "_generated": {
            "by": "scripts/derive_architectures.py",
            "transformer_lens": version("transformer-lens"),
            "transformers": version("transformers"),
        },
        "architectures": dict(sorted(entries.items())),
        "aliases": dict(sorted(aliases.items())),
        "refused": dict(sorted(refused.items())),
        "not_derived": dict(sorted(not_derived.items())),
    }


def dumps(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1, sort_keys=False) + "\n"


#: The libraries whose versions a table's texts quote (a refusal names "transformers 5.24.0"): ignored by --drift.
_VERSIONED = re.compile(r"\b(transformers|transformer-lens|transformer_lens) v?\d+(\.\d+)*\S*")


def _content(table: dict[str, Any]) -> dict[str, Any]:
    """A table without its ``_generated`` record and with library versions in its texts blanked."""
    body = {k: v for k, v in table.items() if k != "_generated"}
    return json.loads(_VERSIONED.sub(r"\1 <version>", json.dumps(body)))


def drift(committed: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """The entries of ``derived`` that differ from ``committed``, one line each, versions aside (empty: no drift).

    A line names the section and the model type or class: ``architectures['falcon']: was an entry (...); now
    absent``, ``refused['falcon']: new: the config gives 2 kv heads, the weights hold 4``.
    """

    def short(v: Any) -> str:
        text = json.dumps(v) if not isinstance(v, str) else v
        return text if len(text) <= 160 else text[:157] + "..."

    old, new = _content(committed), _content(derived)
    lines = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if key not in b:
                lines.append(f"{section}[{key!r}]: removed (was {short(a[key])})")
            elif key not in a:
                lines.append(f"{section}[{key!r}]: new: {short(b[key])}")
            elif isinstance(a[key], dict) and isinstance(b[key], dict):  # an entry: the fields that changed
                fields = sorted(k for k in set(a[key]) | set(b[key]) if a[key].get(k) != b[key].get(k))
                if fields:
                    changed = "; ".join(f"{k} was {short(a[key].get(k))}, now {short(b[key].get(k))}" for k in fields)
                    lines.append(f"{section}[{key!r}]: {changed}")
            elif a[key] != b[key]:
                lines.append(f"{section}[{key!r}]: was {short(a[key])}; now {short(b[key])}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing it")
    ap.add_argument(
        "--drift",
        action="store_true",
        help="name every difference these libraries make to the committed table, versions aside (exit 1 if any)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    table = generate()
    if args.drift:
        committed = json.loads(args.out.read_text())
        was, now = committed.get("_generated", {}), table["_generated"]
        libs = ("transformer_lens", "transformers")
        lines = drift(committed, table)
        if not lines:
            print(
                "no drift: the architecture table derived with "
                + ", ".join(f"{k} {now[k]}" for k in libs)
                + " equals the committed one (derived with "
                + ", ".join(f"{k} {was.get(k)}" for k in libs)
                + "), versions aside"
            )
            return 0
        print(
            f"DRIFT: {len(lines)} entr{'y' if len(lines) == 1 else 'ies'} of the architecture table differ when it is "
            "derived with "
            + ", ".join(f"{k} {now[k]}" for k in libs)
            + " (the committed table: "
            + ", ".join(f"{k} {was.get(k)}" for k in libs)
            + "):"
        )
        for line in lines:
            print(f"  {line}")
        print(
            "constraints.txt keeps CI's main stage and the README on the tested versions. To adopt the new releases: "
            "`python scripts/update_constraints.py` (rewrites constraints.txt, constraints-tl4.txt and this table), "
            "fix what the tests then show, and commit them together (CONTRIBUTING.md, 'Updating the pinned versions')."
        )
        return 1
    text = dumps(table)
    if args.check:
        same = args.out.read_text() == text
        print("architectures_derived.json is " + ("up to date" if same else "OUT OF DATE: rerun the script"))
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
