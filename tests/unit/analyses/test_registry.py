"""An analysis declares itself once (analyses/<name>_spec.py) and the registry (analyses/registry.py) lists it once:
the report options, ReportOptions, the CLI's flags, the options docs, the compared options, rep.heads, rep.summary
and compare's table are assembled from it. A toy analysis registered here (its module is this file; one registry
entry, added by monkeypatch) shows up in all of them with no other file edited."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import gaussian_layer
from tl_idempotence.analyses import registry
from tl_idempotence.analyses.base import Analysis, LayerContext, LayerResult
from tl_idempotence.analyses.report_options import ReportOptions, ReportOptionsArgs, options_doc, report_options
from tl_idempotence.analyses.spec import ANALYSIS_MEMBERS, AnalysisSpec, SummaryRecord, check_analysis, rule
from tl_idempotence.analyses.threshold import Flag, FunctionRule
from tl_idempotence.cli import build_parser
from tl_idempotence.core.heads import LayerHeads
from tl_idempotence.core.lazy import Lazy
from tl_idempotence.core.option_specs import OptionSpec
from tl_idempotence.core.options import check_bool
from tl_idempotence.errors import OptionError, OptionTypeError, RegistrationError, TLIError, UnknownOptionError
from tl_idempotence.report.identity import compared_options

# ----------------------------------------------------------------------------- the toy analysis (its whole module)

TOY = OptionSpec("toy", False, "the toy analysis: P squared per head", "flag", check=check_bool, absent=False)


@dataclass(frozen=True)
class ToySummary(SummaryRecord):
    """The toy's summary: how many heads it squared, and the largest P squared (NaN when no P is defined)."""

    bounds = (("n_toy_heads", "n_heads"),)

    n_toy_heads: int = field(metadata=rule("count"))
    max_P_squared: float = field(metadata=rule("P"))


@dataclass(frozen=True)
class TakenFieldSummary(SummaryRecord):
    """A summary whose field the search's summary already has."""

    n_feasible_layers: int = field(metadata=rule("count"))


class ToyAnalysis:
    name: ClassVar[str] = "toy"
    reason_column: ClassVar[str | None] = None

    def enabled(self, options: ReportOptions) -> bool:
        return bool(options["toy"])

    def run(self, ctx: LayerContext) -> LayerResult:
        P = ctx.closure.P.numpy()
        return LayerResult(columns={"toy_P_squared": P * P})

    def summarize(self, heads: pd.DataFrame, layers: Any, tables: Any, options: ReportOptions) -> dict[str, Any]:
        sq = heads["toy_P_squared"].to_numpy(dtype=float)
        return {"n_toy_heads": len(sq), "max_P_squared": float(np.nanmax(sq)) if np.isfinite(sq).any() else np.nan}


TOY_SPEC = AnalysisSpec(
    name="toy",
    implementation=ToyAnalysis,
    options=(TOY,),
    head_columns=("toy_P_squared",),
    summary=ToySummary,
    compared=("max_P_squared",),
)


@pytest.fixture
def with_toy(monkeypatch):
    """The one registry line the toy needs (the registry restored afterwards)."""
    monkeypatch.setattr(registry, "ANALYSES", registry.ANALYSES)
    registry.register(TOY_SPEC)


def layers_of(seed: int) -> list[LayerHeads]:
    g = torch.Generator().manual_seed(seed)
    return [
        LayerHeads(l, torch.randn(4, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g), tli.kv_layout(4, 2))
        for l in range(2)
    ]


# ----------------------------------------------------------------------------- the toy, everywhere


def test_a_registered_analysis_gets_its_option_everywhere(with_toy):
    assert [o.name for o in report_options()] == [
        "threshold",
        "nulls",
        "seed",
        "search",
        "algebra",
        "toy",  # a new analysis's option sorts after the paper's (position 50)
        "layers",
        "compute_dtype",
        "device",
    ]
    assert ReportOptions()["toy"] is False and ReportOptions(toy=True)["toy"] is True
    assert ReportOptions(toy=True).key()["toy"] is True and "toy" in ReportOptions().as_dict()
    assert ReportOptions(toy=True) != ReportOptions()
    with pytest.raises(OptionTypeError, match="toy must be True or False; got int 1"):
        ReportOptions(toy=1)
    with pytest.raises(UnknownOptionError, match="toi"):
        ReportOptions(toi=True)
    # a record saved before the toy existed means the toy did not run (its declared ``absent``)
    old = {k: v for k, v in ReportOptions(nulls=4).as_dict().items() if k != "toy"}
    assert ReportOptions.from_record(old) == ReportOptions(nulls=4)
    assert compared_options() == ("threshold", "nulls", "seed", "search", "algebra", "toy", "compute_dtype", "layers")
    assert "        toy (bool): the toy analysis: P squared per head. Default False." in options_doc().splitlines()


def test_a_registered_analysis_gets_its_cli_flag(with_toy, capsys):
    p = build_parser()
    assert p.parse_args(["report", "--toy"]).toy is True and p.parse_args(["report"]).toy is False
    with pytest.raises(SystemExit):
        p.parse_args(["report", "--help"])
    assert re.search(r"--toy\s+the toy analysis: P squared per head", capsys.readouterr().out)


def test_a_registered_analysis_gets_its_columns_summary_and_compare_column(with_toy, tmp_path):
    lhs = layers_of(5)
    rep = tli.idempotence_report(lhs, toy=True, nulls=4, progress=False)
    P = rep.heads["P"].to_numpy()
    np.testing.assert_array_equal(rep.heads["toy_P_squared"].to_numpy(), P * P)
    s = rep.summary
    assert isinstance(s.toy, ToySummary) and s.toy.n_toy_heads == 8
    assert s.toy.max_P_squared == float(np.max(P * P)) == s["max_P_squared"]
    assert s.scramble.n_scramble_draws == 4  # the paper's records beside it
    # at another threshold and through a saved report, the toy's record is recomputed the same
    assert rep.with_threshold(0.2).summary.toy == s.toy
    back = tli.load_report(rep.save(tmp_path / "r"))
    assert back.summary.toy == s.toy and back.options["toy"] is True

    off = tli.idempotence_report(lhs, nulls=4, progress=False)
    assert off.summary.toy is None and "toy_P_squared" not in off.heads.columns and "max_P_squared" not in off.summary
    assert off.summary.closure.n_closed == s.closure.n_closed and off.summary.scramble == s.scramble

    other = tli.idempotence_report(layers_of(6), toy=True, nulls=4, progress=False)
    cmp = tli.compare({"a": rep, "b": other}, progress=False)
    t = cmp.table.set_index("model")
    assert t.loc["a", "max_P_squared"] == s.toy.max_P_squared
    assert t.loc["b", "max_P_squared"] == other.summary.toy.max_P_squared
    assert list(t.columns).index("max_P_squared") == list(t.columns).index("raw_weights") - 1


def test_a_toy_summary_is_checked_by_its_rules(with_toy):
    rep = tli.idempotence_report(layers_of(5), toy=True, progress=False)
    d = rep.summary.to_dict()
    with pytest.raises(OptionError, match=re.escape("summary field n_toy_heads=9 is impossible: more than n_heads=8")):
        rep.summary.replace(n_toy_heads=9)
    with pytest.raises(OptionError, match=re.escape("summary field max_P_squared=1.5 is impossible")):
        type(rep.summary).from_dict({**d, "max_P_squared": 1.5})
    with pytest.raises(OptionError, match=re.escape("summary lacks ['max_P_squared']")):
        type(rep.summary).from_dict({k: v for k, v in d.items() if k != "max_P_squared"})


@pytest.mark.parametrize(
    "change,words",
    [
        (
            dict(head_columns=("toy_P_squared", "P_scrambled_median")),
            "its head column 'P_scrambled_median' belongs to analysis 'scramble'",
        ),
        (
            dict(head_columns=("toy_P_squared", "closed")),
            "its head column 'closed' belongs to analysis 'closure'",
        ),
        (
            dict(summary=TakenFieldSummary, compared=()),
            "its summary field 'n_feasible_layers' belongs to analysis 'search'",
        ),
        (
            dict(options=(dataclasses.replace(TOY, name="seed"),)),
            "its option 'seed' belongs to the report's own options",
        ),
        (dict(options=(dataclasses.replace(TOY, name="nulls"),)), "its option 'nulls' belongs to analysis 'scramble'"),
        (dict(name="algebra", options=()), "its name 'algebra' belongs to analysis 'algebra'"),
    ],
    ids=["head column", "closure column", "summary field", "general option", "analysis option", "name"],
)
def test_a_taken_name_is_refused_at_registration_naming_both_owners(monkeypatch, change, words):
    monkeypatch.setattr(registry, "ANALYSES", registry.ANALYSES)
    before = registry.ANALYSES
    clash = dataclasses.replace(TOY_SPEC, **change)
    with pytest.raises(RegistrationError, match=re.escape(f"cannot register analysis {clash.name!r}: {words}")):
        registry.register(clash)
    assert registry.ANALYSES is before  # nothing added
    assert [o.name for o in report_options()] == ReportOptions.names()  # the options as before
    registry.register(TOY_SPEC)  # the toy as declared takes no name of another
    assert registry.ANALYSES == (*before, TOY_SPEC)


def test_a_registration_error_is_the_librarys_value_error():
    assert issubclass(RegistrationError, TLIError) and issubclass(RegistrationError, ValueError)
    with pytest.raises(OptionTypeError, match="takes an AnalysisSpec; got str"):  # a TypeError, as before
        registry.register("toy")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- what the registry cannot run


class NoRun:
    """An object with every member of an analysis but ``run``."""

    name = "toy"
    reason_column = None

    def enabled(self, options: Any) -> bool:
        return True

    def summarize(self, *args: Any) -> dict[str, Any]:
        return {}


def raising() -> Any:
    return 1 / 0


def analysis_with(**members: Any) -> Any:
    """A factory of a toy analysis with some members replaced."""
    return lambda: type("Changed", (ToyAnalysis,), members)()


#: (what is changed in TOY_SPEC, the error, the words): every field of the wrong type is refused when the declaration
#: is built; the last rows build a declaration and are refused by ``register``, which builds the implementation.
HOSTILE: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("name not a str", dict(name=5), OptionTypeError, "an analysis name must be a str; got int 5"),
    ("name not an identifier", dict(name="my toy"), OptionError, "must be a public identifier; got 'my toy'"),
    ("implementation a str", dict(implementation="notcallable"), OptionTypeError,
     "analysis 'toy': implementation must be a zero-argument callable returning its Analysis (a factory or the "
     "class); got str 'notcallable'."),
    ("options holds an int", dict(options=[1]), OptionTypeError,
     "analysis 'toy': options must be a tuple (or list) of OptionSpec; it holds int 1."),
    ("options one spec", dict(options=TOY), OptionTypeError, "analysis 'toy': options must be a tuple (or list) of "
     "OptionSpec; got OptionSpec"),
    ("head_columns a str", dict(head_columns="x"), OptionTypeError,
     "analysis 'toy': head_columns must be a tuple (or list) of str; got str 'x'."),
    ("head_columns holds an int", dict(head_columns=("toy_P_squared", 3)), OptionTypeError,
     "analysis 'toy': head_columns must be a tuple (or list) of str; it holds int 3."),
    ("head_columns twice", dict(head_columns=("toy_P_squared", "toy_P_squared")), OptionError,
     "analysis 'toy': head_columns names ['toy_P_squared'] twice."),
    ("summary a type", dict(summary=int), OptionTypeError,
     "analysis 'toy': summary must be a SummaryRecord subclass or None; got type <class 'int'>."),
    ("summary a record", dict(summary=ToySummary(n_toy_heads=1, max_P_squared=0.5)), OptionTypeError,
     "analysis 'toy': summary must be a SummaryRecord subclass or None; got ToySummary"),
    ("compared an int", dict(compared=5), OptionTypeError,
     "analysis 'toy': compared must be a tuple (or list) of str; got int 5."),
    ("compared no field", dict(compared=("nope",)), OptionError,
     "analysis toy: compared fields ['nope'] are not fields of its summary record."),
    ("threshold_rules an object", dict(threshold_rules=[object()]), OptionTypeError,
     "analysis 'toy': threshold_rules must be a tuple (or list) of Flag, CountPerLayer, FractionPerHead or "
     "FunctionRule; it holds object <object object at"),
    ("threshold_rules a rule", dict(threshold_rules=Flag("toy_closed", "P")), OptionTypeError,
     "analysis 'toy': threshold_rules must be a tuple (or list) of Flag, CountPerLayer, FractionPerHead or "
     "FunctionRule; got Flag Flag(column='toy_closed'"),
    ("function rule not callable", dict(threshold_rules=(FunctionRule("f"),)), OptionTypeError,  # type: ignore[arg-type]
     "analysis 'toy': threshold_rules must be rules whose FunctionRule.function is callable; got str 'f'."),
    # built and refused by register (a user's registration builds its implementation at once)
    ("returns None", dict(implementation=lambda: None), OptionTypeError,
     "analysis 'toy': its implementation returned NoneType None, which is no Analysis: it has no name, "
     "reason_column, enabled, run, summarize"),
    ("returns a class", dict(implementation=lambda: ToyAnalysis), OptionTypeError,
     "analysis 'toy': its implementation returned the class ToyAnalysis, not an analysis object"),
    ("returns no run", dict(implementation=NoRun), OptionTypeError, "which is no Analysis: it has no run (an"),
    ("returns another name", dict(implementation=analysis_with(name="other")), OptionError,
     "analysis toy: its implementation is named 'other'."),
    ("reason_column an int", dict(implementation=analysis_with(reason_column=5)), OptionTypeError,
     "analysis 'toy': its reason_column must be a str or None; got int 5."),
    ("run not a method", dict(implementation=analysis_with(run="x")), OptionTypeError,
     "analysis 'toy': its implementation's run must be methods."),
    ("implementation raises", dict(implementation=raising), OptionError,
     "analysis 'toy': its implementation <function raising at"),
    ("lazy of no module", dict(implementation=Lazy("tl_idempotence.analyses.no_toy", "ToyAnalysis")), OptionError,
     "analysis 'toy': its implementation Lazy('tl_idempotence.analyses.no_toy:ToyAnalysis') raised "
     "ModuleNotFoundError: No module named 'tl_idempotence.analyses.no_toy'"),
    ("lazy of no class", dict(implementation=Lazy("tl_idempotence.analyses.spec", "ToyAnalysis")), OptionError,
     "analysis 'toy': its implementation Lazy('tl_idempotence.analyses.spec:ToyAnalysis') raised AttributeError"),
]  # fmt: skip


def refused_registration(change: dict[str, Any]) -> None:
    """Declare the toy with ``change`` (refused there, or built) and register it."""
    registry.register(dataclasses.replace(TOY_SPEC, **change))


@pytest.mark.parametrize("change,error,words", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_the_registry_refuses_what_it_cannot_run_with_the_librarys_error(monkeypatch, change, error, words):
    monkeypatch.setattr(registry, "ANALYSES", registry.ANALYSES)
    before = registry.ANALYSES
    with pytest.raises(error, match=re.escape(words)):
        refused_registration(change)
    assert registry.ANALYSES is before
    if "implementation" not in change or change["implementation"] == "notcallable":
        return
    # a declaration edited after it was built (its own checks passed) is checked again by register
    edited = dataclasses.replace(TOY_SPEC)
    object.__setattr__(edited, "implementation", change["implementation"])
    with pytest.raises(error, match=re.escape(words)):
        registry.register(edited)
    assert registry.ANALYSES is before


def test_register_checks_a_declaration_edited_after_it_was_built(monkeypatch):
    monkeypatch.setattr(registry, "ANALYSES", registry.ANALYSES)
    edited = dataclasses.replace(TOY_SPEC)
    object.__setattr__(edited, "head_columns", "x")
    with pytest.raises(OptionTypeError, match=re.escape("analysis 'toy': head_columns must be a tuple (or list)")):
        registry.register(edited)
    assert registry.ANALYSES == registry.BUILT_IN


def test_a_refused_registration_leaves_the_registry_and_later_reports_as_they_were(monkeypatch):
    monkeypatch.setattr(registry, "ANALYSES", registry.ANALYSES)
    before = tli.idempotence_report(layers_of(5), nulls=4, progress=False)
    for what, change, error, _ in HOSTILE:
        with pytest.raises(error):
            refused_registration(change)
        assert registry.ANALYSES == registry.BUILT_IN, what
    after = tli.idempotence_report(layers_of(5), nulls=4, progress=False)
    pd.testing.assert_frame_equal(after.heads, before.heads)
    assert after.summary == before.summary and after.options == before.options


def test_the_built_in_analyses_build_an_analysis_of_their_name():
    """The paper's analyses are registered without being built (importing the registry imports no torch), so they
    are built and checked here, as register builds a user's."""
    assert registry.ANALYSES[: len(registry.BUILT_IN)] == registry.BUILT_IN
    for spec in registry.BUILT_IN:
        made = spec.analysis()
        check_analysis(spec.name, made)
        assert isinstance(made, Analysis) and made.name == spec.name
    protocol = {n for n in vars(Analysis) if not n.startswith("_")} | set(Analysis.__annotations__)
    assert set(ANALYSIS_MEMBERS) == protocol  # the torch-free list is the protocol's


# ----------------------------------------------------------------------------- the paper's analyses, as declared


def test_the_typed_dict_for_static_tools_equals_the_registry():
    """ReportOptionsArgs is the second listing (for **options in editors and type checkers): the same names, in
    order, each annotated with its declared hint."""
    hints = dict(ReportOptionsArgs.__annotations__)
    assert list(hints) == [o.name for o in report_options()]
    assert {k: getattr(v, "__forward_arg__", v) for k, v in hints.items()} == {o.name: o.hint for o in report_options()}


def test_the_registry_lists_the_papers_analyses_in_column_order():
    assert [s.name for s in registry.ANALYSES] == ["closure", "scramble", "mismatch", "search", "algebra"]
    assert [a.name for a in registry.report_analyses()] == [s.name for s in registry.ANALYSES]
    assert [o.name for o in registry.analysis_options()] == ["nulls", "search", "algebra"]
    assert registry.spec_of("scramble").options[0].name == "nulls"
    with pytest.raises(KeyError, match="registered"):
        registry.spec_of("nope")


@pytest.mark.parametrize("spec", registry.ANALYSES, ids=lambda s: s.name)
def test_each_analysis_declares_the_head_columns_it_writes(spec, small_search_budget):
    lh = gaussian_layer(1, 6, 2, 24, 4, seed=11)
    res = spec.analysis().run(LayerContext.build(lh, ReportOptions(nulls=4, search=True, algebra=True)))
    assert tuple(res.columns) == spec.head_columns


def test_the_options_keep_their_values_and_encoding():
    """ReportOptions built from the declarations: the same key and record as the hand-written class of 0.2."""
    o = ReportOptions(nulls=True, seed=3, layers=[1, 0], compute_dtype="float32")
    assert o.key() == {
        "threshold": 0.9,
        "nulls": 64,
        "seed": 3,
        "search": False,
        "algebra": False,
        "compute_dtype": "float32",
        "device": "cpu",
    }
    assert o.as_dict() == {**o.key(), "layers": [1, 0]}
    assert o.compute_dtype is torch.float32 and o.device == torch.device("cpu") and o.layers == (1, 0)
    assert list(ReportOptions.names()) == [
        "threshold",
        "nulls",
        "seed",
        "search",
        "algebra",
        "layers",
        "compute_dtype",
        "device",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 4  # type: ignore[misc]
    assert hash(o) == hash(ReportOptions(nulls=64, seed=3, layers=(1, 0), compute_dtype=torch.float32))


def test_the_report_is_immutable_but_for_the_threshold_shim():
    rep = tli.idempotence_report(layers_of(5), nulls=4, progress=False)
    for name in ("summary", "heads", "options", "inputs", "anything"):
        with pytest.raises(dataclasses.FrozenInstanceError, match="a report is immutable"):
            setattr(rep, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del rep.summary
    more = rep.with_summary(n_params=1234)
    assert more.summary.n_params == 1234 and rep.summary.n_params is None and more.heads.equals(rep.heads)
    at = rep.with_threshold(0.05)
    with pytest.warns(DeprecationWarning, match="Assigning rep.threshold is deprecated"):
        rep.threshold = 0.05
    assert rep.threshold == 0.05 and rep.summary.closure == at.summary.closure
    assert rep.summary.closure.n_closed == int((rep.heads["P"] >= 0.05).sum())


def test_the_report_and_its_typed_summary_pickle():
    import pickle

    rep = tli.idempotence_report(layers_of(5), nulls=4, search=True, progress=False)
    back = pickle.loads(pickle.dumps(rep))
    assert back.summary == rep.summary and back.summary.scramble == rep.summary.scramble
    assert back.options == rep.options and back.summary.search.n_feasible_layers == rep.summary["n_feasible_layers"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.summary = rep.summary


def test_summary_algebra_reads_as_in_0_2_and_the_record_is_under_analyses():
    """``summary.algebra`` is 0.2's flat field (the algebra's summary dict), never the typed record: code written for
    0.2 (``rep.summary.algebra.get("n_groups")``) must not silently read None from the record's own mapping."""
    import torch

    import tl_idempotence as tli
    from tl_idempotence.core.heads import LayerHeads, kv_layout

    g = torch.Generator().manual_seed(1)
    V = torch.randn(2, 8, 2, generator=g, dtype=torch.float64)  # 2 kv heads, 4 query heads: kv groups of 2
    O = torch.randn(4, 8, 2, generator=g, dtype=torch.float64)
    rep = tli.idempotence_report([LayerHeads(0, O, V, kv_layout(4, 2))], algebra=True, progress=False)
    flat = rep.summary["algebra"]
    assert isinstance(flat, dict) and flat
    assert rep.summary.algebra == flat
    for k, v in flat.items():
        assert rep.summary.algebra.get(k) == v
    record = rep.summary.analyses["algebra"]
    assert record.algebra == flat and record.algebra_ranges_threshold == rep.summary["algebra_ranges_threshold"]
    assert rep.summary.scramble is None  # an analysis that did not run: None, as before


def test_a_summarys_records_cannot_be_replaced_or_dropped_and_it_still_pickles():
    import pickle

    import torch

    import tl_idempotence as tli
    from tl_idempotence.core.heads import LayerHeads, kv_layout

    g = torch.Generator().manual_seed(2)
    V = torch.randn(2, 8, 2, generator=g, dtype=torch.float64)
    rep = tli.idempotence_report([LayerHeads(0, V.clone(), V, kv_layout(2, 2))], progress=False)
    s = rep.summary
    with pytest.raises(TypeError):
        s.analyses["closure"] = s.analyses["closure"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        s.analyses.pop("closure")  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(s))  # Dask sends reports between processes
    assert back == s and back.closure == s.closure and dict(back.analyses) == dict(s.analyses)


def test_a_report_and_a_resume_folder_saved_before_an_option_existed_read_it_as_absent(tmp_path, monkeypatch):
    """The next analysis added the registry way: a report saved before its option existed loads with the option's
    declared ``absent`` value (it was refused: "'(absent)' in the record but False"), and a resume folder from before
    is reused with its parts recomputed (a warning names each), equal to a fresh report."""
    saved = tli.load_report(tli.idempotence_report(layers_of(0), nulls=4, progress=False).save(tmp_path / "r"))
    parts = tmp_path / "parts"
    tli.idempotence_report(layers_of(0), nulls=4, progress=False, resume=parts)
    monkeypatch.setattr(registry, "ANALYSES", registry.ANALYSES)
    registry.register(TOY_SPEC)  # the option is declared now
    back = tli.load_report(tmp_path / "r")
    assert back.options["toy"] is False and back.options == ReportOptions(nulls=4)
    assert back.heads.equals(saved.heads)
    with pytest.warns(UserWarning, match="made with other options; recomputing layer"):
        resumed = tli.idempotence_report(layers_of(0), nulls=4, progress=False, resume=parts)
    fresh = tli.idempotence_report(layers_of(0), nulls=4, progress=False)
    assert resumed.heads.equals(fresh.heads)
