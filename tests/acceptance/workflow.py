"""A researcher's notebook workflow, replayed in a fresh Python process (run as a script, never imported).

    python tests/acceptance/workflow.py [--zoo] [--out DIR]

What a user does, in the order a notebook does it, on whatever transformer-lens this environment has
(3.9: HookedTransformer and TransformerBridge; 4.x: TransformerBridge only):

1. ``import transformer_lens`` first, then ``import tl_idempotence`` (the order that crashed on 4.x);
   the report method is on every TransformerLens class this version has.
2. Tiny seeded GQA (Llama, 6 query / 2 kv heads) and MHA (GPT-2) checkpoints, loaded as every
   TransformerLens class the version has; ``model.idempotence_report(nulls=8, algebra=True)``: every
   head's α and P equal a dense float64 ``T = O Vᵀ`` from the model's own ``W_V``/``W_O``.
3. ``rep.to_tensor("P")`` is ``[n_layers, n_heads]`` and equals the table.
4. ``rep.hook_points(hook=...)`` for every hook kind, used in ``run_with_hooks``: each index is inside
   the axis it names; zeroing ``hook_v`` at a kv-head point zeroes ``hook_z`` of exactly the query
   heads that read that kv head; ``hook="result"`` is refused until ``set_use_attn_result(True)``.
5. ``rep.save(folder)`` next to a user's file, ``save(overwrite=True)`` keeps that file,
   ``tli.load_report`` gives the same tables.
6. The CLI: ``tl-idempotence report <checkpoint> --json`` exits 0 with the same P.
6b. Head roles: ``rep.roles(model=...)`` on every class gives the same table (to float rounding) and the same
   closed-set join; ``.save`` then ``tli.load_roles`` gives the same tables.
7. With ``--zoo`` (the real model, from the offline zoo): ``tli.models.load("smollm2-135m")
   .idempotence_report()`` has SmolLM2's 13 closed heads; ``tl-idempotence report smollm2-135m --cls bridge
   --processing tl --json`` exits 0.

Prints one ``ok ...`` line per check and ``WORKFLOW OK`` at the end; any failure raises (exit 1).
"""

# ruff: isort: skip_file
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

# The import order is what is tested: transformer_lens first (as in a notebook that already uses it).
import transformer_lens

import tl_idempotence as tli

import torch
from tl_idempotence.testing import bridge_from_dir, hooked_from_dir, tiny_hf_dir

TL_VERSION = __import__("importlib.metadata").metadata.version("transformer-lens")
TL_MAJOR = int(TL_VERSION.split(".")[0])
SMOL_CLOSED = 13  # SmolLM2-135M-Instruct, raw weights: heads with P >= 0.9


def ok(msg: str) -> None:
    print(f"ok {msg}", flush=True)


def cli() -> list[str]:
    exe = Path(sys.executable).with_name("tl-idempotence")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tl_idempotence.cli"]


def tl_classes() -> dict[str, type]:
    """The TransformerLens model classes this version has (never touching a removed name)."""
    from transformer_lens.model_bridge import TransformerBridge  # 4.x imports it lazily

    out: dict[str, type] = {"TransformerBridge": TransformerBridge}
    for name in ("HookedTransformer", "HookedEncoder"):
        cls = vars(transformer_lens).get(name)
        if cls is not None:
            out[name] = cls
    return out


def dense_closure(model, layer: int, head: int, kv: int) -> tuple[float, float]:
    """α, P of one head from a dense float64 Tᵀ = W_V[kv] @ W_O[head] (TL row form)."""
    attn = model.blocks[layer].attn
    W_V = getattr(attn, "_W_V", None)
    W_V = attn.W_V if W_V is None or type(model).__name__ == "TransformerBridge" else W_V
    Tt = W_V.detach().double()[kv] @ attn.W_O.detach().double()[head]
    T2 = Tt @ Tt
    inner, n2, n22 = float((T2 * Tt).sum()), float((Tt * Tt).sum()), float((T2 * T2).sum())
    return inner / n2, inner**2 / (n22 * n2)


def check_report(model, rep, n_kv: int) -> None:
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    assert len(rep.heads) == n_layers * n_heads, len(rep.heads)
    for lab, row in rep.heads.iterrows():
        assert row["kv_head"] == row["head"] // (n_heads // n_kv), (lab, row["kv_head"])
        alpha, P = dense_closure(model, int(row["layer"]), int(row["head"]), int(row["kv_head"]))
        assert abs(row["P"] - P) <= 1e-9 and abs(row["alpha"] - alpha) <= 1e-9 * max(1.0, abs(alpha)), (lab, row)
    t = rep.to_tensor("P")
    assert tuple(t.shape) == (n_layers, n_heads) and t.dtype == torch.float64
    assert torch.equal(t.flatten(), torch.tensor(rep.heads["P"].to_numpy())), "to_tensor disagrees with heads"
    assert "P_scrambled_median" in rep.heads.columns and rep.summary.get("n_closed") is not None


def check_hooks(model, rep, n_kv: int) -> None:
    """Every hook kind's points index the right axis of that hook's activation, in run_with_hooks."""
    n_heads = model.cfg.n_heads
    kv_of = {(int(a), int(b)): int(k) for a, b, k in zip(rep.heads["layer"], rep.heads["head"], rep.heads["kv_head"])}
    toks = torch.tensor([[1, 5, 7, 9, 11, 13, 17, 19]])
    for hook in ("z", "q", "k", "v", "pattern", "attn_scores"):
        pts = rep.hook_points(heads="all", hook=hook)
        size = n_kv if hook in ("k", "v") else n_heads
        assert len(pts) == model.cfg.n_layers * size, (hook, len(pts))
        seen: dict[str, torch.Size] = {}

        def record(name, seen=seen):
            def hook_fn(act, hook):  # keyed by the name asked for (a bridge's hook.name may be its alias)
                seen[name] = act.shape

            return hook_fn

        model.run_with_hooks(toks, fwd_hooks=[(name, record(name)) for name in {p.name for p in pts}])
        for p in pts:
            name, idx = p  # unpacks as a (name, index) pair
            assert seen[name][p.axis] == size, (hook, name, tuple(seen[name]), p.axis, size)
            assert 0 <= idx < size, (hook, p)
            for h in p.query_heads:
                assert (kv_of[(p.layer, h)] if hook in ("k", "v") else h) == idx, (hook, p)
        ok(f"{type(model).__name__}: hook_{hook} points index axis {pts[0].axis} of size {size}")
    # Zero one kv head's value: exactly the query heads that read it lose their z.
    layer, kv = 0, n_kv - 1
    pt = next(p for p in rep.hook_points(heads=[(layer, n_heads - 1)], hook="v"))
    assert pt == (f"blocks.{layer}.attn.hook_v", kv) and pt.query_heads == (n_heads - 1,), pt
    z = {}

    def zero_v(v, hook):
        v = v.clone()
        v[:, :, pt.head] = 0.0
        return v

    def keep_z(act, hook):
        z["z"] = act.detach().clone()

    model.run_with_hooks(toks, fwd_hooks=[(pt.name, zero_v), (f"blocks.{layer}.attn.hook_z", keep_z)])
    for h in range(n_heads):
        zeroed = bool(torch.count_nonzero(z["z"][:, :, h]) == 0)
        assert zeroed == (kv_of[(layer, h)] == kv), (h, zeroed)
    ok(f"{type(model).__name__}: zeroing hook_v at kv head {kv} zeroes hook_z of exactly its query heads")
    # hook_result only fires with use_attn_result.
    try:
        rep.hook_points(hook="result", model=model)
    except tli.errors.OptionError as e:
        assert "set_use_attn_result" in str(e), e
    else:
        raise AssertionError("hook='result' accepted on a model without use_attn_result")
    model.set_use_attn_result(True)
    try:
        pts = rep.hook_points(heads="all", hook="result", model=model)
        shapes: dict[str, torch.Size] = {}

        def rec(name):
            def hook_fn(act, hook):
                shapes[name] = act.shape

            return hook_fn

        model.run_with_hooks(toks, fwd_hooks=[(name, rec(name)) for name in {p.name for p in pts}])
        assert len(shapes) == model.cfg.n_layers and all(s[pts[0].axis] == n_heads for s in shapes.values()), shapes
    finally:
        model.set_use_attn_result(False)
    ok(f"{type(model).__name__}: hook_result refused until set_use_attn_result(True), then fires on axis 2")


def check_save_load(rep, work: Path) -> None:
    d = work / "saved_report"
    work.mkdir(parents=True, exist_ok=True)
    rep.save(d)
    (d / "notes.md").write_text("my notes about these heads\n")
    rep.save(d, overwrite=True)
    assert (d / "notes.md").read_text() == "my notes about these heads\n", "save(overwrite=True) lost the user's file"
    back = tli.load_report(d)
    assert back.heads.equals(rep.heads) and back.layers.equals(rep.layers), "load_report changed the tables"
    ok("save(overwrite=True) keeps the user's file; load_report gives the same tables")


def check_roles(roles_by_class: dict, work: Path) -> None:
    """The same weights on every TL class give the same roles; they save and load (no pickle)."""
    first, *rest = roles_by_class.items()
    cols = ["previous_token", "duplicate_token", "induction", "copying"]
    for name, assoc in rest:
        a, b = first[1].table, assoc.table
        assert list(a.index) == list(b.index) and (a["closed"] == b["closed"]).all(), name
        diff = float((a[cols] - b[cols]).abs().to_numpy().max())
        assert diff <= 1e-6, f"head roles differ between {first[0]} and {name}: {diff}"
    d = work / "saved_roles"
    work.mkdir(parents=True, exist_ok=True)
    first[1].save(d)
    back = tli.load_roles(d)
    assert back.table.equals(first[1].table) and back.association.equals(first[1].association), "load_roles changed"
    ok(f"head roles on {', '.join(roles_by_class)}: the same table; save/load_roles gives the same tables")


def run_cli(args: list[str], cwd: Path) -> dict:
    r = subprocess.run(cli() + args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"tl-idempotence {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout)


def tiny_models(work: Path) -> None:
    cases = {
        "gqa": (tiny_hf_dir(work / "tiny_q", arch="llama", n_layers=2, d_model=48, n_heads=6, n_kv_heads=2), 2),
        "mha": (tiny_hf_dir(work / "tiny_m", arch="gpt2", n_layers=2, d_model=48, n_heads=4, n_ctx=128), 4),
    }
    for kind, (path, n_kv) in cases.items():
        makers = {"TransformerBridge": bridge_from_dir}
        if "HookedTransformer" in tl_classes():
            makers["HookedTransformer"] = hooked_from_dir
        roles_by_class = {}
        for cls_name, make in makers.items():
            model = make(path)
            assert type(model).__name__ == cls_name
            rep = model.idempotence_report(nulls=8, algebra=True, seed=0, progress=False)
            check_report(model, rep, n_kv)
            ok(f"{cls_name} ({kind}): every head's alpha and P equal dense float64 T; to_tensor is [layers, heads]")
            check_hooks(model, rep, n_kv)
            roles_by_class[cls_name] = rep.roles(model=model, n_tokens=8, n_sequences=2, n_permutations=19)
        check_roles(roles_by_class, work / kind)
        check_save_load(rep, work / kind)
        out = run_cli(["report", str(path), "--json", "--quiet", "--nulls", "8", "--threshold", "0"], cwd=work)
        P = {h["label"]: h["P"] for h in out["closed_heads"]}  # threshold 0: every head
        assert len(P) == len(rep.heads) and all(abs(P[lab] - rep.heads.loc[lab, "P"]) <= 1e-12 for lab in P), (
            "CLI P differs from the report"
        )
        ok(f"CLI report {kind} checkpoint --json: exit 0, {len(P)} closed heads with the report's P")


def zoo_model(work: Path) -> None:
    model = tli.models.load("smollm2-135m", progress=False)
    rep = model.idempotence_report(progress=False)
    assert rep.summary["n_closed"] == SMOL_CLOSED, rep.summary["n_closed"]
    assert rep.hook_points()[0] == ("blocks.10.attn.hook_z", 8), rep.hook_points()[:1]
    ok(f"tli.models.load('smollm2-135m').idempotence_report(): {SMOL_CLOSED} closed heads, L10H8 first")
    out = run_cli(["report", "smollm2-135m", "--cls", "bridge", "--processing", "tl", "--json", "--quiet"], cwd=work)
    assert out["summary"]["processing"]["processing"] == "tl", out["summary"]["processing"]
    ok("tl-idempotence report smollm2-135m --cls bridge --processing tl --json: exit 0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", action="store_true", help="also the real zoo model (SmolLM2-135M)")
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one, removed)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    print(f"transformer-lens {TL_VERSION}, tl_idempotence {tli.__version__}, python {sys.version.split()[0]}")
    attached = [c for c, cls in tl_classes().items() if hasattr(cls, "idempotence_report")]
    assert set(attached) == set(tl_classes()), (attached, list(tl_classes()))
    ok(f"import transformer_lens, then tl_idempotence: idempotence_report on {', '.join(sorted(attached))}")
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tli-workflow-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tiny_models(work)
        if args.zoo:
            zoo_model(work)
    finally:
        if args.out is None:
            shutil.rmtree(work, ignore_errors=True)
    print("WORKFLOW OK")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
