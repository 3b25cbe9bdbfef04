"""Shared test helpers: the dense float64 reference and synthetic checkpoint writers.

* Dense reference (test-only): materializes T = O Vᵀ and T² (column form); every test that
  checks a factored computation compares against these functions.
* Checkpoint writers: safetensors directories with real tensor names and layouts.
* Heads with known geometry (``head_with``, ``closed_head_for``, ...) and ``SyntheticSource``.
* ``Interrupting``: a HeadSource that dies at a chosen layer and counts what it read.
* ``LINEAGE_KW``: the training arguments of the session lineage (``conftest.lineage``).
* Exact references written out here: ``dense_check`` (a searched K), ``mannwhitney_exact_p``, ``bh_list``.
* Saved results: ``frames_identical`` / ``assert_same_value`` (bit for bit), ``canonical_digest``,
  ``rewrite_record`` / ``rewrite_saved`` (an edit with every sha256 and the digest recomputed).
* Headless Chromium: ``CHROMIUM_FLAGS``, ``require_chromium``, ``run_chromium``.

Tests import this module (``from helpers import ...``; tests/conftest.py puts tests/ on the
path); test modules never import each other.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from safetensors.torch import save_file

from tl_idempotence.core.heads import LayerHeads, ModelInfo


def dense_T(O: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """T = O Vᵀ, [..., d_model, d_model], float64."""
    return O.double() @ V.double().transpose(-1, -2)


def dense_closure(O: torch.Tensor, V: torch.Tensor) -> dict:
    """alpha, P, norms from materialized T and T² (SPEC section 2)."""
    T = dense_T(O, V)
    T2 = T @ T
    inner = (T2 * T).sum((-1, -2))
    nT = T.pow(2).sum((-1, -2)).sqrt()
    nT2 = T2.pow(2).sum((-1, -2)).sqrt()
    alpha = inner / nT**2
    P = inner**2 / (nT2**2 * nT**2)
    return {"alpha": alpha, "P": P, "norm": nT, "norm_T2": nT2, "inner": inner, "T": T, "T2": T2}


def principal_cosines(O: torch.Tensor, V: torch.Tensor) -> np.ndarray:
    """Cosines of principal angles between span(V) and span(O), descending (scipy)."""
    ang = scipy.linalg.subspace_angles(V.double().numpy(), O.double().numpy())
    return np.sort(np.cos(ang))[::-1]


def oblique_projection(d: int, r: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, V) with O Vᵀ = A (B A)^{-1} B, an exact oblique projection (P = 1, α = 1)."""
    A = torch.randn(d, r, generator=gen, dtype=torch.float64)
    B = torch.randn(r, d, generator=gen, dtype=torch.float64)
    O = A @ torch.linalg.inv(B @ A)
    V = B.T.contiguous()
    return O, V


ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_sparse_shard(
    path: Path, specs: dict[str, tuple[list[int], str]], tensors: dict[str, torch.Tensor] | None = None
) -> int:
    """A safetensors file whose ``specs`` tensors are all-zero holes (no disk, no write time).

    The safetensors format (8-byte little-endian header length, JSON header with
    ``dtype``/``shape``/``data_offsets``, then data) is written by hand only because the
    library needs every tensor in memory; ``tensors`` (real data) are written at their
    offsets, the rest of the data region is left as a sparse hole. Returns the file size.
    """
    size_of = {"F32": 4, "BF16": 2, "F16": 2}
    tensors = tensors or {}
    entries = {**{n: (list(t.shape), ST_DTYPES[t.dtype]) for n, t in tensors.items()}, **specs}
    header, off = {}, 0
    for name, (shape, dt) in entries.items():
        n = int(np.prod(shape)) * size_of[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    start = 8 + len(hb)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for name, t in tensors.items():
            f.seek(start + header[name]["data_offsets"][0])
            f.write(t.contiguous().view(torch.uint8).numpy().tobytes())
        f.truncate(start + off)
    return start + off


def write_checkpoint(
    d: Path,
    config: dict,
    tensors: dict[str, torch.Tensor],
    n_shards: int = 3,
    sparse: dict[str, tuple[list[int], str]] | None = None,
) -> Path:
    """config.json + ``n_shards`` safetensors shards (round robin) + index; optional sparse shard."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    names = list(tensors)
    total = n_shards + (1 if sparse else 0)
    weight_map = {}
    for i in range(n_shards):
        fname = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[i::n_shards]}
        save_file(part, str(d / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    if sparse:
        fname = f"model-{total:05d}-of-{total:05d}.safetensors"
        write_sparse_shard(d / fname, sparse)
        weight_map.update({n: fname for n in sparse})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def random_heads(n_layers, nq, nkv, dm, dh, seed=0):
    g = torch.Generator().manual_seed(seed)
    O = [torch.randn(nq, dm, dh, generator=g) / dm**0.5 for _ in range(n_layers)]
    V = [torch.randn(nkv, dm, dh, generator=g) / dm**0.5 for _ in range(n_layers)]
    return O, V, g


def llama_like(
    d: Path, model_type="llama", n_layers=3, nq=6, nkv=2, dm=48, dh=8, dtype=torch.float32, n_experts=0, **kw
) -> tuple[Path, list, list]:
    """Llama/Qwen3(-MoE) names: model.layers.{l}.self_attn.{q,k,v,o}_proj.weight (+ MLP or experts)."""
    O, V, g = random_heads(n_layers, nq, nkv, dm, dh)
    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(50, dm, generator=g),
        "model.norm.weight": torch.ones(dm),
        "lm_head.weight": torch.randn(50, dm, generator=g),
    }
    for l in range(n_layers):
        p = f"model.layers.{l}."
        t[p + "self_attn.q_proj.weight"] = torch.randn(nq * dh, dm, generator=g)
        t[p + "self_attn.k_proj.weight"] = torch.randn(nkv * dh, dm, generator=g)
        t[p + "self_attn.v_proj.weight"] = V[l].transpose(1, 2).reshape(nkv * dh, dm)
        t[p + "self_attn.o_proj.weight"] = O[l].permute(1, 0, 2).reshape(dm, nq * dh)
        t[p + "input_layernorm.weight"] = torch.ones(dm)
        if n_experts:
            t[p + "mlp.gate.weight"] = torch.randn(n_experts, dm, generator=g)
            for e in range(n_experts):
                for w, shp in (("gate_proj", (16, dm)), ("up_proj", (16, dm)), ("down_proj", (dm, 16))):
                    t[p + f"mlp.experts.{e}.{w}.weight"] = torch.randn(*shp, generator=g)
        else:
            t[p + "mlp.down_proj.weight"] = torch.randn(dm, 2 * dm, generator=g)
    t = {k: v.to(dtype) for k, v in t.items()}
    cfg = {
        "model_type": model_type,
        "architectures": ["X"],
        "hidden_size": dm,
        "num_attention_heads": nq,
        "num_key_value_heads": nkv,
        "num_hidden_layers": n_layers,
        "head_dim": dh,
        "torch_dtype": str(dtype),
    }
    return write_checkpoint(d, cfg, t, **kw), O, V


def neox_like(d: Path, n_layers=2, nq=4, dm=32) -> tuple[Path, list, list]:
    """GPT-NeoX: gpt_neox.layers.{l}.attention.query_key_value.weight, per head [q; k; v] interleaved."""
    dh = dm // nq
    O, V, g = random_heads(n_layers, nq, nq, dm, dh)
    t = {"gpt_neox.embed_in.weight": torch.randn(50, dm, generator=g)}
    for l in range(n_layers):
        p = f"gpt_neox.layers.{l}.attention."
        q = torch.randn(nq, dh, dm, generator=g)
        k = torch.randn(nq, dh, dm, generator=g)
        qkv = torch.stack([q, k, V[l].transpose(1, 2)], dim=1)  # [n_heads, 3, d_head, d_model]
        t[p + "query_key_value.weight"] = qkv.reshape(3 * nq * dh, dm)
        t[p + "query_key_value.bias"] = torch.randn(3 * nq * dh, generator=g)
        t[p + "dense.weight"] = O[l].permute(1, 0, 2).reshape(dm, nq * dh)
    cfg = {"model_type": "gpt_neox", "hidden_size": dm, "num_attention_heads": nq, "num_hidden_layers": n_layers}
    return write_checkpoint(d, cfg, t, n_shards=2), O, V


def gpt2_like(d: Path, n_layers=2, nq=4, dm=32) -> tuple[Path, list, list]:
    """GPT-2: transformer.h.{l}.attn.c_attn.weight Conv1D [d_model, 3 d_model]; c_proj Conv1D [d_model, d_model]."""
    dh = dm // nq
    O, V, g = random_heads(n_layers, nq, nq, dm, dh)
    t = {"transformer.wte.weight": torch.randn(50, dm, generator=g)}
    for l in range(n_layers):
        p = f"transformer.h.{l}.attn."
        qk = torch.randn(dm, 2 * dm, generator=g)
        t[p + "c_attn.weight"] = torch.cat([qk, V[l].permute(1, 0, 2).reshape(dm, nq * dh)], dim=1)
        t[p + "c_proj.weight"] = O[l].transpose(1, 2).reshape(nq * dh, dm)  # y = z @ W: rows = head inputs
        t[f"transformer.h.{l}.mlp.c_fc.weight"] = torch.randn(dm, 4 * dm, generator=g)
    cfg = {"model_type": "gpt2", "n_embd": dm, "n_head": nq, "n_layer": n_layers}
    return write_checkpoint(d, cfg, t, n_shards=2), O, V


def kv_head_of(h: int, nq: int, nkv: int) -> int:
    """The kv head query head ``h`` reads, written from the definition (not the package's kv_layout):
    GQA groups are contiguous, as transformers' ``repeat_kv`` expands them (query heads
    ``g * nq/nkv .. (g+1) * nq/nkv - 1`` share kv head ``g``); MHA is the identity, MQA all zero."""
    assert nq % nkv == 0, (nq, nkv)
    return h // (nq // nkv)


def expected_heads(O, V, nq, nkv):
    """Per-head P and α of every layer from first principles: T = O_h V_{kv(h)}ᵀ materialized in float64 from
    the raw tensors (dense_closure), the kv map from its definition (kv_head_of); no package function."""
    P, alpha = [], []
    for l in range(len(O)):
        for h in range(nq):
            ref = dense_closure(O[l][h].double(), V[l][kv_head_of(h, nq, nkv)].double())
            P.append(float(ref["P"]))
            alpha.append(float(ref["alpha"]))
    return np.array(P), np.array(alpha)


def assert_matches(rep, O, V, nq, nkv):
    """The report's per-head P and α equal :func:`expected_heads` (dense float64, independent of the package)."""
    P, alpha = expected_heads(O, V, nq, nkv)
    h = rep.heads
    assert list(zip(h["layer"], h["head"], strict=True)) == [(l, q) for l in range(len(O)) for q in range(nq)]
    np.testing.assert_allclose(h["P"].to_numpy(), P, rtol=0, atol=1e-10)
    np.testing.assert_allclose(h["alpha"].to_numpy(), alpha, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- heads with known geometry

F64 = torch.float64


def head_with(S, cos, d, gen, R1=None, R2=None):
    """(O, V) column form with Q_Vᵀ Q_O = diag(cos) and K = R1 diag(S) R2ᵀ (T = Q_O K Q_Vᵀ)."""
    r = len(S)
    E, _ = torch.linalg.qr(torch.randn(d, 2 * r, generator=gen, dtype=F64))
    E1, E2 = E[:, :r], E[:, r:]
    cos = torch.as_tensor(cos, dtype=F64)
    Q_V = E1
    Q_O = E1 * cos + E2 * (1 - cos**2).clamp_min(0).sqrt()
    R1 = torch.eye(r, dtype=F64) if R1 is None else R1
    R2 = torch.eye(r, dtype=F64) if R2 is None else R2
    K = (R1 * torch.as_tensor(S, dtype=F64)) @ R2.T
    return Q_O @ K, Q_V


def closed_head_for(V, cos, gen):
    """O such that T = O Vᵀ = Q_O diag(1/cos) Q_Vᵀ (an oblique projection, P = 1, α = 1) with the
    principal cosines ``cos`` between span(O) and span(V): well-conditioned when cos is not small."""
    d, r = V.shape
    Q_V, _ = torch.linalg.qr(V)
    E = torch.randn(d, r, generator=gen, dtype=F64)
    E2, _ = torch.linalg.qr(E - Q_V @ (Q_V.T @ E))
    cos = torch.as_tensor(cos, dtype=F64)
    Q_O = Q_V * cos + E2 * (1 - cos**2).sqrt()
    T = (Q_O / cos) @ Q_V.T
    return T @ V @ torch.linalg.inv(V.T @ V)


def principal_bases(O, V):
    """Test-side principal coordinates: orthonormal Q_O [d, rank_O], Q_V [d, rank_V] with Q_Vᵀ Q_O = diag."""
    Q_O0 = torch.from_numpy(scipy.linalg.orth(O.numpy(), rcond=1e-9))
    Q_V0 = torch.from_numpy(scipy.linalg.orth(V.numpy(), rcond=1e-9))
    U, sig, Wh = torch.linalg.svd(Q_V0.T @ Q_O0)
    return Q_O0 @ Wh.T, Q_V0 @ U, sig


def pair(O, V):
    """TL row form (W_V, W_O) from the column form."""
    return V, O.transpose(-1, -2)


class SyntheticSource:
    """A minimal HeadSource over given LayerHeads (no TransformerLens)."""

    def __init__(self, lhs, name="synthetic"):
        self._lhs = {lh.layer: lh for lh in lhs}
        lh0 = lhs[0]
        self.info = ModelInfo(
            model_name=name,
            model_class="SyntheticSource",
            n_layers=len(lhs),
            n_heads=lh0.n_heads,
            n_kv_heads=lh0.n_kv_heads,
            d_model=lh0.d_model,
            d_head=lh0.d_head,
        )

    def layers(self):
        return iter(self._lhs)

    def layer_heads(self, layer):
        return self._lhs[layer]

    def __iter__(self):
        return iter(self._lhs.values())


def gaussian_layer(layer, n_heads, n_kv, d, r, seed):
    g = torch.Generator().manual_seed(seed)
    O = torch.randn(n_heads, d, r, generator=g, dtype=F64)
    V = torch.randn(n_kv, d, r, generator=g, dtype=F64)
    return LayerHeads(layer, O, V, torch.tensor([kv_head_of(h, n_heads, n_kv) for h in range(n_heads)]))


def dense_closure_T(T):
    T2 = T @ T
    inner = (T2 * T).sum()
    return inner**2 / ((T2 * T2).sum() * (T * T).sum())


#: Training arguments of the tiny lineage shared by tests/integration/studies and tests/integration/test_demos.py
#: (``conftest.lineage``; ``train_lineage`` reuses a finished lineage with the same arguments).
LINEAGE_KW = dict(steps=200, save_steps=(0, 20, 40, 60, 100, 200))


class Interrupting:
    """A HeadSource that dies on reading layer ``stop_at`` and counts the layers it read."""

    def __init__(self, src, stop_at=None):
        self.src, self.stop_at, self.read = src, stop_at, []
        self.info = src.info

    def layers(self):
        return self.src.layers()

    def layer_heads(self, layer):
        if layer == self.stop_at:
            raise KeyboardInterrupt(f"killed at layer {layer}")
        self.read.append(layer)
        return self.src.layer_heads(layer)

    def __iter__(self):
        return (self.layer_heads(l) for l in self.layers())


# --------------------------------------------------------------------------- GGUF files with chosen metadata


def write_gguf_file(path: Path, O, V, *, meta=None, drop=(), tensors=None, post_norm=False, arch="llama") -> Path:
    """A GGUF file with llama.cpp names: ``blk.{l}.attn_v`` / ``attn_output`` (F32) and ``ffn_norm`` per layer.

    ``meta`` overrides or adds metadata (int -> uint32, negative int -> int32, float -> float32, bool,
    str, list -> array), ``drop`` leaves keys out (also ``general.architecture``), ``tensors`` adds
    more tensors, ``post_norm`` adds ``blk.{l}.post_attention_norm.weight`` (Gemma-2/OLMo-2 style).
    """
    import gguf

    nq, dm, dh = O[0].shape
    nkv = V[0].shape[0]
    w = gguf.GGUFWriter(str(path), arch)
    kv = {
        f"{arch}.block_count": len(O),
        f"{arch}.embedding_length": dm,
        f"{arch}.attention.head_count": nq,
        f"{arch}.attention.head_count_kv": nkv,
        f"{arch}.attention.key_length": dh,
        **(meta or {}),
    }
    for k in drop:
        kv.pop(k, None)
        w.kv_data[0].pop(k, None)
    for k, v in kv.items():
        w.kv_data[0].pop(k, None)  # the writer adds general.architecture itself
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            (w.add_uint32 if v >= 0 else w.add_int32)(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, list(v))
    for l in range(len(O)):
        w.add_tensor(f"blk.{l}.attn_v.weight", V[l].transpose(1, 2).reshape(nkv * dh, dm).numpy().copy())
        w.add_tensor(f"blk.{l}.attn_output.weight", O[l].permute(1, 0, 2).reshape(dm, nq * dh).numpy().copy())
        w.add_tensor(f"blk.{l}.ffn_norm.weight", np.ones(dm, np.float32))
        if post_norm:
            w.add_tensor(f"blk.{l}.post_attention_norm.weight", np.ones(dm, np.float32))
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run_unprivileged(fn) -> None:
    """Run ``fn()`` as this user, or, when the tests run as root (CI does), in a forked child that has dropped
    to the unprivileged uid/gid 65534 ("nobody"), so that file modes mean what they mean for a user: root
    reads and lists anything, which would make a permission test skip (and CI accepts no silent skip).
    An exception in the child is re-raised here as AssertionError with the child's traceback."""
    import os
    import traceback

    if os.geteuid() != 0:
        fn()
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, run, report through the pipe, never return into pytest
        os.close(r)
        code = 0
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            fn()
        except BaseException:
            os.write(w, traceback.format_exc().encode())
            code = 1
        os.close(w)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(f"in the unprivileged child (uid 65534):\n{out}")


def world_traversable_dir(prefix: str = "tli-perm-") -> Path:
    """A fresh folder under the system temp dir that the unprivileged user of :func:`run_unprivileged` can
    reach (pytest's tmp_path of root is mode 0700). The caller removes it."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=prefix))
    d.chmod(0o755)
    return d


def hooked_or_skip(tiny_dir):
    """``tl_idempotence.testing.hooked_from_dir(tiny_dir)``, or a skip on transformer-lens 4.x (no HookedTransformer;
    a skip CI accepts there: tests/ci_skips.py ``CI_ALLOWED_SKIPS``)."""
    from tl_idempotence.testing import hooked_from_dir

    try:
        return hooked_from_dir(tiny_dir)
    except ImportError as e:
        pytest.skip(f"transformer-lens 4.x has no HookedTransformer: {e}")


#: The job-array index variables a sweep task reads (tests clear them: the machine's own must not leak in).
ARRAY_INDEX_VARIABLES = ("SLURM_ARRAY_TASK_ID", "PBS_ARRAY_INDEX", "PBS_ARRAYID", "LSB_JOBINDEX", "SGE_TASK_ID")


def closed_pairs_layers(alpha: tuple[float, float] = (0.5, -0.5), zero_l1h5: bool = False) -> list[LayerHeads]:
    """Two layers of 6 heads (d_model 16, d_head 4, seed 3): heads 0-1 of each layer closed exactly (T = α times a
    projection, ``alpha[layer]``: P = 1), the others random; with ``zero_l1h5`` head 5 of layer 1 is zero (P
    undefined: a NaN p-value). The head-roles and circuit tests' construction (α = ±0.5), and the outputs' and
    q-values' (α = 1, L1H5 zero)."""
    from tl_idempotence.core.heads import kv_layout

    g = torch.Generator().manual_seed(3)
    out = []
    for layer in range(2):
        V = torch.randn(6, 16, 4, generator=g, dtype=torch.float64) / 4
        O = torch.randn(6, 16, 4, generator=g, dtype=torch.float64) / 4
        for h in (0, 1):
            V[h] = torch.linalg.qr(V[h]).Q
            O[h] = alpha[layer] * V[h]
        if zero_l1h5 and layer == 1:
            O[5] = 0.0
        out.append(LayerHeads(layer, O, V, kv_layout(6, 6)))
    return out


def fake_roles(rep, **cols):
    """A HeadRoles of ``rep``'s heads with the given score columns (no model run): for the association tests."""
    from tl_idempotence.probes.roles import HeadRoles

    t = rep.heads[["layer", "head", "kv_head"]].copy()
    for k, v in cols.items():
        t[k] = v
    t["reason"] = ""
    return HeadRoles(
        table=t,
        summary={"model_name": rep.info.model_name, "layer_fingerprints": report_fingerprints(rep)},
        info=rep.info,
    )


def report_fingerprints(rep) -> dict[str, str]:
    """``{"layer": sha256}`` of the layers ``rep`` measured: what a HeadRoles of its model records (roles made by
    hand without them are refused by every join)."""
    layers = rep.layers
    return {str(int(a)): str(b) for a, b in zip(layers["layer"], layers["fingerprint"])}


def mixed_lineage(root: Path, n_layers: int = 4) -> dict:
    """Four sharded llama-like checkpoints under ``root``: A (step 0), B (step 1: every o_proj changed), C (a byte copy
    of B), D (B with A's shard holding layer 0's o_proj: its layers come partly from A, partly from B); ``from_A``
    is the set of D's layers whose o_proj is A's. The trajectory-integrity tests' construction."""
    import shutil

    from safetensors.torch import load_file

    def index_of(d: Path) -> dict[str, str]:
        return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]

    A, _, _ = llama_like(root / "A", n_layers=n_layers, nq=6, nkv=2, dm=32, dh=4, n_shards=4)
    B = root / "B"
    shutil.copytree(A, B)
    for shard in sorted(set(index_of(B).values())):  # every o_proj of B changed
        t = load_file(str(B / shard))
        for name in list(t):
            if name.endswith("o_proj.weight"):
                t[name] = (0.5 * t[name] + 0.02).contiguous()
        save_file(t, str(B / shard), metadata={"format": "pt"})
    C = root / "C"
    shutil.copytree(B, C)
    D = root / "D"
    shutil.copytree(B, D)
    wm = index_of(A)
    shard = wm["model.layers.0.self_attn.o_proj.weight"]
    shutil.copyfile(A / shard, D / shard)
    from_A = {l for l in range(n_layers) if wm[f"model.layers.{l}.self_attn.o_proj.weight"] == shard}
    assert 0 < len(from_A) < n_layers  # the tests need a genuinely mixed checkpoint
    return {"A": A, "B": B, "C": C, "D": D, "from_A": from_A}


#: The ablation tests' tiny model: head L1H4's W_O is zeroed in its checkpoint (ablation_tiny_dir).
ABLATION_ZERO_HEAD = (1, 4)
#: 6 windows of 24 token ids: BOS (id 1) then ordinary tokens (ids 4..99; 0..3 are the tiny tokenizer's specials).
ABLATION_TOKENS = torch.cat(
    [torch.ones(6, 1, dtype=torch.long), torch.randint(4, 100, (6, 23), generator=torch.Generator().manual_seed(0))], 1
)


def edit_safetensors(path: Path, fn) -> None:
    """Apply ``fn`` to the tensors of ``path/model.safetensors`` (a dict, edited in place) and save them back."""
    from safetensors.torch import load_file

    f = path / "model.safetensors"
    t = load_file(f)
    fn(t)
    save_file(t, str(f), metadata={"format": "pt"})


def ablation_tiny_dir(root: Path) -> Path:
    """Llama/GQA (2 layers, 9 heads on 3 kv heads, d_head 8) with head ABLATION_ZERO_HEAD's W_O zeroed in the HF
    weights: the ablation tests' model."""
    from tl_idempotence.testing import tiny_hf_dir

    d = tiny_hf_dir(root / "tiny", n_layers=2)
    layer, head = ABLATION_ZERO_HEAD

    def zero(t):
        W = t[f"model.layers.{layer}.self_attn.o_proj.weight"]  # [d_model, n_heads * d_head]: head h = columns h*8..
        W[:, head * 8 : (head + 1) * 8] = 0.0

    edit_safetensors(d, zero)
    return d


def losses_with(model, hooks, toks, counted, batch_size=8):
    """The loss as ablation computes it (same batches), with the given hooks."""
    from tl_idempotence.probes.ablation import next_token_loss

    total, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(toks), batch_size):
            logits = model.run_with_hooks(toks[s : s + batch_size], fwd_hooks=hooks, return_type="logits")
            a, b = next_token_loss(logits, toks[s : s + batch_size], counted[s : s + batch_size])
            total += a
            n += b
    return total / n


def reference_losses(model, toks, counted, sets, kind):
    """One forward pass per head set over all windows (the unbatched computation): the loss of each set."""
    layers = sorted({layer for st in sets for layer in st})
    means = {}
    if kind == "mean":
        with torch.no_grad():
            _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith("attn.hook_z"))
        for layer in layers:
            z = cache[f"blocks.{layer}.attn.hook_z"].double()  # [batch, pos, n_heads, d_head]
            means[layer] = z[counted].mean(0)

    def hook_for(layer, hs):
        def hook(z, hook):
            z = z.clone()
            z[:, :, hs] = means[layer][hs].to(z.dtype) if kind == "mean" else 0.0
            return z

        return (f"blocks.{layer}.attn.hook_z", hook)

    return [losses_with(model, [hook_for(layer, hs) for layer, hs in st.items()], toks, counted) for st in sets]


def identity_checkpoints(root: Path) -> dict[str, Path]:
    """The sweep-identity tests' checkpoints under ``root``: A (llama-like), B and C (gpt2-like, 2 and 3 layers),
    and two copies of A under one folder name (seed1/step200, seed2/step200) whose layer 1 values differ."""
    import shutil

    from safetensors.torch import load_file, save_file

    a = Path(llama_like(root / "ckA")[0])
    s1 = root / "seed1" / "step200"
    s2 = root / "seed2" / "step200"
    shutil.copytree(a, s1)
    shutil.copytree(a, s2)
    name = "model.layers.1.self_attn.v_proj.weight"
    shard = next(f for f in s2.glob("*.safetensors") if name in load_file(f))
    tensors = load_file(shard)
    tensors[name] = tensors[name] * 1.5 + 0.01
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return {
        "A": a,
        "B": Path(gpt2_like(root / "ckB")[0]),
        "C": Path(gpt2_like(root / "ckC", n_layers=3)[0]),
        "s1": s1,
        "s2": s2,
    }


def haar_head(S, cos, d, seed):
    """``head_with(S, cos, d, ...)`` with Haar-random rotations drawn from ``seed``."""
    from tl_idempotence.core.random import haar_orthogonal

    g = torch.Generator().manual_seed(seed)
    R1, R2 = haar_orthogonal(2, len(S), g)
    return head_with(S, cos, d, g, R1, R2)


def stack_heads(heads):
    """[(O, V), ...] -> (O stacked, V stacked)."""
    return torch.stack([h[0] for h in heads]), torch.stack([h[1] for h in heads])


def dense_check(O, V, K):
    """Dense float64 P of T = Q_O K Q_Vᵀ built from test-side principal bases of (O, V)."""
    Q_O, Q_V, _ = principal_bases(O, V)
    rO, rV = Q_O.shape[1], Q_V.shape[1]
    assert float(K[rO:].abs().sum()) == 0 and float(K[:, rV:].abs().sum()) == 0
    return float(dense_closure_T(Q_O @ K[:rO, :rV] @ Q_V.T))


def frames_identical(a, b, name: str = "frame") -> None:
    """Same columns, dtypes, index and values, floats bit for bit (NaN payloads included)."""
    import pandas as pd

    pd.testing.assert_frame_equal(a, b, check_exact=True, check_dtype=True, obj=name)
    for col in a.columns:
        if a[col].dtype.kind == "f":
            assert a[col].to_numpy().tobytes() == b[col].to_numpy().tobytes(), f"{name}.{col}"


def assert_same_value(a, b, where: str = "summary") -> None:
    """Equal values of the same types, dict keys in the same order, floats bit for bit (NaN included)."""
    import struct

    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same_value(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def canonical_digest(rec: dict) -> str:
    """sha256 of a saved record's canonical JSON (sorted keys, no spaces, no NaN), its ``digest`` left out."""
    import hashlib

    body = {k: v for k, v in rec.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()).hexdigest()


def rewrite_record(folder: Path, edit, digest: bool = True) -> None:
    """Edit a saved report's report.json; with ``digest``, recompute its digest the way a careless script (or an
    adversary) would, so only the consistency checks can catch the edit."""
    from tl_idempotence.report.store import RECORD

    f = folder / RECORD
    rec = json.loads(f.read_text())
    edit(rec)
    if digest:
        rec["digest"] = canonical_digest(rec)
    f.write_text(json.dumps(rec, indent=1))


def rewrite_saved(folder: Path, record: str, table: str | None = None, edit_table=None, edit_record=None) -> Path:
    """Edit a saved result's folder as an adversary would: ``edit_table(df) -> df`` on ``table``.parquet and/or
    ``edit_record(rec)`` on the JSON ``record``, every sha256 and the digest recomputed, so only the loader's own
    consistency checks can catch the edit. Returns the record's path."""
    import hashlib

    import pandas as pd

    f = folder / record
    rec = json.loads(f.read_text())
    if edit_table is not None:
        assert table is not None
        path = folder / f"{table}.parquet"
        edit_table(pd.read_parquet(path)).to_parquet(path, index=False)
        rec["files"][table] = hashlib.sha256(path.read_bytes()).hexdigest()
    if edit_record is not None:
        edit_record(rec)
    rec["digest"] = canonical_digest(rec)
    f.write_text(json.dumps(rec))
    return f


def saved_tiny_model(tmp_path: Path, model_type: str, hf_class: str):
    """(``testing.tiny_model(model_type, hf_class)``, the folder it and a 128-token tokenizer are saved in)."""
    import warnings

    from tl_idempotence.testing import tiny_model, tiny_tokenizer

    model = tiny_model(model_type, hf_class)
    d = tmp_path / "ck"  # no model-family word in the path (TL 3.x dispatches on names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(d)
    tiny_tokenizer(128).save_pretrained(d)
    return model, d


#: Headless Chromium for the page-rendering tests: no sandbox, GPU, QUIC, first-run or background traffic.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_exe() -> str | None:
    """The installed ``chromium`` (or ``chromium-browser``) executable, None when there is none."""
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """The installed Chromium executable, or skip/fail (``conftest.unavailable``) where there is none."""
    from conftest import unavailable

    exe = chromium_exe()
    if exe is None:
        unavailable("headless Chromium (apt-get install -y chromium)")
    assert exe is not None
    return exe


def run_chromium(profile: Path, *args: str, timeout: float = 300):
    """Headless Chromium (:data:`CHROMIUM_FLAGS`) with its profile in ``profile``, then ``args``."""
    import subprocess

    cmd = [chromium_exe(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def mannwhitney_exact_p(a, b) -> float:
    """Two-sided exact Mann-Whitney p: U of every split of the pooled values into len(a) and len(b)."""
    import itertools

    pooled = list(a) + list(b)
    obs = sum(x > y for x in a for y in b)
    null = []
    for pick in itertools.combinations(range(len(pooled)), len(a)):
        xs = [pooled[i] for i in pick]
        ys = [pooled[i] for i in range(len(pooled)) if i not in pick]
        null.append(sum(x > y for x in xs for y in ys))
    return min(1.0, 2 * min(sum(v <= obs for v in null), sum(v >= obs for v in null)) / len(null))


def bh_list(p) -> list[float]:
    """Benjamini-Hochberg q-values by their definition (loops, no library) over the non-NaN p-values; NaN outside
    the family."""
    import math

    idx = [i for i, v in enumerate(p) if not math.isnan(v)]
    m = len(idx)
    order = sorted(idx, key=lambda i: p[i])
    q = [math.nan] * len(p)
    for r, i in enumerate(order, start=1):
        q[i] = min(min(1.0, m * p[order[k - 1]] / k) for k in range(r, m + 1))
    return q


def redigest(folder: Path, record: str, tables=None, fields=None) -> None:
    """:func:`rewrite_saved` over several tables (``{name: DataFrame -> DataFrame}``) and/or the JSON record
    (``fields(rec)``, in place), every sha256 and the record's digest recomputed."""
    items = list((tables or {}).items())
    if not items:
        rewrite_saved(folder, record, edit_record=fields)
    for i, (name, fn) in enumerate(items):
        rewrite_saved(folder, record, name, fn, fields if i == len(items) - 1 else None)


#: d_head of the causal probe's planted checkpoint (:func:`plant_causal`: 9 heads on 3 kv heads, d_model 72).
CAUSAL_DH = 8


def plant_causal(t: dict) -> None:
    """The causal probe's planted checkpoint (tests/unit/probes/test_causal.py): L1H4 exactly closed (``M = -1.5 I``),
    L0H2 writes nothing, the final norm's weight random."""
    g = torch.Generator().manual_seed(5)
    t["model.norm.weight"] = 0.5 + torch.rand(72, generator=g)
    V = torch.zeros(72, CAUSAL_DH)
    V[torch.arange(CAUSAL_DH) * 9, torch.arange(CAUSAL_DH)] = 0.5
    t["model.layers.1.self_attn.v_proj.weight"][CAUSAL_DH : 2 * CAUSAL_DH] = V.T
    t["model.layers.1.self_attn.o_proj.weight"][:, 4 * CAUSAL_DH : 5 * CAUSAL_DH] = -6.0 * V
    t["model.layers.0.self_attn.o_proj.weight"][:, 2 * CAUSAL_DH : 3 * CAUSAL_DH] = 0.0  # L0H2 writes nothing


def causal_O(w, layer, h):
    return w[f"model.layers.{layer}.self_attn.o_proj.weight"][
        :, h * CAUSAL_DH : (h + 1) * CAUSAL_DH
    ]  # [d_model, d_head]


def causal_V(w, layer, h):
    g = h // 3
    return w[f"model.layers.{layer}.self_attn.v_proj.weight"][
        g * CAUSAL_DH : (g + 1) * CAUSAL_DH
    ].T  # [d_model, d_head]


def causal_closure_only_N(w, layer, h):
    O, V = causal_O(w, layer, h).numpy(), causal_V(w, layer, h).numpy()
    T = O @ V.T
    alpha = np.sum((T @ T) * T) / np.sum(T * T)
    return torch.from_numpy(alpha * np.linalg.inv(V.T @ O))


def causal_reference(model, w, toks, layer, h, kind, value, clean_run=None):
    """Per counted destination: (window, pos, source, token, total, direct, loss) by a plain hook on hook_z."""
    counted = toks != 1
    with torch.no_grad():
        clean, cache = clean_run or model.run_with_cache(toks)

        def hook(z, hook):
            z = z.clone()
            z[:, :, h] = {"map": lambda x: x @ value.T, "zero": lambda x: 0 * x, "mean": lambda x: value + 0 * x}[kind](
                z[:, :, h]
            )
            return z

        edited = model.run_with_hooks(toks, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])
    z = cache[f"blocks.{layer}.attn.hook_z"][:, :, h]
    pat = cache[f"blocks.{layer}.attn.hook_pattern"][:, h]
    scale = cache["ln_final.hook_scale"][..., 0]
    W_O, W_U, norm_w = causal_O(w, layer, h).T, model.W_U.detach().double(), w["model.norm.weight"]
    lp0, lp1 = torch.log_softmax(clean, -1), torch.log_softmax(edited, -1)
    out = []
    for b in range(toks.shape[0]):
        for q in range(toks.shape[1]):
            if not counted[b, q]:
                continue
            s = max((k for k in range(q + 1) if counted[b, k]), key=lambda k: (pat[b, q, k].item(), -k))
            t = int(toks[b, s])
            z_new = {"map": z[b, q] @ value.T if kind == "map" else None, "zero": 0 * z[b, q], "mean": value}[kind]
            direct = float(((z_new - z[b, q]) @ W_O / scale[b, q] * norm_w) @ W_U[:, t])
            loss = np.nan
            if q + 1 < toks.shape[1] and counted[b, q + 1]:
                nxt = int(toks[b, q + 1])
                loss = float(lp0[b, q, nxt] - lp1[b, q, nxt])
            out.append((b, q, s, t, float(edited[b, q, t] - clean[b, q, t]), direct, loss))
    return np.array(out, dtype=float)
