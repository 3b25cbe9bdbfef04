"""One contract every stored result type passes (issue 45; core/stored.py).

Parametrized over :data:`tl_idempotence.core.stored.STORED` (every result type that saves itself declares itself
there), with one case per type in :data:`CASES` below: a stored type without a case, or a result class with a
``save`` that is not a stored type, fails :func:`test_every_stored_type_has_a_case`. For each type:

* a round trip gives the same result;
* a SIGKILL at any instant of a save into a fresh folder leaves nothing or the new save, and of an overwrite the
  earlier save or the new one, never neither, never a mix (``core.store.step_hook`` copies the folder's parent
  before every step a save makes: what a kill at that instant leaves);
* two saves into one fresh folder: exactly one wins, the other is refused naming the folder;
* every field of the JSON record edited, with the digest recomputed: the loader refuses it, naming the folder
  (except the fields the type declares free, ``StoreSpec.free_fields``, with why);
* every file truncated or missing: refused, naming the file;
* a save into the folder the result was loaded from: refused;
* frozen attributes, frames handed out as copies;
* the summary's counts (those the headline states) recomputed here from the table, independently.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import random
import shutil
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import canonical_digest, closed_pairs_layers
from tl_idempotence.core import store
from tl_idempotence.core.stored import STORED
from tl_idempotence.errors import MissingFileError, OptionError, OutputOverInputError, ReportFileError
from tl_idempotence.testing import tiny_hf_dir


class Stored(NamedTuple):
    """One stored type under test: its name, class, case and two different results of it."""

    name: str
    cls: type
    case: Case
    a: Any
    b: Any


@dataclass(frozen=True)
class Case:
    """How the contract builds and reads one stored type: two different results of it, the frames that say what it
    holds, and the summary's counts recomputed independently from its table."""

    make: Callable[[Any], tuple[Any, Any]]  # the module's fixtures -> (a, b)
    frames: tuple[str, ...]  # public DataFrame attributes compared between two results
    recount: Callable[[Any], dict[str, Any]]  # result -> {summary field: the value its table gives}


# --------------------------------------------------------------------------- the shared tiny models


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("contract") / "tiny", n_layers=2)


class World:
    """The module's models and results, built once and only when a case asks for them."""

    def __init__(self, bridge) -> None:
        self.bridge = bridge
        self._cache: dict[str, Any] = {}

    def get(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    @property
    def rep(self):
        return self.get("rep", lambda: tli.idempotence_report(self.bridge, nulls=4, algebra=True, progress=False))


@pytest.fixture(scope="module")
def world(bridge) -> World:
    return World(bridge)


def _closed(t: pd.DataFrame) -> int:
    return int(t["closed"].sum())


def _report_pair(w: World):
    return w.rep, w.rep.with_threshold(0.05)


def _tokens_pair(w: World):
    heads = ["L0H1", "L1H0", "L1H3"]
    return (
        w.get("tok_a", lambda: tli.head_tokens(w.bridge, heads=heads, k=3, n_tokens=24, seed=3)),
        w.get("tok_b", lambda: tli.head_tokens(w.bridge, heads=heads[:2], k=2, n_tokens=16, seed=4)),
    )


def _texts(seed: int, n: int = 2) -> torch.Tensor:
    return torch.randint(1, 60, (n, 16), generator=torch.Generator().manual_seed(seed))


def _effect_pair(w: World):
    heads = ["L0H1", "L1H0", "L1H3"]
    return (
        w.get("eff_a", lambda: tli.attended_token_effect(w.bridge, heads=heads, texts=_texts(1), seed=1)),
        w.get("eff_b", lambda: tli.attended_token_effect(w.bridge, heads=heads[1:], texts=_texts(2), seed=2)),
    )


def _mechanism_pair(w: World):
    kw = dict(model=w.bridge, n_tokens=16, k=2, n_permutations=19, n_boot=20, progress=False)
    low = w.get("rep_low", lambda: w.rep.with_threshold(0.03))  # closed heads, with matched controls (SPEC 13)
    two_sets = [_texts(3), _texts(6)]  # the stability across text sets
    return (
        w.get("mech_a", lambda: low.mechanism(heads=["L0H5", "L1H1", "L1H3"], texts=two_sets, seed=1, **kw)),
        w.get("mech_b", lambda: w.rep.mechanism(heads=["L0H0", "L1H2"], texts=_texts(3), seed=2, **kw)),
    )


def _causal_closure_pair(w: World):
    kw = dict(progress=False)
    return (
        w.get("cc_a", lambda: tli.causal_closure(w.bridge, ["L0H1", "L1H0", "L1H3"], _texts(6), **kw)),
        w.get("cc_b", lambda: tli.causal_closure(w.bridge, ["L1H2"], _texts(7), variants=("zero", "mean"), **kw)),
    )


def _causal_test_pair(w: World):
    # threshold 0.03: L0H5, L0H7, L0H8, L1H1, L1H2 closed (P 0.033-0.074), the other 13 heads below 0.021
    kw = dict(texts=_texts(8), progress=False)
    return (
        w.get("ct_a", lambda: w.rep.with_threshold(0.03).causal(variants=("closure_only", "zero"), **kw)),
        w.get("ct_b", lambda: w.rep.with_threshold(0.05).causal(variants="mean", match_by="norm", n_controls=2, **kw)),
    )


def _roles_pair(w: World):
    return (
        w.get("roles_a", lambda: tli.head_roles(w.bridge, repeat_len=6, n_sequences=2, seed=1)),
        w.get("roles_b", lambda: tli.head_roles(w.bridge, repeat_len=5, n_sequences=2, seed=2)),
    )


def _association_pair(w: World):
    a, b = _roles_pair(w)
    return (
        w.get("assoc_a", lambda: w.rep.roles(roles=a, n_permutations=19, seed=1)),
        w.get("assoc_b", lambda: w.rep.roles(roles=b, n_permutations=29, seed=2)),
    )


def _median(t: pd.DataFrame, col: str) -> float:
    v = t[col].to_numpy(dtype=float)
    return float(np.median(v[np.isfinite(v)]))


def _ablation_pair(w: World):
    kw = dict(seq_len=16, progress=False)
    return (
        w.get(
            "abl_a",
            lambda: tli.ablation(
                w.bridge, [(0, 1), (1, 0), (1, 3)], _texts(4, 4), n_controls=4, seed=1, singles=True, **kw
            ),
        ),
        w.get("abl_b", lambda: tli.ablation(w.bridge, [(0, 0)], _texts(5), kind="zero", n_controls=0, seed=2, **kw)),
    )


def _pairs_reports(w: World):
    """Three reports of synthetic layers (no model): two with the same options, one with nulls."""
    return w.get(
        "pairs_reports",
        lambda: (
            tli.idempotence_report(closed_pairs_layers(), progress=False),
            tli.idempotence_report(closed_pairs_layers(alpha=(1.0, -1.0), zero_l1h5=True), progress=False),
            tli.idempotence_report(closed_pairs_layers(), nulls=2, progress=False),
        ),
    )


def _comparison_pair(w: World):
    from tl_idempotence.studies.compare import Comparison

    r1, r2, r3 = _pairs_reports(w)
    return (
        w.get("cmp_a", lambda: Comparison.from_reports({"A": r1, "B": r2})),
        w.get("cmp_b", lambda: Comparison.from_reports({"solo": r3})),
    )


def _trajectory_pair(w: World):
    a, b = closed_pairs_layers(), closed_pairs_layers(alpha=(1.0, -1.0), zero_l1h5=True)

    def make_a():
        with warnings.catch_warnings():  # step2 is identical to step1: warned about, and marked
            warnings.simplefilter("ignore", UserWarning)
            ck = [("step0", lambda: a), ("step1", lambda: b), ("step2", lambda: b)]
            return tli.trajectory(ck, nulls=2, progress=False)

    return (
        w.get("traj_a", make_a),
        w.get(
            "traj_b",
            lambda: tli.trajectory(
                [("x", lambda: b), ("y", lambda: a)], heads=[(0, 1), (1, 5)], algebra=True, progress=False
            ),
        ),
    )


def _n_identical(layers: pd.DataFrame) -> int:
    """Checkpoints whose every layer fingerprint is an earlier checkpoint's (read from the layers table)."""
    seen, n = set(), 0
    for _, g in layers.groupby("order", sort=True):
        key = tuple(zip(g["layer"], g["fingerprint"]))
        n += key in seen
        seen.add(key)
    return n


def _sign_count(col: str, sign: int) -> Callable[[Any], int]:
    return lambda r: int((np.sign(r.table[col].to_numpy(dtype=float)) == sign).sum())


CASES: dict[str, Case] = {
    "head_roles": Case(
        _roles_pair,
        ("table",),
        lambda r: {"n_heads": len(r.table), **{f"median_{c}": _median(r.table, c) for c in ("induction", "copying")}},
    ),
    "role_association": Case(
        _association_pair,
        ("table", "association"),
        lambda r: {"n_heads": len(r.table), "n_closed": _closed(r.table)},
    ),
    "report": Case(
        _report_pair,
        ("heads", "layers", "closed_heads"),
        lambda r: {"n_closed": _closed(r.heads), "n_heads": len(r.heads)},
    ),
    "head_tokens": Case(
        _tokens_pair,
        ("table", "self_ranks"),
        lambda r: {"n_heads": len(r.table), "n_tokens": int(r.table["n_tokens"].iloc[0])},
    ),
    "attended_token_effect": Case(
        _effect_pair,
        ("table", "positions"),
        lambda r: {
            "n_heads": len(r.table),
            "n_positions": int(r.table["n_positions"].max()),
        },
    ),
    "mechanism": Case(
        _mechanism_pair,
        ("table", "signs"),
        lambda r: {
            "n_heads": len(r.table),
            "n_closed": _closed(r.table),
        },
    ),
    "causal_closure": Case(
        _causal_closure_pair,
        ("table", "changes", "positions"),
        lambda r: {"n_heads": len(r.table), "n_positions": int(r.table["n_positions"].max())},
    ),
    "causal_test": Case(
        _causal_test_pair,
        ("table", "pairs", "comparison", "candidates"),
        lambda r: {
            "n_closed": int((r.table["group"] == "closed").sum()),
            "n_control_heads": int((r.table["group"] == "control").sum()),
            "n_matched": r.pairs["closed_label"].nunique(),
        },
    ),
    "ablation": Case(
        _ablation_pair,
        ("heads", "controls", "window_losses", "window_sums"),
        lambda r: {
            "n_heads": len(r.heads),
            "n_controls": len(r.controls),
            "n_windows": len(r.window_sums),
            "n_tokens": int(r.window_sums["n_tokens"].sum()),
            "n_controls_at_least": int((r.controls["delta_loss"] >= r.summary["delta_loss"]).sum()),
        },
    ),
    "comparison": Case(
        _comparison_pair,
        ("table", "heads"),
        lambda r: {
            "n_models": len(r.reports),
            "n_heads": sum(len(rep.heads) for rep in r.reports.values()),
            "n_closed": sum(_closed(rep.heads) for rep in r.reports.values()),
        },
    ),
    "trajectory": Case(
        _trajectory_pair,
        ("heads", "layers", "checkpoints"),
        lambda r: {
            "n_checkpoints": r.heads["checkpoint"].nunique(),
            "n_closed_final": _closed(r.heads[r.heads["order"] == r.heads["order"].max()]),
            "n_identical": _n_identical(r.layers),
        },
    ),
}


# --------------------------------------------------------------------------- generic helpers


def _frames(case: Case, r: Any) -> dict[str, pd.DataFrame]:
    return {name: getattr(r, name) for name in case.frames}


def _summary(r: Any) -> dict[str, Any]:
    s = r.summary
    return json.loads(json.dumps(s.to_dict() if hasattr(s, "to_dict") else dict(s), default=str))


def same(case: Case, a: Any, b: Any) -> bool:
    """Whether two results hold the same summary and frames (NaN equal to NaN)."""
    if type(a) is not type(b) or _summary(a) != _summary(b):
        return False
    fa, fb = _frames(case, a), _frames(case, b)
    return all(fa[k].equals(fb[k]) and list(fa[k].columns) == list(fb[k].columns) for k in fa)


def _load(cls: type, path: Path) -> Any:
    return cls.load(path)


@pytest.fixture(params=sorted(CASES))
def stored(request, world, package_classes):
    name = request.param
    for c in package_classes.values():
        if c.store == name:
            importlib.import_module(c.module)  # its class declares the StoreSpec: now in STORED
    if name not in STORED:
        pytest.fail(f"{name!r} has a case here but no class declares StoreSpec(name={name!r})")
    case = CASES[name]
    a, b = case.make(world)
    return Stored(name, STORED[name], case, a, b)


# --------------------------------------------------------------------------- the list cannot be skipped


@dataclass(frozen=True)
class ClassInfo:
    """A class of the package as its source declares it (read with ast: nothing is imported)."""

    name: str
    module: str
    bases: tuple[str, ...]
    saves: bool  # defines a ``save`` method
    store: str | None  # the name of the StoreSpec it declares in its body


def _package_classes() -> dict[str, ClassInfo]:
    """Every class of src/tl_idempotence by name, read statically (the list of stored types cannot be skipped by a
    class whose module was not imported)."""
    import ast

    import tl_idempotence

    def spec_name(value: ast.expr | None) -> str | None:
        """The name of ``StoreSpec(name=...)``, or of the module-level StoreSpec it names (``store = X_STORE``)."""
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "StoreSpec":
            return next(ast.literal_eval(k.value) for k in value.keywords if k.arg == "name")
        return specs.get(value.id) if isinstance(value, ast.Name) else None

    root = Path(tl_idempotence.__file__).parent
    trees = {f: ast.parse(f.read_text("utf-8")) for f in sorted(root.rglob("*.py"))}
    specs: dict[str, str] = {}  # the package's module-level ``X_STORE = StoreSpec(name=...)`` by variable name
    for tree in trees.values():
        for item in tree.body:
            if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
                name = spec_name(item.value) if isinstance(item.value, ast.Call) else None
                if name is not None:
                    specs[item.targets[0].id] = name
    out: dict[str, ClassInfo] = {}
    for f, tree in trees.items():
        module = ".".join(("tl_idempotence", *f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            store = None
            for item in node.body:
                value = item.value if isinstance(item, (ast.Assign, ast.AnnAssign)) else None
                store = spec_name(value) or store
            saves = any(isinstance(i, ast.FunctionDef) and i.name == "save" for i in node.body)
            bases = tuple(b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases)
            out[node.name] = ClassInfo(node.name, module, bases, saves, store)
    return out


@pytest.fixture(scope="module")
def package_classes() -> dict[str, ClassInfo]:
    return _package_classes()


def _ancestors(classes: dict[str, ClassInfo], name: str) -> set[str]:
    """A class's name and its bases' names, through every level the package defines."""
    todo, seen = [name], set()
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(classes[n].bases if n in classes else ())
    return seen


def _declares(classes: dict[str, ClassInfo], name: str) -> str | None:
    """The StoreSpec name a class declares or inherits (by its bases' names), or None."""
    todo, seen = [name], set()
    while todo:
        c = classes.get(todo.pop())
        if c is None or c.name in seen:
            continue
        seen.add(c.name)
        if c.store is not None:
            return c.store
        todo.extend(c.bases)
    return None


#: Result classes with a ``save`` that writes something other than a stored folder, and why.
NOT_STORED = {
    "StoredResult": "the base every stored type derives from (its save is abstract)",
    "AttentionView": "its save writes one HTML page through the output registry (core/outputs.py), not a result",
}


def test_every_stored_type_has_a_case_and_every_saving_class_is_stored(package_classes):
    declared = {c.store: c for c in package_classes.values() if c.store is not None}
    assert set(declared) == set(CASES), f"stored types without a case: {sorted(set(declared) - set(CASES))}"
    for c in package_classes.values():
        if c.saves and c.name not in NOT_STORED and "Result" in _ancestors(package_classes, c.name):
            assert _declares(package_classes, c.name), f"{c.module}.{c.name} saves itself but is no stored type"


# --------------------------------------------------------------------------- the contract


def test_a_round_trip_gives_the_same_result(stored, tmp_path):
    cls = stored.cls
    case = stored.case
    a = stored.a
    b = stored.b
    back = _load(cls, Path(a.save(tmp_path / "res")))
    assert same(case, a, back) and not same(case, a, b)
    with pytest.raises(OutputOverInputError):  # over the folder it was read from
        back.save(tmp_path / "res", overwrite=True)
    with pytest.raises(OptionError, match="not empty"):
        b.save(tmp_path / "res")
    assert same(case, a, _load(cls, tmp_path / "res"))


def _visible(root: Path) -> tuple[tuple[str, bytes], ...]:
    """What a reader can see under ``root``: every folder and file (with its bytes) but those in a save's hidden new
    folder (``.NAME.tli-new-...``), where no reader looks."""
    seen = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not any(store.NEW_MARK in part for part in rel.parts):
            seen.append((rel.as_posix(), p.read_bytes() if p.is_file() else b"/"))
    return tuple(seen)


def _snapshots(monkeypatch, root: Path, out: Path) -> list[tuple[str, Path]]:
    """Before every step a save makes, a copy of ``root`` (what a kill then leaves); a step that leaves what a reader
    sees as it was (a file written into the hidden new folder) shares the copy of the step before it."""
    shots: list[tuple[str, Path]] = []
    copies: dict[tuple[tuple[str, bytes], ...], Path] = {}

    def hook(step: str, path: Path) -> None:
        key = _visible(root)
        if key not in copies:
            copies[key] = out / f"{len(copies):03d}"
            shutil.copytree(root, copies[key], symlinks=True)
        shots.append((step, copies[key]))

    monkeypatch.setattr(store, "step_hook", hook)
    return shots


def _outcome(case: Case, cls: type, d: Path, candidates: dict[str, Any]) -> str:
    try:
        got = _load(cls, d)
    except MissingFileError:
        return "nothing"
    for tag, r in candidates.items():
        if same(case, got, r):
            return tag
    return "a mix"


def _outcomes(case: Case, cls: type, shots: list[tuple[str, Path]], candidates: dict[str, Any]) -> list[str]:
    """The :func:`_outcome` of each snapshot's ``res`` (each copy read once)."""
    got: dict[Path, str] = {}
    for _, s in shots:
        if s not in got:
            got[s] = _outcome(case, cls, s / "res", candidates)
    return [got[s] for _, s in shots]


@pytest.mark.parametrize("mode", ["exchange", "two-renames"])
def test_a_kill_at_any_instant_leaves_the_old_save_or_the_new(stored, tmp_path, monkeypatch, mode):
    cls = stored.cls
    case = stored.case
    a = stored.a
    b = stored.b
    if mode == "two-renames":
        monkeypatch.setattr(store, "exchange", lambda x, y: False)
    root = tmp_path / "root"
    root.mkdir()
    shots = _snapshots(monkeypatch, root, tmp_path / "fresh")
    a.save(root / "res")
    fresh = _outcomes(case, cls, shots, {"new": a})
    assert fresh[0] == "nothing" and fresh[-1] == "new" and set(fresh) <= {"nothing", "new"}, fresh
    shots.clear()
    monkeypatch.setattr(store, "step_hook", None)
    (root / "res" / "notes.md").write_text("mine")
    shots = _snapshots(monkeypatch, root, tmp_path / "over")
    b.save(root / "res", overwrite=True)
    monkeypatch.setattr(store, "step_hook", None)
    over = _outcomes(case, cls, shots, {"old": a, "new": b})
    bad = [(step, got) for (step, _), got in zip(shots, over) if got not in ("old", "new")]
    assert over[0] == "old" and over[-1] == "new" and not bad, bad
    assert (root / "res" / "notes.md").read_text() == "mine"
    assert sorted(p.name for p in root.iterdir()) == ["res"]


def test_two_saves_into_one_fresh_folder_one_wins(stored, tmp_path, monkeypatch):
    cls = stored.cls
    case = stored.case
    a = stored.a
    b = stored.b
    d = tmp_path / "res"
    go, paused = threading.Event(), threading.Event()

    def hook(step: str, path: Path) -> None:
        if threading.current_thread().name == "A" and step == "rename new to target":
            paused.set()
            assert go.wait(30)

    monkeypatch.setattr(store, "step_hook", hook)
    out: dict[str, Any] = {}

    def run(tag: str, r: Any) -> None:
        try:
            out[tag] = r.save(d)
        except OptionError as e:
            out[tag] = e

    t = threading.Thread(target=run, args=("a", a), name="A")
    t.start()
    assert paused.wait(30)
    run("b", b)  # B finishes while A waits before its last step: B wins
    go.set()
    t.join()
    assert isinstance(out["a"], OptionError) and str(d) in str(out["a"]) and "another save" in str(out["a"])
    assert Path(out["b"]) == d and same(case, _load(cls, d), b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def _leaves(x: Any, path: str = "") -> list[tuple[str, list[Any]]]:
    """``(dotted path, key path)`` of every leaf of a JSON value (a list's first element only, as ``*``)."""
    if isinstance(x, dict):
        out = []
        for k, v in x.items():
            for p, kp in _leaves(v, ""):
                out.append(((f"{path}.{k}" if path else str(k)) + (f".{p}" if p else ""), [k, *kp]))
        return out
    if isinstance(x, list) and x:
        return [(f"*.{p}" if p else "*", [0, *kp]) for p, kp in _leaves(x[0], "")]
    return [("", [])]


def _edited(v: Any) -> Any:
    """Another value of the same JSON type."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 1.5 + 0.25 if v != -0.5 else 0.0  # -0.5 is the map's fixed point: another value
    if isinstance(v, str):
        return 0.5 if v in ("NaN", "Infinity", "-Infinity") else v + "x"
    if v is None:
        return 1
    if isinstance(v, list):  # an empty list
        return [0]
    return {"x": 1}  # an empty dict


def _set(rec: Any, keys: list[Any], value: Any) -> None:
    for k in keys[:-1]:
        rec = rec[k]
    rec[keys[-1]] = value


def _get(rec: Any, keys: list[Any]) -> Any:
    for k in keys:
        rec = rec[k]
    return rec


#: How many record fields of one type the quick tier edits (a seeded sample, the same on every run, when a record has
#: more); ``TLI_CONTRACT_FIELDS=all`` edits every one: tests/integration/test_result_contract_all_fields.py runs this
#: test so in CI (a mechanism's record has ~190 fields, each edit a full load: ~12 s).
QUICK_FIELDS = os.environ.get("TLI_CONTRACT_FIELDS", "24")


def _fields(rec0: Any, spec: Any) -> list[tuple[str, list[Any]]]:
    """The record's fields an edit must be refused for (every leaf but the digest and the free fields), sampled to
    :data:`QUICK_FIELDS` with seed 0 unless that is ``all``."""
    fields = [
        (dotted, keys)
        for dotted, keys in _leaves(rec0)
        if dotted != "digest"
        and not any(fnmatch.fnmatchcase(dotted, pat) or dotted.startswith(pat + ".") for pat, _ in spec.free_fields)
    ]
    if QUICK_FIELDS == "all" or len(fields) <= int(QUICK_FIELDS):
        return fields
    keep = sorted(random.Random(0).sample(range(len(fields)), int(QUICK_FIELDS)))
    return [fields[i] for i in keep]


def test_the_quick_tier_samples_fields_and_all_edits_every_one(monkeypatch):
    rec = {"digest": "x", "a": {f"f{i}": i for i in range(100)}, "free": 1}
    spec = type("S", (), {"free_fields": (("free", "provenance"),)})
    monkeypatch.setattr(sys.modules[__name__], "QUICK_FIELDS", "all")
    assert [d for d, _ in _fields(rec, spec)] == [f"a.f{i}" for i in range(100)]
    monkeypatch.setattr(sys.modules[__name__], "QUICK_FIELDS", "60")
    got = [d for d, _ in _fields(rec, spec)]
    assert len(set(got)) == 60 and got == [d for d, _ in _fields(rec, spec)]
    assert set(got) < {f"a.f{i}" for i in range(100)}


def test_every_record_field_edited_with_its_digest_recomputed_is_refused(stored, tmp_path):
    name = stored.name
    cls = stored.cls
    case = stored.case
    a = stored.a
    spec = cls.store
    d = Path(a.save(tmp_path / "res"))
    rec_file = d / spec.record
    original = rec_file.read_text()
    rec0 = json.loads(original)
    accepted = []
    for dotted, keys in _fields(rec0, spec):
        rec = json.loads(original)
        _set(rec, keys, _edited(_get(rec, keys)))
        rec["digest"] = canonical_digest(rec)
        rec_file.write_text(json.dumps(rec))
        try:
            _load(cls, d)
        except (ReportFileError, MissingFileError) as e:
            assert str(d) in str(e), f"{dotted}: the refusal does not name the folder: {e}"
        else:
            accepted.append(dotted)
    rec_file.write_text(original)
    assert not accepted, f"{name}: edits of these record fields load as if nothing happened: {accepted}"
    assert same(case, _load(cls, d), a)


def test_every_file_truncated_or_missing_is_refused_naming_it(stored, tmp_path):
    cls = stored.cls
    case = stored.case
    a = stored.a
    d = Path(a.save(tmp_path / "res"))
    files = sorted(p for p in d.rglob("*") if p.is_file())
    for f in files:
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
        with pytest.raises((ReportFileError, MissingFileError)) as e:
            _load(cls, d)
        assert str(f.name) in str(e.value), (f, e.value)
        f.unlink()
        with pytest.raises((ReportFileError, MissingFileError)) as e:
            _load(cls, d)
        assert str(f.name) in str(e.value), (f, e.value)
        f.write_bytes(data)
    assert same(case, _load(cls, d), a)


def test_frozen_attributes_and_copied_frames(stored):
    case = stored.case
    a = stored.a
    for attr in ("summary", *case.frames, "x_new_attribute"):
        with pytest.raises((FrozenInstanceError, AttributeError)):
            setattr(a, attr, None)
    for frame in case.frames:
        f = getattr(a, frame)
        if len(f):
            f.iloc[0, 0] = f.iloc[1 % len(f), 0]
            f["__edit__"] = 1
        assert "__edit__" not in getattr(a, frame).columns
    with pytest.raises(TypeError):
        a.summary["__edit__"] = 1


def test_the_summarys_counts_are_what_the_table_gives(stored):
    name = stored.name
    case = stored.case
    a = stored.a
    b = stored.b
    for r in (a, b):
        for field, want in case.recount(r).items():
            assert r.summary[field] == want, (name, field)
