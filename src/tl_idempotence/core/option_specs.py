"""The report options, declared once, and the validators that need no torch (the CLI parses with them).

Every route into a report — ``idempotence_report``, the TransformerLens method, ``compare``, ``sweep``,
``run_sweep_item``, ``trajectory`` and the command line — takes the same eight options with the same names,
defaults and validation, declared here once:

* :data:`REPORT_OPTIONS` — each option's name, default, one-line help and command-line form; the CLI builds
  its flags from it and :class:`~tl_idempotence.core.options.ReportOptions` takes its defaults from it;
* :class:`ReportOptionsArgs` — the same options as a ``TypedDict``, for ``**options: Unpack[ReportOptionsArgs]``
  in every entry point's signature (editors and type checkers list them);
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
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict

from ..errors import OptionError, OptionTypeError
from .kwargs import unknown_option_error
from .limits import MAX_LAYER_INDEX, MAX_NULLS

if TYPE_CHECKING:  # pragma: no cover
    from .hints import DeviceLike, DtypeLike, IntLike, LayersLike, NullsLike, RealLike

__all__ = [
    "DEFAULTS",
    "DEFAULT_NULLS",
    "REPORT_OPTIONS",
    "REPORT_OPTION_NAMES",
    "OptionSpec",
    "ReportOptionsArgs",
    "check_bool",
    "check_int",
    "check_layers",
    "check_nulls",
    "check_option_names",
    "check_seed",
    "check_threshold",
    "documents_options",
    "given",
    "index_summary",
    "options_doc",
    "resolve_layers",
]

#: Scramble draws per head when ``nulls=True``.
DEFAULT_NULLS = 64


@dataclass(frozen=True)
class OptionSpec:
    """One report option: its name, default (a JSON value), one-line help, and its command-line form.

    Attributes:
        name: the keyword (``threshold``) and, with dashes, the flag (``--threshold``).
        default: the default every entry point uses.
        help: what it does, in one line (the CLI's ``--help`` and the docs).
        kind: how the command line parses it: ``"threshold"``, ``"count"`` (an integer >= 0), ``"flag"``
            (present = True), ``"layers"`` (``0,5,10-12``), ``"choice"`` (one of ``choices``), ``"device"``.
        metavar: the CLI's placeholder.
        choices: the accepted strings of a ``"choice"`` option.
    """

    name: str
    default: Any
    help: str
    kind: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The command-line flag (``--compute-dtype``)."""
        return "--" + self.name.replace("_", "-")


#: The report options, in the order of ``ReportOptions``' fields (SPEC 2-5, 9). Every entry point's default.
REPORT_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("threshold", 0.9, "P threshold of a 'closed' head, in [0, 1] (the paper's 0.9)", "threshold"),
    OptionSpec(
        "nulls",
        0,
        "orientation-scramble draws per head, with the matched O/V mismatch: an integer, 0 = off, 64 the usual "
        "(the Python API also takes True for 64)",
        "count",
        "N",
    ),
    OptionSpec("seed", 0, "seed of the scramble draws and the search restarts, >= 0", "count", "S"),
    OptionSpec("search", False, "constructive search: the feasible P per head and layer (minutes)", "flag"),
    OptionSpec("algebra", False, "shared-value algebra per kv group (GQA/MQA)", "flag"),
    OptionSpec("layers", None, "the layer indices to measure (None: every attention layer)", "layers", "LIST"),
    OptionSpec(
        "compute_dtype",
        "float64",
        "dtype of the d_model-long products O^T O, V^T O: float64 or float32 (faster on large checkpoints, "
        "|dP| < 1e-6 measured; the d_head-sized algebra stays float64)",
        "choice",
        choices=("float64", "float32"),
    ),
    OptionSpec(
        "device",
        "cpu",
        "where the products and the controls run: cpu, cuda, cuda:N or auto (results are CPU float64)",
        "device",
        "DEVICE",
    ),
)
#: The option names, in order.
REPORT_OPTION_NAMES: tuple[str, ...] = tuple(o.name for o in REPORT_OPTIONS)
_SPECS = {o.name: o for o in REPORT_OPTIONS}
#: Each option's declared default (read-only): what every entry point uses when an option is not given.
DEFAULTS: Mapping[str, Any] = MappingProxyType({o.name: o.default for o in REPORT_OPTIONS})


class ReportOptionsArgs(TypedDict, total=False):
    """The report options as keyword arguments (``**options: Unpack[ReportOptionsArgs]``); defaults and meaning
    in :data:`REPORT_OPTIONS`, validation in :class:`~tl_idempotence.core.options.ReportOptions`."""

    threshold: RealLike
    nulls: NullsLike
    seed: IntLike
    search: bool
    algebra: bool
    layers: LayersLike
    compute_dtype: DtypeLike
    device: DeviceLike


#: The types each option takes, as the docs say them.
_TYPES = {
    "threshold": "float",
    "nulls": "bool | int",
    "seed": "int",
    "search": "bool",
    "algebra": "bool",
    "layers": "Iterable[int] | None",
    "compute_dtype": "torch.dtype | str",
    "device": "str | torch.device",
}
#: The line a docstring holds where :func:`documents_options` writes the options' documentation.
OPTIONS_DOC_MARKER = "**options: the report options (REPORT_OPTIONS_DOC)."


def options_doc(indent: str = "        ") -> str:
    """The report options as docstring ``Args`` lines (name, type, help, default), from :data:`REPORT_OPTIONS`."""
    lines = []
    for o in REPORT_OPTIONS:
        lines.append(f"{indent}{o.name} ({_TYPES[o.name]}): {o.help}. Default {o.default!r}.")
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
    unknown = [k for k in options if k not in _SPECS]
    if unknown:
        raise unknown_option_error(where, unknown, [*REPORT_OPTION_NAMES, *others])


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
