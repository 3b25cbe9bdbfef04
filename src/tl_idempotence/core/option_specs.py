"""One report option's declaration, and the report's own options.

Every route into a report — ``idempotence_report``, the TransformerLens method, ``compare``, ``sweep``,
``run_sweep_item``, ``trajectory`` and the command line — takes the same options with the same names,
defaults and validation, each declared once:

* :class:`OptionSpec` — one option's name, default, validator, help, types and command-line form;
* :data:`GENERAL_OPTIONS` — the report's own options (threshold, seed, layers, compute_dtype, device), here;
  each analysis declares the option that switches it on beside its code (``analyses/<name>_spec.py``,
  :func:`on_off` for an on/off one), and :mod:`tl_idempotence.analyses.report_options` assembles them from the
  analyses' registry (:func:`~tl_idempotence.analyses.report_options.report_options`) into
  :class:`~tl_idempotence.analyses.report_options.ReportOptions`, the CLI's flags and the options docstrings;
* :class:`GeneralOptions` — the report's own options, validated, frozen and typed (:class:`Option`): what an
  analysis reads (its ``LayerContext.options``; its own option by name, ``options["nulls"]``) and the base class of
  ``ReportOptions``. An analysis types its options as this class, never as ``ReportOptions``: that class is
  assembled from the registry, which lists the analyses (an import cycle, refused by
  ``tests/unit/test_layering.py``). The entry points that run an analysis's code without a report
  (``shared_value_algebra``, ``mismatch``, ``constructive_search``) build one.

The validators are :mod:`tl_idempotence.core.options`. Imports no torch (``tl-idempotence --help`` and a mistyped
flag answer in a fraction of a second).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import FrozenInstanceError, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ..errors import OptionError, TLIError
from .defaults import DEFAULT_COMPUTE_DTYPE, DEFAULT_DEVICE, DEFAULT_THRESHOLD
from .frozen import NamedValue
from .kwargs import unknown_option_error
from .options import check_bool, check_compute_dtype, check_device, check_layers, check_seed, check_threshold

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["GENERAL_OPTIONS", "REQUIRED", "GeneralOptions", "Option", "OptionSpec", "on_off"]

T = TypeVar("T")


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
    (:func:`~tl_idempotence.analyses.report_options.report_options`).

    Raises (at declaration):
        OptionError: a name that is no public identifier, an unknown kind, a flag whose default is not False, no
            validator (``check``), or a default that its own validator refuses (but for :attr:`needs_torch`).

    Attributes:
        name: the keyword (``threshold``) and, with dashes, the flag (``--threshold``).
        default: the default every entry point uses.
        help: what it does, in one line (the CLI's ``--help`` and the docs).
        kind: how the command line parses it: ``"threshold"``, ``"count"`` (an integer >= 0), ``"flag"``
            (present = True), ``"layers"`` (``0,5,10-12``), ``"choice"`` (one of ``choices``), ``"device"``.
        metavar: the CLI's placeholder.
        choices: the accepted strings of a ``"choice"`` option.
        types: the types it takes, as the docs say them (``"bool | int"``).
        hint: its annotation in :class:`~tl_idempotence.analyses.report_options.ReportOptionsArgs`
            (``"NullsLike"``; a test checks the two agree).
        check: the validator ``check(value, name) -> validated value`` (raises ``OptionTypeError`` /
            ``OptionError`` naming the option); required: an option declared without one is refused (those
            of a dtype and a device import torch when called).
        position: where it sorts among the options (fields of ``ReportOptions``, flags, docs): the report's
            own options at 0-20 and 90+, analyses' at 10-50 (a new analysis's at 50, after the others).
        absent: the value a saved options record made before this option existed means (e.g. ``False`` for an
            analysis that did not exist then); :data:`REQUIRED` (every option of today) refuses such a record.
        needs_torch: its validator imports torch (a dtype, a device): its default is not checked at declaration, so
            that declaring the options imports no torch (``tests/unit/core/test_option_specs.py`` checks it).
        in_key: whether it is part of :meth:`~tl_idempotence.analyses.report_options.ReportOptions.key` (what caches key
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
    needs_torch: bool = False

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
        if not self.needs_torch:  # torch is not imported at declaration: tests/unit/core/test_option_specs.py checks
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


def on_off(name: str, help: str, position: float = 50.0, absent: Any = REQUIRED) -> OptionSpec:
    """The option that switches an analysis on: a command-line flag (``--name``), default False, validated by
    :func:`~tl_idempotence.core.options.check_bool` (the search's and the algebra's).

    Raises:
        OptionError: as :class:`OptionSpec` (a name that is no public identifier).
    """
    return OptionSpec(name, False, help, "flag", check=check_bool, position=position, absent=absent)


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
        check=check_compute_dtype,
        position=91,
        needs_torch=True,
    ),
    OptionSpec(
        "device",
        DEFAULT_DEVICE,
        "where the products and the controls run: cpu, cuda, cuda:N or auto (results are CPU float64)",
        "device",
        "DEVICE",
        types="str | torch.device",
        hint="DeviceLike",
        check=check_device,
        position=92,
        needs_torch=True,
    ),
)


class Option(NamedValue[T]):
    """A typed, read-only attribute of :class:`GeneralOptions` (and of its subclass ``ReportOptions``): the validated
    value of the option of the attribute's name, typed for static tools (``seed: Option[int] = Option("...")``
    reads as an ``int``; a misspelled option is refused by a type checker).
    """

    def __init__(self, doc: str) -> None:
        super().__init__(_option_value, doc)


def _option_value(options: Any, name: str) -> Any:
    """The value of the option ``name`` of ``options`` (:meth:`GeneralOptions.__getitem__`)."""
    return options[name]


class GeneralOptions:
    """The report's own options (:data:`GENERAL_OPTIONS`), each validated by its declared validator where it enters
    (module docstring). Frozen (assigning an attribute raises ``dataclasses.FrozenInstanceError``), compared and
    hashed by value; a subclass holds the options of its :meth:`specs` (``ReportOptions``: the analyses' too).

    Attributes:
        threshold: P threshold of a "closed" head, in [0, 1]. seed: the seed of every random analysis.
        layers: the layer indices to measure, or ``None`` for all. compute_dtype: dtype of the ``d_model``-long
        products. device: where the products and the batched r x r work run.

    Raises:
        UnknownOptionError: a keyword that is no option (names the closest valid ones).
        OptionTypeError / OptionError / DeviceError: a bad value (the option's validator names it).
    """

    __slots__ = ("_values",)
    _values: MappingProxyType[str, Any]

    threshold: Option[float] = Option('P threshold of a "closed" head, in [0, 1].')
    seed: Option[int] = Option("The seed of every random analysis (layer ``l`` draws from ``(seed, l)``).")
    layers: Option[tuple[int, ...] | None] = Option("The layer indices to measure, or None for all.")
    compute_dtype: Option[torch.dtype] = Option("The dtype of the ``d_model``-long products.")
    device: Option[torch.device] = Option("Where the products and the batched r x r work run.")

    def __init__(self, **options: Any) -> None:
        specs = self.specs()
        names = [o.name for o in specs]
        unknown = [k for k in options if k not in names]
        if unknown:
            raise unknown_option_error(f"{type(self).__name__}()", unknown, names)
        values = {o.name: o.validate(options.get(o.name, o.default)) for o in specs}
        object.__setattr__(self, "_values", MappingProxyType(values))

    @classmethod
    def specs(cls) -> tuple[OptionSpec, ...]:
        """The options it holds, in order (:attr:`OptionSpec.position`)."""
        return tuple(sorted(GENERAL_OPTIONS, key=lambda o: o.position))

    @classmethod
    def names(cls) -> list[str]:
        """The option names (the order of :meth:`specs`)."""
        return [o.name for o in cls.specs()]

    @classmethod
    def _restore(cls, values: Mapping[str, Any]) -> Self:
        """Options from values already validated (unpickling; a recorded device kept as it is)."""
        out = object.__new__(cls)
        object.__setattr__(out, "_values", MappingProxyType(dict(values)))
        return out

    def __getitem__(self, name: str) -> Any:
        """The value of the option ``name`` (any option it holds: an analysis reads its own this way).

        Raises:
            KeyError: no such option (names the options).
        """
        try:
            return self._values[name]
        except KeyError:
            kind = type(self).__name__
            raise KeyError(f"{kind} has no option {name!r}; its options are {list(self._values)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: {type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}: {type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, type(self)):
            return NotImplemented
        return dict(self._values) == dict(other._values)

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), dict(self._values)))


def _restore(cls: type[GeneralOptions], values: Mapping[str, Any]) -> GeneralOptions:
    """Unpickle options of ``cls`` (:meth:`GeneralOptions.__reduce__`)."""
    return cls._restore(values)
