"""The report options' declaration record, the report's own options, and the validators that need no torch.

Every route into a report — ``idempotence_report``, the TransformerLens method, ``compare``, ``sweep``,
``run_sweep_item``, ``trajectory`` and the command line — takes the same options with the same names,
defaults and validation, each declared once:

* :class:`OptionSpec` — one option's name, default, validator, help, types and command-line form;
* :data:`GENERAL_OPTIONS` — the report's own options (threshold, seed, layers, compute_dtype, device), here;
  each analysis declares the option that switches it on beside its code (``analyses/<name>_spec.py``), and
  :mod:`tl_idempotence.analyses.registry` assembles them: :func:`report_options` (also
  :data:`REPORT_OPTIONS`, :data:`REPORT_OPTION_NAMES`, :data:`DEFAULTS`) is what the CLI builds its flags from,
  :class:`~tl_idempotence.core.options.ReportOptions` its fields and defaults from, :func:`options_doc` the
  docstrings from. The registry sits above this layer, so the package root hands it down
  (:func:`use_registry`, as it hands the views to :mod:`tl_idempotence.core.results`);
* :class:`ReportOptionsArgs` — the same options as a ``TypedDict``, for ``**options: Unpack[ReportOptionsArgs]``
  in every entry point's signature (editors and type checkers list them; a test checks it against the registry);
* the validators (:func:`check_threshold`, :func:`check_int`, :func:`check_bool`, :func:`check_nulls`,
  :func:`check_seed`, :func:`check_layers`, :func:`resolve_layers`): each raises the library's
  :class:`~tl_idempotence.errors.OptionTypeError` / :class:`~tl_idempotence.errors.OptionError` naming the
  argument, what was given and what is allowed. The two that need torch (the compute dtype and the device)
  are in :mod:`tl_idempotence.core.options`.

Imports no torch (``tl-idempotence --help`` and a mistyped flag answer in a fraction of a second).
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict

from ..errors import OptionError, OptionTypeError, TLIError
from .kwargs import unknown_option_error
from .limits import MAX_LAYER_INDEX, MAX_NULLS
from .option_defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, DEFAULT_THRESHOLD

if TYPE_CHECKING:  # pragma: no cover
    from .hints import DeviceLike, DtypeLike, IntLike, LayersLike, NullsLike, RealLike

__all__ = [
    "DEFAULT_NULLS",
    "GENERAL_OPTIONS",
    "REQUIRED",
    "OptionSpec",
    "ReportOptionsArgs",
    "check_bool",
    "check_int",
    "check_layers",
    "check_nulls",
    "check_option_names",
    "check_seed",
    "check_threshold",
    "default",
    "documents_options",
    "given",
    "index_summary",
    "options_doc",
    "report_options",
    "resolve_layers",
    "torch_check",
    "use_registry",
    "use_torch_checks",
    "with_absent",
]

#: Scramble draws per head when ``nulls=True``.
DEFAULT_NULLS = 64


#: :attr:`OptionSpec.absent` of an option every saved options record must hold.
class _Required:
    """The type of :data:`REQUIRED` (equal to nothing but itself)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class OptionSpec:
    """One report option: its name, default (a JSON value), one-line help, validator and command-line form.

    The report's own options (:data:`GENERAL_OPTIONS`: threshold, seed, layers, compute_dtype, device) are
    declared here; each analysis declares the options that switch it on beside its code
    (``analyses/<name>_spec.py``), and :mod:`tl_idempotence.analyses.registry` assembles them all
    (:func:`report_options`).

    Raises (at declaration):
        OptionError: a name that is no public identifier, an unknown kind, a flag whose default is not False, no
            validator (``check``), or a default that its own validator refuses (an option with :func:`torch_check`:
            when :mod:`tl_idempotence.core.options` hands its validator down, :func:`use_torch_checks`).

    Attributes:
        name: the keyword (``threshold``) and, with dashes, the flag (``--threshold``).
        default: the default every entry point uses.
        help: what it does, in one line (the CLI's ``--help`` and the docs).
        kind: how the command line parses it: ``"threshold"``, ``"count"`` (an integer >= 0), ``"flag"``
            (present = True), ``"layers"`` (``0,5,10-12``), ``"choice"`` (one of ``choices``), ``"device"``.
        metavar: the CLI's placeholder.
        choices: the accepted strings of a ``"choice"`` option.
        types: the types it takes, as the docs say them (``"bool | int"``).
        hint: its annotation in :class:`ReportOptionsArgs` (``"NullsLike"``; a test checks the two agree).
        check: the validator ``check(value, name) -> validated value`` (raises ``OptionTypeError`` /
            ``OptionError`` naming the option); required: an option declared without one is refused. The two
            whose validators need torch (compute_dtype, device) declare :func:`torch_check`, which calls the one
            :mod:`tl_idempotence.core.options` hands down (:func:`use_torch_checks`).
        position: where it sorts among the options (fields of ``ReportOptions``, flags, docs): the report's
            own options at 0-20 and 90+, analyses' at 10-50 (a new analysis's at 50, after the others).
        absent: the value a saved options record made before this option existed means (e.g. ``False`` for an
            analysis that did not exist then); :data:`REQUIRED` (every option of today) refuses such a record.
        in_key: whether it is part of :meth:`~tl_idempotence.core.options.ReportOptions.key` (what caches key
            on; ``layers`` is not: a layer's numbers do not depend on which other layers ran).
    """

    name: str
    default: Any
    help: str
    kind: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    types: str = "bool"
    hint: str = "bool"
    check: Callable[[Any, str], Any] | None = None
    position: float = 50.0
    absent: Any = REQUIRED
    in_key: bool = True

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise OptionError(f"an option name must be a public identifier; got {self.name!r}.")
        if self.kind not in _KINDS:
            raise OptionError(f"option {self.name}: kind {self.kind!r} is not one of {sorted(_KINDS)}.")
        if self.kind == "flag" and self.default is not False:
            raise OptionError(f"option {self.name}: a flag's default is False (present on the command line = True).")
        if not callable(self.check):
            raise OptionError(
                f"option {self.name}: no validator; declare check=, a function (value, name) -> the validated value "
                "that raises OptionTypeError / OptionError naming the option (check_bool for an on/off option)."
            )
        if self.check is not torch_check:  # those are checked when their validators are handed down
            self.check_default()

    @property
    def flag(self) -> str:
        """The command-line flag (``--compute-dtype``)."""
        return "--" + self.name.replace("_", "-")

    def validate(self, value: Any) -> Any:
        """``value`` checked by :attr:`check`.

        Raises:
            OptionTypeError / OptionError: as :attr:`check`, naming the option.
        """
        check = self.check
        assert check is not None  # refused at declaration
        return check(value, self.name)

    def check_default(self) -> None:
        """Refuse a declaration whose default its own validator refuses (every entry point would fail on it).

        Raises:
            OptionError: names the option, its default and the validator's reason.
        """
        try:
            self.validate(self.default)
        except TLIError as e:
            raise OptionError(
                f"option {self.name}: its default {self.default!r} is refused by its own validator ({e})"
            ) from None


_KINDS = frozenset({"threshold", "count", "flag", "layers", "choice", "device"})


class ReportOptionsArgs(TypedDict, total=False):
    """The report options as keyword arguments (``**options: Unpack[ReportOptionsArgs]``), for static tools only;
    defaults, meaning and validation in :func:`report_options` (each option's :class:`OptionSpec`), which
    ``tests/unit/analyses/test_registry.py`` checks this listing against (names and :attr:`OptionSpec.hint`)."""

    threshold: RealLike
    nulls: NullsLike
    seed: IntLike
    search: bool
    algebra: bool
    layers: LayersLike
    compute_dtype: DtypeLike
    device: DeviceLike


#: The line a docstring holds where :func:`documents_options` writes the options' documentation.
OPTIONS_DOC_MARKER = "**options: the report options (REPORT_OPTIONS_DOC)."


def options_doc(indent: str = "        ") -> str:
    """The report options as docstring ``Args`` lines (name, type, help, default), from :func:`report_options`."""
    lines = []
    for o in report_options():
        lines.append(f"{indent}{o.name} ({o.types}): {o.help}. Default {o.default!r}.")
    return "\n".join(lines)


def documents_options(fn: Any) -> Any:
    """Decorator: write the report options' documentation (:func:`options_doc`) into ``fn``'s docstring where it
    holds :data:`OPTIONS_DOC_MARKER` (one declaration, every entry point's docs)."""
    doc = fn.__doc__ or ""
    for line in doc.splitlines():
        if OPTIONS_DOC_MARKER in line:
            indent = line[: len(line) - len(line.lstrip())]
            head = f"{indent}**options: the report options, each validated where it enters (ReportOptions):\n"
            fn.__doc__ = doc.replace(line, head + options_doc(indent + "    "))
            break
    return fn


def check_option_names(where: str, options: Mapping[str, Any], others: Iterable[str] = ()) -> None:
    """Refuse keywords that are not report options (nor ``others``, the entry point's own parameters).

    Raises:
        UnknownOptionError: names each unknown keyword and the closest valid ones.
    """
    names = [o.name for o in report_options()]
    unknown = [k for k in options if k not in names]
    if unknown:
        raise unknown_option_error(where, unknown, [*names, *others])


def given(x: Any) -> str:
    """``x`` as an error message shows it: its type and a short repr."""
    r = repr(x)
    return f"{type(x).__name__} {r if len(r) <= 60 else r[:57] + '...'}"


def check_threshold(x: Any, name: str = "threshold") -> float:
    """A P threshold: a real number (not bool, not str) in [0, 1] (P is a squared cosine).

    Raises:
        OptionTypeError: not a real number. OptionError: NaN or outside [0, 1].
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise OptionTypeError(f"{name} must be a real number in [0, 1] (P is a squared cosine); got {given(x)}.")
    v = float(x)
    if not 0.0 <= v <= 1.0:
        raise OptionError(f"{name} must be in [0, 1] (P is a squared cosine); got {v}.")
    return v


def check_int(x: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (``int`` or numpy integer; not bool, not float) within ``[minimum, maximum]``.

    Raises:
        OptionTypeError: not an integer (``1.7`` or ``2.0`` are refused, never truncated).
        OptionError: out of range.
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise OptionTypeError(f"{name} must be an integer; got {given(x)}.")
    v = int(x)
    if minimum is not None and v < minimum:
        raise OptionError(f"{name} must be >= {minimum}; got {v}.")
    if maximum is not None and v > maximum:
        raise OptionError(f"{name} must be <= {maximum}; got {v}.")
    return v


def check_bool(x: Any, name: str) -> bool:
    """A boolean (``True``/``False`` or a numpy bool); ``0``/``1``/strings are refused.

    Raises:
        OptionTypeError: not a boolean.
    """
    if isinstance(x, bool):
        return x
    try:
        import numpy as np

        if isinstance(x, np.bool_):
            return bool(x)
    except ImportError:  # pragma: no cover
        pass
    raise OptionTypeError(f"{name} must be True or False; got {given(x)}.")


def check_nulls(x: Any, name: str = "nulls") -> int:
    """Scramble draws per head: ``True`` (= :data:`DEFAULT_NULLS`), ``False``/0 (off) or an int in [0, MAX_NULLS].

    Raises:
        OptionTypeError: not a bool or an integer. OptionError: negative or above :data:`MAX_NULLS`.
    """
    if isinstance(x, bool):
        return DEFAULT_NULLS if x else 0
    return check_int(x, name, 0, MAX_NULLS)


def check_seed(x: Any, name: str = "seed") -> int:
    """A seed: a non-negative integer (mixed with the layer index by ``layer_generator``).

    Raises:
        OptionTypeError: not an integer. OptionError: negative.
    """
    return check_int(x, name, 0, 2**128)


def check_layers(x: Any, name: str = "layers") -> tuple[int, ...] | None:
    """``None`` (all layers) or a non-empty sequence of distinct non-negative layer indices.

    Returns the indices in the given order. A bare int, a string, an empty sequence, a
    repeated or a negative index is refused (whether each layer exists is checked against
    the model by :func:`resolve_layers`).

    Raises:
        OptionTypeError: not a sequence of integers. OptionError: empty, repeated or negative.
    """
    if x is None:
        return None
    if isinstance(x, (str, bytes, Mapping, Set)) or isinstance(x, numbers.Number) or not isinstance(x, Iterable):
        # sets have no order and mappings would give their keys: neither says which layers in which order
        raise OptionTypeError(f"{name} must be None or a sequence of layer indices such as [0, 5]; got {given(x)}.")
    if hasattr(x, "numel") and hasattr(x, "flatten"):  # a torch tensor (torch is not imported here)
        x = x.flatten().tolist() if x.numel() <= MAX_LAYER_INDEX + 1 else range(MAX_LAYER_INDEX + 2)
    if isinstance(x, range) and len(x) and (x[0] > MAX_LAYER_INDEX or x[-1] > MAX_LAYER_INDEX):
        bad = x[0] if x[0] > MAX_LAYER_INDEX else x[-1]
        raise OptionError(f"{name} holds layer {bad}; layer indices are at most {MAX_LAYER_INDEX}.")
    items = list(itertools.islice(x, MAX_LAYER_INDEX + 2))  # never more than one past the largest valid list
    if not items:
        raise OptionError(f"{name} is empty: pass None for every layer, or the layer indices to measure.")
    out = tuple(check_int(v, f"{name}[{i}]", 0, MAX_LAYER_INDEX) for i, v in enumerate(items))
    seen: set[int] = set()
    dup = sorted({v for v in out if v in seen or seen.add(v)})  # type: ignore[func-returns-value]
    if dup:
        raise OptionError(f"{name} repeats layer(s) {index_summary(dup)}: each layer is measured once.")
    return out


#: How many runs of indices :func:`index_summary` writes out before it counts the rest.
SHOWN_RUNS = 6


def index_summary(values: Sequence[int], shown: int = SHOWN_RUNS) -> str:
    """Layer indices for a message, bounded in length whatever their number: runs of three or more consecutive
    indices as ``a..b``, the first ``shown`` items, and the count when items were joined or left out
    (``[3..65535] (65,533 indices)``, ``[1, 4, 9, ...] (40 indices)``, ``[2, 7]``).

    Args:
        values: the indices, in the order to show them.
        shown: how many items (indices or runs) to write out.
    """
    runs: list[list[int]] = []
    for v in (int(x) for x in values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    words = [w for a, b in runs for w in ([f"{a}..{b}"] if b - a >= 2 else [str(v) for v in range(a, b + 1)])]
    text = "[" + ", ".join(words[:shown]) + (", ...]" if len(words) > shown else "]")
    n = len(values)
    return text if n == len(words) <= shown else f"{text} ({n:,} indices)"


def resolve_layers(layers: Sequence[int] | None, available: Sequence[int]) -> list[int]:
    """The layers to run: all of ``available`` when ``layers`` is None, else ``layers`` (validated order).

    Raises:
        OptionError: a layer that is not an attention layer of the model (lists the available ones).
    """
    avail = [int(a) for a in available]
    if layers is None:
        return avail
    known = set(avail)
    bad = [int(v) for v in layers if int(v) not in known]
    if bad:
        span = f"{avail[0]}..{avail[-1]}" if avail == list(range(avail[0], avail[-1] + 1)) else index_summary(avail)
        raise OptionError(f"Unknown layer index {index_summary(bad)}: this model's attention layers are {span}.")
    return [int(v) for v in layers]


#: The validators that need torch, by option name, as :mod:`tl_idempotence.core.options` hands them down.
_torch_checks: dict[str, Callable[[Any, str], Any]] = {}


def torch_check(x: Any, name: str) -> Any:
    """The validator of an option whose check needs torch (``compute_dtype``, ``device``; this module imports
    none): the one :mod:`tl_idempotence.core.options` handed down for ``name`` (:func:`use_torch_checks`).

    Raises:
        OptionTypeError / OptionError / DeviceError: as that validator.
        RuntimeError: none was handed down for ``name`` (:mod:`tl_idempotence.core.options` does it on import).
    """
    try:
        check = _torch_checks[name]
    except KeyError:
        raise RuntimeError(
            f"tl_idempotence.core.option_specs: the validator of {name} needs torch and was not handed down "
            "(import tl_idempotence.core.options)"
        ) from None
    return check(x, name)


def use_torch_checks(checks: Mapping[str, Callable[[Any, str], Any]]) -> None:
    """Hand down the validators that need torch (``{option name: check}``; :mod:`tl_idempotence.core.options`
    does it when imported) and check the default of each option that declares :func:`torch_check` against them.

    Raises:
        OptionError: an option that declares :func:`torch_check` without a validator handed down here, or whose
            default its validator refuses.
    """
    _torch_checks.update(checks)
    for o in GENERAL_OPTIONS:
        if o.check is torch_check:
            if o.name not in _torch_checks:
                raise OptionError(f"option {o.name}: declares torch_check, but no validator needing torch was given.")
            o.check_default()


#: The report's own options (not an analysis's), with their place among all options (:attr:`OptionSpec.position`).
GENERAL_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "threshold",
        DEFAULT_THRESHOLD,
        "P threshold of a 'closed' head, in [0, 1] (the paper's 0.9)",
        "threshold",
        types="float",
        hint="RealLike",
        check=check_threshold,
        position=0,
    ),
    OptionSpec(
        "seed",
        0,
        "seed of the scramble draws and the search restarts, >= 0",
        "count",
        "S",
        types="int",
        hint="IntLike",
        check=check_seed,
        position=20,
    ),
    OptionSpec(
        "layers",
        None,
        "the layer indices to measure (None: every attention layer)",
        "layers",
        "LIST",
        types="Iterable[int] | None",
        hint="LayersLike",
        check=check_layers,
        position=90,
        in_key=False,
    ),
    OptionSpec(
        "compute_dtype",
        DEFAULT_COMPUTE_DTYPE,
        "dtype of the d_model-long products O^T O, V^T O: float64 or float32 (faster on large checkpoints, "
        "|dP| < 1e-6 measured; the d_head-sized algebra stays float64)",
        "choice",
        choices=("float64", "float32"),
        types="torch.dtype | str",
        hint="DtypeLike",
        check=torch_check,
        position=91,
    ),
    OptionSpec(
        "device",
        DEFAULT_DEVICE,
        "where the products and the controls run: cpu, cuda, cuda:N or auto (results are CPU float64)",
        "device",
        "DEVICE",
        types="str | torch.device",
        hint="DeviceLike",
        check=torch_check,
        position=92,
    ),
)

_registry: Callable[[], Sequence[OptionSpec]] | None = None


def use_registry(options: Callable[[], Sequence[OptionSpec]]) -> None:
    """Set where the analyses' options come from: the package root passes
    :func:`tl_idempotence.analyses.registry.analysis_options` (the registry is a higher layer than this one)."""
    global _registry
    _registry = options


def report_options() -> tuple[OptionSpec, ...]:
    """Every report option: :data:`GENERAL_OPTIONS` and the registered analyses' options, sorted by
    :attr:`OptionSpec.position` (stable), read from the registry at each call (a test that registers an
    analysis sees its option everywhere).

    Raises:
        OptionError: two options with one name (an analysis that declares a name already taken).
        RuntimeError: the registry was not handed down (the package root always does it first).
    """
    if _registry is None:  # pragma: no cover - the package root always sets it
        raise RuntimeError(
            "tl_idempotence.core.option_specs: the analyses' registry was not set (import tl_idempotence)"
        )
    out = tuple(sorted((*GENERAL_OPTIONS, *_registry()), key=lambda o: o.position))
    names = [o.name for o in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OptionError(f"report options {dup} are declared twice (an analysis's option names one already taken).")
    return out


def with_absent(record: Mapping[str, Any]) -> dict[str, Any]:
    """An options record written before some options were declared, with each such option at the value the record
    means (:attr:`OptionSpec.absent`; a new analysis's on/off option: its analysis did not run). An option whose
    ``absent`` is :data:`REQUIRED` stays missing (the caller refuses it). The one rule for saved reports
    (``ReportOptions.from_record``, the summary check of a saved report) and resume manifests.
    """
    filled = {o.name: o.absent for o in report_options() if o.name not in record and o.absent is not REQUIRED}
    return {**filled, **record}


def default(name: str) -> Any:
    """The declared default of the report option ``name``.

    Raises:
        UnknownOptionError: no such option (names the closest ones).
    """
    specs = report_options()
    for o in specs:
        if o.name == name:
            return o.default
    raise unknown_option_error("report options", [name], [o.name for o in specs])


def __getattr__(name: str) -> Any:
    """:data:`REPORT_OPTIONS` (the :class:`OptionSpec` of every option), :data:`REPORT_OPTION_NAMES` and
    :data:`DEFAULTS` (read-only ``{name: default}``), assembled from the registry when read."""
    if name == "REPORT_OPTIONS":
        return report_options()
    if name == "REPORT_OPTION_NAMES":
        return tuple(o.name for o in report_options())
    if name == "DEFAULTS":
        return MappingProxyType({o.name: o.default for o in report_options()})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
