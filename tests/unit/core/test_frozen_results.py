"""Every public result is frozen the same way (core/tables.py's ImmutableResult), checked on every result type.

The result types are found, not listed: every module of the package is imported and every class deriving from
``core.results.Result`` is walked, so a new result type without a factory in ``FACTORIES`` (or a name in
``BASES``) fails ``test_every_result_type_has_a_factory``. Each is built once, small (synthetic layers of 4 heads,
or direct construction from tiny frames), and checked: it is an ``ImmutableResult``; assigning or deleting an
attribute raises ``dataclasses.FrozenInstanceError`` naming the result and how to get a changed one; every DataFrame
it hands out (attributes, properties, mappings of frames) is a copy; its dicts and lists are read-only; its summary
is read-only (a ``FrozenDict``; a ``FrozenSummary`` where it is typed)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import tl_idempotence
from helpers import SyntheticSource, gaussian_layer
from tl_idempotence.core.frozen import FrozenDict, FrozenList
from tl_idempotence.core.heads import ModelInfo
from tl_idempotence.core.results import Result
from tl_idempotence.core.summaries import FrozenSummary
from tl_idempotence.core.tables import ImmutableResult

#: The result classes that are bases of others, never handed to a user as they are.
BASES = {
    "tl_idempotence.views.results.DrawnResult",
    "tl_idempotence.core.tables.ImmutableResult",
    "tl_idempotence.core.tables.FrozenResult",
    "tl_idempotence.core.tables.ModelResult",
    "tl_idempotence.probes.token_records.TokenResult",
}


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def result_types() -> set[str]:
    """Every class of the package deriving from Result (every module imported first), by its qualified name."""
    for m in pkgutil.walk_packages(tl_idempotence.__path__, "tl_idempotence."):
        if m.name.rsplit(".", 1)[-1] != "__main__":  # (python -m: runs the command line)
            importlib.import_module(m.name)
    out, todo = set(), [Result]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("tl_idempotence."):
                out.add(qualname(sub))
    return out


# ----------------------------------------------------------------------------- one small instance of each type

INFO = ModelInfo(n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_head=4, model_name="syn")


def per_head(**cols: Any) -> pd.DataFrame:
    labels = ["L0H0", "L0H1"]
    return pd.DataFrame({"layer": [0, 0], "head": [0, 1], "kv_head": [0, 0], **cols}, index=labels)


def layers() -> list:
    return [gaussian_layer(layer, 4, 2, 16, 4, 7 + layer) for layer in range(2)]


def report(b: dict[str, Any]) -> Any:
    if "report" not in b:
        b["report"] = tl_idempotence.idempotence_report(
            SyntheticSource(layers(), name="syn"), nulls=4, algebra=True, progress=False
        )
    return b["report"]


def head_roles(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.roles import HeadRoles

    return HeadRoles(
        per_head(previous_token=[0.1, 0.2], duplicate_token=[0.0, 0.3], induction=[0.2, 0.1], copying=[0.5, -0.5]),
        {"model_name": "syn", "n_heads": 2, "processing": {"fold_ln": True}, "layer_fingerprints": {"0": "ab"}},
        INFO,
        options={"n_tokens": 8, "seed": 0},
    )


def head_tokens(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.head_tokens import HeadTokens

    top = pd.DataFrame({"kind": ["promoted"], "rank": [0], "token_id": [3], "token": ["a"], "value": [0.9]})
    return HeadTokens(
        per_head(self_rank_median=[0.1, 0.9], frac_top_k=[0.5, 0.0], frac_bottom_k=[0.0, 0.5], n_tokens=[4, 4]),
        np.array([[0.1, 0.2], [0.9, 0.8]]),
        np.array([3, 5]),
        {"L0H0": top, "L0H1": top},
        {"model_name": "syn", "n_heads": 2, "headline": "h", "convention": "c"},
        INFO,
        options={"k": 1, "n_tokens": 2},
    )


def attended_token_effect(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.token_effect import AttendedTokenEffect

    positions = pd.DataFrame({"head": ["L0H0"], "position": [3], "effect": [0.25]})
    return AttendedTokenEffect(
        per_head(effect_median=[0.2, -0.1], n_positions=[3, 3]),
        positions,
        {"model_name": "syn", "n_heads": 2, "headline": "h", "convention": "c"},
        INFO,
        options={"seed": 0},
    )


def causal_closure(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.causal import CausalClosure

    changes = pd.DataFrame({"label": ["L0H0"], "variant": ["zero"], "total_median": [0.25], "reason": [""]})
    positions = pd.DataFrame({"label": ["L0H0"], "variant": ["zero"], "pos": [3], "total": [0.25]})
    return CausalClosure(
        per_head(total_zero=[0.25, -0.1]),
        changes,
        positions,
        {"model_name": "syn", "n_heads": 2, "headline": "h", "variants": ["zero"]},
        INFO,
        options={"variants": ["zero"]},
    )


def causal_test(b: dict[str, Any]) -> Any:
    from tl_idempotence.report.causal import CausalTest

    pairs = pd.DataFrame({"layer": [0], "closed_label": ["L0H0"], "control_label": ["L0H1"]})
    comparison = pd.DataFrame({"variant": ["zero"], "quantity": ["loss"], "difference": [0.1], "p_value": [0.5]})
    return CausalTest(
        per_head(group=["closed", "control"], total_zero=[0.25, -0.1]),
        pairs,
        comparison,
        per_head(closed=[True, False]),
        {"model_name": "syn", "n_closed": 1, "headline": "h", "variants": ["zero"], "notes": ["a note"]},
        causal_closure(b),
    )


def role_association(b: dict[str, Any]) -> Any:
    from tl_idempotence.report.roles import RoleAssociation

    assoc = pd.DataFrame({"n": [2], "spearman_rho": [1.0], "note": [""]}, index=["copying"])
    return RoleAssociation(per_head(P=[0.95, 0.2]), assoc, {"model_name": "syn", "n_heads": 2}, roles=head_roles(b))


def mechanism(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.tied import EmbeddingTie
    from tl_idempotence.report.mechanism import Mechanism

    signs = pd.DataFrame({"column": ["copying"], "group": ["closed"], "n_positive": [1]})
    tie = EmbeddingTie(tied=True, how="exact", max_abs_diff=0.0, max_rel_diff=0.0, declared=True, dtypes="f / f")
    return Mechanism(
        per_head(P=[0.95, 0.2], effect_median=[0.2, -0.1]),
        signs,
        {"model_name": "syn", "n_heads": 2, "headline": "h", "notes": ["a note"]},
        head_tokens(b),
        attended_token_effect(b),
        tie,
    )


def ablation(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.ablation import Ablation

    controls = pd.DataFrame({"control": [0], "heads": ["L0H1"], "n_flagged_in_set": [0], "delta_loss": [0.01]})
    windows = pd.DataFrame({"n_tokens": [7], "clean": [2.0], "flagged": [2.1]})
    return Ablation(
        heads=per_head(loss_ablated=[2.1, 2.0], delta_loss=[0.1, 0.0], reason=["", ""]),
        controls=controls,
        summary={"delta_loss": 0.1, "p_value": 0.5, "n_controls": 1, "layers": [0], "model_name": "syn"},
        info=INFO,
        options={"kind": "zero", "n_controls": 1},
        window_losses=windows,
    )


def activation_returns(b: dict[str, Any]) -> Any:
    from tl_idempotence.probes.activations import ActivationReturns

    return ActivationReturns(
        heads=per_head(P=[0.95, 0.2], cos2_median=[0.9, 0.1]),
        summary={"n_heads": 2, "median_cos2_all": 0.5, "per_layer": [0.5]},
        info=INFO,
        options={"seq_len": 8, "control": "haar"},
    )


def trajectory(b: dict[str, Any]) -> Any:
    from tl_idempotence.studies.trajectory import Trajectory

    heads = pd.DataFrame({"checkpoint": ["a", "b"], "order": [0, 1], "step": [0, 10], "layer": [0, 0], "head": [0, 0],
                          "P": [0.5, 0.95]})  # fmt: skip
    checkpoints = pd.DataFrame({"order": [0, 1], "checkpoint": ["a", "b"], "step": [0, 10], "n_closed": [0, 1]})
    lays = pd.DataFrame({"checkpoint": ["a", "b"], "layer": [0, 0], "n_closed": [0, 1]})
    return Trajectory(heads=heads, layers=lays, checkpoints=checkpoints, threshold=0.9, options={"nulls": 0})


def closure(b: dict[str, Any]) -> Any:
    return tl_idempotence.closure(layers()[0])


def scramble(b: dict[str, Any]) -> Any:
    return tl_idempotence.orientation_scramble(layers()[0], nulls=4)


def search(b: dict[str, Any]) -> Any:
    return tl_idempotence.constructive_search(layers()[0], heads=[0], restarts=1, max_iters=3)


def mismatch(b: dict[str, Any]) -> Any:
    return tl_idempotence.mismatch(SyntheticSource(layers(), name="syn"))


def algebra(b: dict[str, Any]) -> Any:
    return report(b).algebra


def circuit(b: dict[str, Any]) -> Any:
    return report(b).circuit(["L0H0", "L1H1"], n_sets=9)


def comparison(b: dict[str, Any]) -> Any:
    from tl_idempotence.studies.compare import Comparison

    rep = report(b)
    return Comparison({"a": rep, "b": rep.with_summary(n_params=10)}, rep.options, warn=False)


def sweep_result(b: dict[str, Any]) -> Any:
    from tl_idempotence.studies.sweep import SweepResult
    from tl_idempotence.studies.sweep.task import TASK_COLUMNS

    rep = report(b)
    tasks = pd.DataFrame([dict.fromkeys(TASK_COLUMNS, "")], columns=TASK_COLUMNS).assign(label="a", status="computed")
    failed = pd.DataFrame(columns=["label", "item", "error_type", "message"])
    return SweepResult({"a": rep}, rep.options, Path("sweep-out"), tasks, failed, seconds=1.0, warn=False)


#: One factory per result type (qualified name -> a function of a cache shared by the factories).
FACTORIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "tl_idempotence.maths.closure.Closure": closure,
    "tl_idempotence.analyses.scramble.Scramble": scramble,
    "tl_idempotence.analyses.search.SearchResult": search,
    "tl_idempotence.analyses.mismatch.MismatchResult": mismatch,
    "tl_idempotence.analyses.algebra_maths.SharedValueAlgebra": algebra,
    "tl_idempotence.probes.ablation.result.Ablation": ablation,
    "tl_idempotence.probes.activations.ActivationReturns": activation_returns,
    "tl_idempotence.probes.roles.HeadRoles": head_roles,
    "tl_idempotence.probes.head_tokens.HeadTokens": head_tokens,
    "tl_idempotence.probes.token_effect.AttendedTokenEffect": attended_token_effect,
    "tl_idempotence.probes.causal.CausalClosure": causal_closure,
    "tl_idempotence.report.causal.CausalTest": causal_test,
    "tl_idempotence.report.roles.RoleAssociation": role_association,
    "tl_idempotence.report.roles.Circuit": circuit,
    "tl_idempotence.report.mechanism.Mechanism": mechanism,
    "tl_idempotence.report.result.IdempotenceReport": report,
    "tl_idempotence.studies.compare.Comparison": comparison,
    "tl_idempotence.studies.sweep.results.SweepResult": sweep_result,
    "tl_idempotence.studies.trajectory.Trajectory": trajectory,
}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """One instance of every result type (built once for this module; the report shared by those made from it)."""
    cache: dict[str, Any] = {}
    return {name: make(cache) for name, make in FACTORIES.items()}


def test_every_result_type_has_a_factory():
    found = result_types() - BASES
    assert found - set(FACTORIES) == set(), "a result type without a factory here: add one (and freeze it)"
    assert set(FACTORIES) - found == set(), "a factory of a type that is no longer a result"


# ----------------------------------------------------------------------------- what each type is checked for


def public_names(obj: Any) -> list[str]:
    """The public attributes and properties of ``obj`` (no methods)."""
    out = []
    for name in dir(obj):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(obj, name)
        if name in vars(obj) or isinstance(static, property):
            out.append(name)
    return out


def handed_out(obj: Any) -> dict[str, Any]:
    """``{name: value}`` of every public attribute and property that can be read."""
    out = {}
    for name in public_names(obj):
        try:
            out[name] = getattr(obj, name)
        except Exception:  # a property this instance has nothing for (e.g. no model): not handed out
            continue
    return out


def frame_reads(obj: Any) -> dict[str, Callable[[], pd.DataFrame]]:
    """Every way ``obj`` hands out a DataFrame: an attribute or property, or an item of a mapping it hands out."""
    reads: dict[str, Callable[[], pd.DataFrame]] = {}
    for name, value in handed_out(obj).items():
        if isinstance(value, pd.DataFrame):
            reads[name] = lambda name=name: getattr(obj, name)
        elif isinstance(value, Mapping) and not isinstance(value, FrozenSummary):
            for key, item in value.items():
                if isinstance(item, pd.DataFrame):
                    reads[f"{name}[{key!r}]"] = lambda name=name, key=key: getattr(obj, name)[key]
    return reads


@pytest.mark.parametrize("name", sorted(FACTORIES), ids=lambda n: n.rsplit(".", 1)[-1])
def test_assigning_or_deleting_an_attribute_raises(built, name):
    obj = built[name]
    cls = type(obj)
    assert qualname(cls) == name and isinstance(obj, ImmutableResult)
    before = dict(vars(obj))
    names = {n for n in vars(obj) if not n.startswith("_")} | {"summary", "heads", "not_an_attribute"}
    for attr in sorted(names - cls.settable - {"threshold"}):  # (the report's threshold: a shim that warns)
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"{cls.frozen_name} immutable \\(.+\\)"):
            setattr(obj, attr, None)
        with pytest.raises(dataclasses.FrozenInstanceError, match=f"{cls.frozen_name} immutable \\(.+\\)"):
            delattr(obj, attr)
    assert vars(obj).keys() == before.keys() and all(vars(obj)[k] is v for k, v in before.items())
    assert cls.frozen_name != ImmutableResult.frozen_name  # each names itself


@pytest.mark.parametrize("name", sorted(FACTORIES), ids=lambda n: n.rsplit(".", 1)[-1])
def test_every_frame_handed_out_is_a_copy(built, name):
    obj = built[name]
    reads = frame_reads(obj)
    assert reads, "a result hands out at least one table"
    for where, read in reads.items():
        first = read()
        kept = first.copy()
        first["__edited__"] = 1  # a column added and every row dropped, in place, on what was handed out
        first.drop(index=first.index, inplace=True)
        again = read()
        assert again is not first and "__edited__" not in again.columns, where
        pd.testing.assert_frame_equal(again, kept, obj=where)


@pytest.mark.parametrize("name", sorted(FACTORIES), ids=lambda n: n.rsplit(".", 1)[-1])
def test_the_summary_and_every_dict_or_list_are_read_only(built, name):
    obj = built[name]
    s = obj.summary
    assert isinstance(s, FrozenDict) and len(s)
    with pytest.raises(TypeError):
        s["__edited__"] = 1
    with pytest.raises(TypeError):
        s.update({"__edited__": 1})
    for v in s.values():
        if isinstance(v, dict):
            with pytest.raises(TypeError):
                v["__edited__"] = 1
        elif isinstance(v, list):
            with pytest.raises(TypeError):
                v.append(1)
    assert "__edited__" not in obj.summary
    for attr, v in handed_out(obj).items():  # stored: read-only; built by a property: a new one on each read
        if isinstance(v, (dict, list)) and not isinstance(v, (FrozenDict, FrozenList)):
            assert attr not in vars(obj) and getattr(obj, attr) is not v, f"{attr} is an editable {type(v).__name__}"


def test_a_dataclass_result_keeps_its_constructor_and_replace_gives_a_changed_copy(built):
    a = built["tl_idempotence.probes.ablation.result.Ablation"]
    b = dataclasses.replace(a, options={"kind": "mean"})
    assert b.options == {"kind": "mean"} and a.options["kind"] == "zero" and b.heads.equals(a.heads)
    assert [f.name for f in dataclasses.fields(a)] == ["heads", "controls", "summary", "info", "options",
                                                       "window_losses", "window_sums", "run_info"]  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"an ablation result is immutable \(rep\.ablation"):
        a.summary = {}
