"""What a probe joined to the report declares about itself, beside its code, without importing torch or pandas.

A joined probe (``rep.roles``, ``rep.mechanism``, ``rep.circuit``, ``rep.ablation``, ``rep.show_attention``, or a
new one) is one :class:`JoinSpec` in a small declaration module beside its report-side module
(``report/<name>_spec.py``), the way an analysis is one ``AnalysisSpec`` (``analyses/<name>_spec.py``):

* its options once (:class:`~tl_idempotence.core.option_specs.OptionSpec`: name, default, validator, help), which
  :meth:`JoinSpec.__call__` fills and validates before the join's body runs (the report's method only forwards);
* its result type (a factory importing it), and the one identity check it needs
  (:func:`check_identity`, which :meth:`IdempotenceReport.check_joins` is): a model by content (its sizes, weight
  processing unless it may differ, every measured layer's weights), head roles of the report's model;
* how a result is checked as belonging to this report (``fits``), its page section (``page``: the section the page
  template renders, drawn by the views), its record in the JSON export (``record``, under its name) and the
  per-head columns it adds to ``--csv``, ``.csv``/``.parquet`` exports and the export's ``closed_heads``
  (``columns``), its command-line flag (:class:`JoinFlag`) and its notebook display (``display``, registered in
  :data:`~tl_idempotence.core.results.DISPLAYS` under ``display_kind``).

:mod:`tl_idempotence.report.joins` lists the declarations once; the page, the exports, the command line and the
report's methods are assembled from that list. Imports no torch and no pandas (the command line's ``--help``
reads the flags).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.kwargs import by_name, unknown_option_error
from ..core.option_specs import OptionSpec
from ..core.options import check_int, check_seed
from ..errors import OptionError, OptionTypeError, RegistrationError
from .join_defaults import MAX_BATCH_SIZE, MAX_RESAMPLES, MAX_SEQ_LEN

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..core.hints import HeadsLike, JoinReport
    from ..probes.roles import HeadRoles

__all__ = [
    "MATCH_BY",
    "METHOD_CALL",
    "MODEL_CHECKS",
    "JoinFlag",
    "JoinSpec",
    "batch_size_option",
    "check_identity",
    "check_match_by",
    "controls_option",
    "count_option",
    "fits_heads",
    "int_option",
    "match_by_option",
    "model_to_run",
    "needs_model_text",
    "optional",
    "page_at_threshold",
    "report_heads",
    "resamples_option",
    "seed_option",
    "seeded_call",
    "seq_len_option",
    "tokens_option",
]

#: How a join checks a model given for it (:func:`check_identity`): ``"weights"``: its sizes, weight processing and
#: every measured layer's O/V sha256; ``"weights_any_processing"``: the same, but a model processed otherwise is
#: accepted (its bytes cannot be compared); ``None``: the join takes no model.
MODEL_CHECKS = ("weights", "weights_any_processing", None)

#: Names a join cannot take: the keys of the JSON export's own record.
_RESERVED = frozenset({"headline", "summary", "closed_heads"})


def optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """``check`` that also accepts None (returned as None): the validator of an option whose None means "not
    given" or "no limit"."""

    @functools.wraps(check)
    def checked(x: Any, name: str) -> Any:
        return None if x is None else check(x, name)

    return checked


def int_option(minimum: int | None = None, maximum: int | None = None) -> Callable[[Any, str], int]:
    """The validator of an integer option in ``[minimum, maximum]``
    (:func:`~tl_idempotence.core.options.check_int`)."""

    def checked(x: Any, name: str) -> int:
        return check_int(x, name, minimum, maximum)

    return checked


def count_option(
    name: str,
    default: int | None,
    help_: str,
    check: Callable[[Any, str], Any],
    *,
    metavar: str = "N",
    none: bool = False,
    needs_torch: bool = False,
) -> OptionSpec:
    """A join's integer option (kind ``"count"``): typed ``int`` (``IntLike``), or ``int | None`` (``IntLike | None``)
    where ``none`` (None: "not given" or "no limit", which ``check`` accepts). Raises what :class:`OptionSpec` does."""
    types = "int | None" if none else "int"
    hint = "IntLike | None" if none else "IntLike"
    return OptionSpec(
        name, default, help_, "count", metavar, types=types, hint=hint, check=check, needs_torch=needs_torch
    )


def seed_option(help_: str) -> OptionSpec:
    """A join's ``seed`` option: default 0, ``--seed S``, validated by
    :func:`~tl_idempotence.core.options.check_seed`. Raises nothing."""
    return count_option("seed", 0, help_, check_seed, metavar="S")


def resamples_option(name: str, default: int, what: str, note: str = "") -> OptionSpec:
    """A join's count of random draws (permutations, relabellings, random sets): an integer in 1 ..
    :data:`~tl_idempotence.report.join_defaults.MAX_RESAMPLES`, its help ``"{what} (1 .. {MAX_RESAMPLES}{note})"``.
    Raises what :class:`OptionSpec` does."""
    return count_option(name, default, f"{what} (1 .. {MAX_RESAMPLES}{note})", int_option(1, MAX_RESAMPLES))


def tokens_option(default: int | None, help_: str) -> OptionSpec:
    """A join's token budget ``max_tokens``: an integer >= 1, or None (no budget). Raises what :class:`OptionSpec`
    does."""
    return count_option("max_tokens", default, help_, optional(int_option(1)), none=True)


def seq_len_option(default: int | None, help_: str) -> OptionSpec:
    """A join's window length ``seq_len``: an integer in 2 ..
    :data:`~tl_idempotence.report.join_defaults.MAX_SEQ_LEN`, or also None (the probe's own default) where ``default``
    is None. Raises what :class:`OptionSpec` does."""
    check, none = int_option(2, MAX_SEQ_LEN), default is None
    return count_option("seq_len", default, help_, optional(check) if none else check, none=none)


def batch_size_option(help_: str) -> OptionSpec:
    """A join's ``batch_size``, windows per forward pass: default 8, an integer in 1 ..
    :data:`~tl_idempotence.report.join_defaults.MAX_BATCH_SIZE`. Raises nothing."""
    return count_option("batch_size", 8, help_, int_option(1, MAX_BATCH_SIZE))


def needs_model_text(flag: str, runs: str, call: str) -> str:
    """A join flag's :attr:`JoinFlag.needs_model`: ``flag`` ``runs`` (what it does with the model), and a checkpoint
    path is read as weights only, so: a zoo model, a hub name, or ``call`` in Python on a booted model. Raises
    nothing."""
    return (
        f"{flag} {runs}, and a checkpoint path is read as weights only (no model to run): use a zoo model or a hub "
        f"name, or in Python {call}(model=TransformerBridge.boot_transformers(folder))"
    )


def seeded_call(call: str) -> Callable[..., Any]:
    """A join flag's :attr:`JoinFlag.compute` that is the plain seeded call of the report's method ``call``
    (``"rep.roles"``): ``rep.roles(model=model, seed=args.seed, progress=progress)``. Raises nothing (the method
    is looked up when the flag runs)."""
    method = call.removeprefix("rep.")

    def compute(rep: Any, model: Any, value: Any, joined: Any, args: Any, progress: bool = True) -> Any:
        return getattr(rep, method)(model=model, seed=args.seed, progress=progress)

    return compute


def fits_heads(check: Callable[[pd.DataFrame, float, Any], Any]) -> Callable[[Any, Any], Any]:
    """A join's :attr:`JoinSpec.fits`: ``check(rep.heads, rep.threshold, value)``, the result checked against the
    report's heads and threshold (``check`` a :class:`~tl_idempotence.core.lazy.Lazy` reference, imported when
    first called). Raises what ``check`` raises."""

    def fits(rep: Any, value: Any) -> Any:
        return check(rep.heads, rep.threshold, value)

    return fits


def page_at_threshold(section: Callable[[Any, float], Mapping[str, Any]]) -> Callable[[Any, Any], Mapping[str, Any]]:
    """A join's :attr:`JoinSpec.page`: ``section(value, rep.threshold)``, its page section at the report's threshold
    (``section`` a :class:`~tl_idempotence.core.lazy.Lazy` reference, imported when first called). Raises what
    ``section`` raises."""

    def page(rep: Any, value: Any) -> Mapping[str, Any]:
        return section(value, rep.threshold)

    return page


def report_heads(rep: JoinReport, heads: HeadsLike | None) -> list[str]:
    """The labels (``"L10H8"``) of ``heads`` (None: every measured head; pairs, a DataFrame or labels:
    :func:`~tl_idempotence.core.selection.select_heads`), in layer and head order, against ``rep``'s sizes and
    measured layers.

    Raises:
        OptionError: a head out of range (:func:`~tl_idempotence.core.selection.select_heads`), or one the report
            did not measure (names up to ten).
    """
    from ..core.selection import head_labels, select_heads

    h = rep.heads
    measured = sorted(int(x) for x in h["layer"].unique())
    sel = select_heads(heads, measured, rep.info.n_heads, labels=True)
    pairs = [(a, b) for a, hs in sorted(sel.items()) for b in hs]
    asked = list(head_labels([a for a, _ in pairs], [b for _, b in pairs]))
    missing = [lab for lab in asked if lab not in h.index]
    if missing:
        raise OptionError(f"Heads {missing[:10]} are not heads this report measured.")
    return asked


#: The sizes matched controls can be nearest in (``core.matching.match_controls``' ``by``): |α| or ‖T‖_F.
MATCH_BY = ("abs_alpha", "norm")


def check_match_by(x: Any, name: str) -> str:
    """One of :data:`MATCH_BY`.

    Raises:
        OptionTypeError: not a string. OptionError: another string (names the choices).
    """
    if not isinstance(x, str):
        raise OptionTypeError(f"{name} must be one of {MATCH_BY}; got {type(x).__name__}.")
    if x not in MATCH_BY:
        raise OptionError(f"{name} must be one of {MATCH_BY} (|α| or ‖T‖_F); got {x!r}.")
    return x


def match_by_option(help_: str) -> OptionSpec:
    """A join's ``match_by`` option (``rep.mechanism``'s and ``rep.causal``'s matched controls): default
    ``"abs_alpha"``, one of :data:`MATCH_BY`, validated by :func:`check_match_by`. Raises nothing."""
    return OptionSpec(
        "match_by", "abs_alpha", help_, "choice", "SIZE", choices=MATCH_BY, types="str", hint="str",
        check=check_match_by,
    )  # fmt: skip


def controls_option() -> OptionSpec:
    """A join's ``n_controls`` option (``rep.mechanism``'s and ``rep.causal``'s matched controls): default 1, an
    integer in 1 .. 64. Raises nothing."""
    return count_option(
        "n_controls", 1, "matched controls per closed head (same layer, nearest size)", int_option(1, 64)
    )


@dataclass(frozen=True)
class JoinFlag:
    """A join's flag of ``tl-idempotence report`` (the parser adds it, the report command computes it).

    Attributes:
        flag: ``"--roles"``; its dashes become underscores in the parsed arguments (``args.roles``).
        help: its ``--help`` text.
        compute: ``compute(rep, model, value, joined, args) -> result``: the join computed for the command line
            (``model``: what the report was measured from, a model object or a checkpoint path; ``value``: the
            flag's value, True for a switch; ``joined``: the results of the joins before it, by name; ``args``:
            the parsed arguments, e.g. ``args.seed``). A join that shows progress bars takes ``progress`` too
            (a keyword: False with ``--quiet``), and passes it on (``rep.roles(..., progress=progress)``);
            :meth:`run` passes it only to a ``compute`` that takes it. None (the default): the plain seeded call
            of its join, which :class:`JoinSpec` fills in (:func:`seeded_call`).
        metavar: None: a switch (present = True); else the flag takes a non-empty string (``TEXT``).
        needs_model: the usage error (exit 2) when MODEL is a checkpoint path, read as weights only (no model to
            run); None: the join works on weights (a model is not loaded for it).
        page_only: what it adds to the page (``"adds attention views to the HTML page"``): refused (exit 2)
            without a ``.html`` page to add it to.
        progress: the line written to stderr before it runs (not with ``--quiet``).
        text: ``text(result) -> str``: its lines after the text summary (not with ``--json``).
    """

    flag: str
    help: str
    compute: Callable[..., Any] | None = None
    metavar: str | None = None
    needs_model: str | None = None
    page_only: str | None = None
    progress: str | None = None
    text: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        name = self.flag[2:].replace("-", "_") if isinstance(self.flag, str) else ""
        if not (isinstance(self.flag, str) and self.flag.startswith("--") and name.isidentifier()):
            raise RegistrationError(f"a join's flag is '--name' (letters, digits, dashes); got {self.flag!r}.")
        if not isinstance(self.help, str) or not self.help:
            raise RegistrationError(f"flag {self.flag}: help must be a non-empty str; got {self.help!r}.")
        for what in ("metavar", "needs_model", "page_only", "progress"):
            v = getattr(self, what)
            if v is not None and not (isinstance(v, str) and v):
                raise RegistrationError(f"flag {self.flag}: {what} must be None or a non-empty str; got {v!r}.")
        for what in ("compute", "text"):
            v = getattr(self, what)
            if not callable(v) and v is not None:
                raise RegistrationError(f"flag {self.flag}: {what} must be a function; got {v!r}.")

    @property
    def dest(self) -> str:
        """The attribute of the parsed arguments (``--attention-text``: ``attention_text``)."""
        return self.flag[2:].replace("-", "_")

    @property
    def takes_progress(self) -> bool:
        """Whether :attr:`compute` takes ``progress`` (a parameter of that name, or ``**kwargs``)."""
        import inspect

        if self.compute is None:
            return False
        try:
            params = inspect.signature(self.compute).parameters.values()
        except (TypeError, ValueError):  # pragma: no cover - a callable without a signature
            return False
        return any(p.name == "progress" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

    def run(self, rep: Any, model: Any, value: Any, joined: Mapping[str, Any], args: Any, *, progress: bool) -> Any:
        """:attr:`compute` for the command line, with ``progress`` (its bars on stderr, or none with ``--quiet``)
        when it takes it (:attr:`takes_progress`).

        Raises:
            RegistrationError: no ``compute`` (a flag outside a :class:`JoinSpec`, which fills it in). What
                ``compute`` raises.
        """
        if self.compute is None:
            raise RegistrationError(f"flag {self.flag}: compute is None (a JoinSpec fills in its seeded call).")
        if self.takes_progress:
            return self.compute(rep, model, value, joined, args, progress=progress)
        return self.compute(rep, model, value, joined, args)


#: :attr:`JoinSpec.call` when not given: the report's method of the join's name (``"rep.roles"``).
METHOD_CALL = "rep.<name>"


@dataclass(frozen=True, kw_only=True)
class JoinSpec:
    """One probe joined to the report, declared once (module docstring).

    Attributes:
        name: the join's name: its key in the ``joins`` mapping of the page and the exports, and of its record in
            the JSON export.
        call: how users call it, for messages (``"rep.roles"``); not given (:data:`METHOD_CALL`): ``"rep."`` and
            :attr:`name`, the report's method of that name.
        result: a factory returning its result type (imported when called: the declaration stays torch-free).
        run: the join's body, ``run(rep, *inputs, **options)``: the options arrive filled with their defaults and
            validated (:meth:`__call__`); it checks identity (:meth:`model_of`, :func:`check_identity`) before any
            model runs.
        options: its options (:class:`~tl_idempotence.core.option_specs.OptionSpec`: name, default, validator,
            help); the report's method states the same defaults in its signature (a test checks they agree).
        model: how a model given for it is checked (:data:`MODEL_CHECKS`).
        why: what runs the model, for the error without one (``"the head detector runs it on tokens"``).
        roles: whether it takes ``roles=`` (head roles of the report's model, checked by :func:`check_identity`).
        fits: ``fits(rep, value) -> value``: ``value`` checked as this report's (refuses a result of another
            report, never joined to the wrong heads by label); None: the join has no page or export.
        page: ``page(rep, value) -> section``: its section of the page (a mapping the views render:
            :func:`~tl_idempotence.views.page.report_html`'s ``sections``), or None.
        record: ``record(value) -> JSON-able``: what the JSON export holds under :attr:`name`, or None.
        columns: ``columns(value) -> DataFrame``: per-head columns indexed by label, added to the heads table of
            the exports (``--csv``) and to the export's ``closed_heads`` (those the heads do not have yet), or None.
        cli: its command-line flag, or None; a flag without ``compute`` gets the plain seeded call of :attr:`call`
            (:func:`seeded_call`: ``rep.roles(model=model, seed=args.seed, progress=progress)``).
        display: ``display(result) -> HTML``: its notebook display, registered under :attr:`display_kind` (None:
            the views draw its result's ``display_kind`` already, or the generic display does).
        display_kind: the ``display_kind`` its result type declares (with ``display``).
    """

    name: str
    call: str = METHOD_CALL
    result: Callable[[], type]
    run: Callable[..., Any]
    options: tuple[OptionSpec, ...] = ()
    model: str | None = None
    why: str = ""
    roles: bool = False
    fits: Callable[[Any, Any], Any] | None = None
    page: Callable[[Any, Any], Mapping[str, Any]] | None = None
    record: Callable[[Any], Any] | None = None
    columns: Callable[[Any], pd.DataFrame] | None = None
    cli: JoinFlag | None = None
    display: Callable[[Any], str] | None = None
    display_kind: str = "result"

    def __post_init__(self) -> None:
        def refuse(what: str) -> RegistrationError:
            return RegistrationError(f"join {self.name!r}: {what}")

        if not isinstance(self.name, str) or not self.name.isidentifier() or self.name.startswith("_"):
            raise RegistrationError(f"a join's name must be a public identifier; got {self.name!r}.")
        if self.name in _RESERVED:
            raise refuse(f"the JSON export already has the key {self.name!r}; choose another name.")
        if self.call == METHOD_CALL:
            object.__setattr__(self, "call", f"rep.{self.name}")
        if not isinstance(self.call, str) or not self.call:
            raise refuse(f"call must be how users call it (a str such as 'rep.{self.name}'); got {self.call!r}.")
        if not isinstance(self.options, tuple) or not all(isinstance(o, OptionSpec) for o in self.options):
            raise refuse(f"options must be a tuple of OptionSpec; got {self.options!r}.")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise refuse(f"an option is declared twice: {names}.")
        if self.model not in MODEL_CHECKS:
            raise refuse(f"model must be one of {MODEL_CHECKS}; got {self.model!r}.")
        if not isinstance(self.why, str) or not isinstance(self.roles, bool):
            raise refuse("why must be a str and roles a bool.")
        for what in ("result", "run"):
            if not callable(getattr(self, what)):
                raise refuse(f"{what} must be a function; got {getattr(self, what)!r}.")
        for what in ("fits", "page", "record", "columns", "display"):
            v = getattr(self, what)
            if v is not None and not callable(v):
                raise refuse(f"{what} must be a function or None; got {v!r}.")
        if self.fits is None and (self.page or self.record or self.columns):
            raise refuse("a join on the page or in the exports declares fits (its result checked as the report's).")
        if self.cli is not None and not isinstance(self.cli, JoinFlag):
            raise refuse(f"cli must be a JoinFlag or None; got {self.cli!r}.")
        if self.cli is not None and self.cli.compute is None:
            if not self.call.startswith("rep.") or not self.call[4:].isidentifier():
                raise refuse(f"its flag {self.cli.flag} needs compute: {self.call!r} is no method of the report.")
            object.__setattr__(self, "cli", dataclasses.replace(self.cli, compute=seeded_call(self.call)))
        if not isinstance(self.display_kind, str) or (self.display is not None and self.display_kind == "result"):
            raise refuse("a display is registered under the display_kind of its result type (not 'result').")

    def option(self, name: str) -> OptionSpec:
        """The declared option ``name``.

        Raises:
            KeyError: no such option (names the declared ones).
        """
        return by_name(
            self.options, name, lambda names: KeyError(f"join {self.name!r} has no option {name!r}; options: {names}")
        )

    def defaults(self) -> dict[str, Any]:
        """``{option: default}`` in declaration order."""
        return {o.name: o.default for o in self.options}

    def validated(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared option, given (checked by its validator) or its default, in declaration order; other
        keywords pass unchanged after them.

        Raises:
            OptionTypeError / OptionError: an option its validator refuses (names it).
        """
        out = {o.name: o.validate(options[o.name]) if o.name in options else o.default for o in self.options}
        return {**out, **{k: v for k, v in options.items() if k not in out}}

    def __call__(self, rep: Any, *inputs: Any, **options: Any) -> Any:
        """Run the join with ``rep``: its options filled and validated (:meth:`validated`), then :attr:`run`.

        Raises:
            UnknownOptionError: a keyword that is neither an option nor an input of :attr:`run` (names the closest).
            The errors of the validators and of :attr:`run`.
        """
        import inspect

        params = inspect.signature(self.run).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            known = [n for n in list(params)[1:] if params[n].kind is not inspect.Parameter.VAR_POSITIONAL]
            unknown = [k for k in options if k not in known]
            if unknown:
                raise unknown_option_error(f"{self.call}()", unknown, known)
        return self.run(rep, *inputs, **self.validated(options))

    def model_of(self, rep: Any, model: Any) -> Any:
        """The model the join runs: ``model``, else the report's own while it is alive (:func:`model_to_run`),
        checked against the report by content as :attr:`model` declares (:func:`check_identity`), before it runs.

        Raises:
            OptionError: neither model. ReportMismatchError (an OptionError): another model, or the report's own
                edited in place since.
        """
        m = model_to_run(rep, model, self.call, self.why)
        check_identity(rep, model=m, processing_may_differ=self.model == "weights_any_processing")
        return m


def model_to_run(rep: Any, model: Any, call: str, why: str) -> Any:
    """``model``, else ``rep``'s own live model, for a join that runs it (``call``: ``"rep.roles"``; ``why``: what
    runs it). The caller checks it against the report (:func:`check_identity`).

    Raises:
        OptionError: neither is given (names ``call`` and the model the report was measured from).
    """
    m = model if model is not None else rep.model
    if m is None:
        raise OptionError(
            f"{call} needs a TransformerLens model to run ({why}): this report was measured from "
            f"{rep.info.model_class} {rep.info.model_name!r}, which is not alive here or gives weights only (a "
            f"checkpoint path, a HeadSource). Pass {call}(model=...) with the HookedTransformer or "
            "TransformerBridge of the same weights."
        )
    return m


def check_identity(
    rep: Any, *, model: Any = None, roles: Any = None, processing_may_differ: bool = False
) -> HeadRoles | None:
    """The one check every join with a report takes (what :meth:`IdempotenceReport.check_joins` is; its docstring
    says what is compared): ``model`` and ``roles`` must be of the model ``rep`` measured, by content
    (:func:`~tl_idempotence.report.identity.check_report_matches`).

    Returns:
        The HeadRoles of ``roles`` (None without ``roles``).

    Raises:
        ReportMismatchError (an OptionError): other sizes, processing or weights (names the layer and what
            differs); roles that record no fingerprints. OptionError: a RoleAssociation joined with another report
            (names the heads). OptionTypeError: ``roles`` is neither result.
    """
    from ..probes.roles import HeadRoles
    from ..sources.dispatch import head_source
    from .identity import check_report_matches
    from .roles import RoleAssociation, check_roles_fit_report

    if model is not None:
        src = head_source(model)
        own = rep.model is not None and model is rep.model
        what = (
            f"The report's own model, {src.info.model_name!r} ({type(model).__name__}), as it is now (changed "
            "in place since the report was made?),"
            if own
            else f"The model given, {src.info.model_name!r} ({type(model).__name__}),"
        )
        fix = (
            "Make the report again from the model as it is now (tli.idempotence_report(model))."
            if own
            else "Pass the model the report was made from, with the same weight processing."
        )
        check_report_matches(rep, what=what, fix=fix, source=src, processing_may_differ=processing_may_differ)
    if roles is None:
        return None
    if isinstance(roles, RoleAssociation):
        check_roles_fit_report(rep._heads, rep.threshold, roles)
        if roles.roles is None:
            raise OptionError("This RoleAssociation carries no HeadRoles (it was not made by rep.roles).")
        roles = roles.roles
    if not isinstance(roles, HeadRoles):
        raise OptionTypeError(
            f"roles must be a HeadRoles (tli.head_roles) or a RoleAssociation (rep.roles); got {type(roles).__name__}."
        )
    fps = roles.layer_fingerprints
    check_report_matches(
        rep,
        what=f"The model of the roles given, {roles.info.model_name!r},",
        fix="Pass the head roles of the model the report was made from (tli.head_roles(model)).",
        info=roles.info,
        fingerprints={} if fps is None else fps,
    )
    return roles
