"""The report options, assembled from the analyses' registry: :class:`ReportOptions` and its keyword form.

Every route into a report — ``idempotence_report``, ``compare``, ``sweep``, ``trajectory``, the CLI — takes the
same options: the report's own (:data:`~tl_idempotence.core.option_specs.GENERAL_OPTIONS`) and the one each
registered analysis declares beside its code (``analyses/<name>_spec.py``, listed by
:mod:`tl_idempotence.analyses.registry`). :func:`report_options` assembles them; from it come
:class:`ReportOptions`' validation, defaults and encoding, the CLI's report flags, the options paragraph of every
entry point's docstring (:func:`documents_options`) and ``compare``'s compared options. :class:`ReportOptions`
declares a typed attribute for each option of the paper's analyses (a test checks the declaration against the
registry), so a type checker refuses a misspelled option.

:class:`ReportOptions` is what the report loop, the resume manifest and every cache key on
(:meth:`ReportOptions.key`); its one encoding in files is :meth:`ReportOptions.as_dict` /
:meth:`ReportOptions.from_record`, and between processes :meth:`ReportOptions.for_elsewhere` /
:meth:`ReportOptions.at_device` (the same record without the device, plus the device's name). Each option is
validated when the options are built (:mod:`tl_idempotence.core.options`); a keyword that is no option raises
:class:`~tl_idempotence.errors.UnknownOptionError` naming the closest valid names.

Imports no torch at import (the CLI's ``--help`` reads the options).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from ..core.kwargs import by_name, unknown_option_error
from ..core.option_specs import GENERAL_OPTIONS, REQUIRED, GeneralOptions, Option, OptionSpec
from ..core.options import check_device_name, check_threshold
from ..errors import OptionError, OptionTypeError
from . import registry

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

    from ..core.hints import DeviceLike, DtypeLike, IntLike, LayersLike, NullsLike, RealLike

__all__ = [
    "OPTIONS_DOC_MARKER",
    "ReportOptions",
    "ReportOptionsArgs",
    "check_option_names",
    "default",
    "documents_options",
    "options_doc",
    "report_options",
    "with_absent",
]


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


_Documented = TypeVar("_Documented", bound=Callable[..., Any])


def documents_options(fn: _Documented) -> _Documented:
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


def report_options() -> tuple[OptionSpec, ...]:
    """Every report option: :data:`GENERAL_OPTIONS` and the registered analyses' options, sorted by
    :attr:`OptionSpec.position` (stable), read from the registry at each call (a test that registers an
    analysis sees its option everywhere).

    Raises:
        OptionError: two options with one name (an analysis that declares a name already taken).
    """
    out = tuple(sorted((*GENERAL_OPTIONS, *registry.analysis_options()), key=lambda o: o.position))
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
    return by_name(report_options(), name, lambda names: unknown_option_error("report options", [name], names)).default


def _encode(name: str, value: Any) -> Any:
    """An option's value as a JSON value (the dtype and device by name, layers as a list)."""
    if name == "compute_dtype":
        return str(value).removeprefix("torch.")
    if name == "device":
        return value.type
    if name == "layers":
        return None if value is None else list(value)
    return value


class ReportOptions(GeneralOptions):
    """The validated options of a report (and of every route into it). Frozen (assigning an attribute raises
    ``dataclasses.FrozenInstanceError``), compared and hashed by value.

    Its options are :func:`report_options`: the report's own (below; :class:`~tl_idempotence.core.option_specs.
    GeneralOptions`, its base class, which is what an analysis reads) and every registered analysis's (``nulls``,
    ``search``, ``algebra``; declared beside the analysis), each validated by its declared validator when the
    options are built. Each is a typed attribute (``options.nulls``); an option of an analysis registered
    besides the paper's reads as ``options["name"]``.

    Attributes:
        threshold: P threshold of a "closed" head, in [0, 1] (paper: 0.9).
        seed: non-negative seed; layer ``l`` of every random analysis seeds its own
            generator from ``(seed, l)``.
        layers: the layer indices to measure, or ``None`` for all.
        compute_dtype: dtype of the ``d_model``-long products (float64 or float32).
        device: where the products and the batched r x r work run (results are CPU float64).
        nulls: orientation-scramble draws per head (0 = no controls; ``True`` gives 64); with ``nulls > 0`` the
            matched O/V mismatch runs too (SPEC 4; declared in ``analyses/scramble_spec.py``).
        search: run the constructive search (SPEC 5; ``analyses/search_spec.py``).
        algebra: run the shared-value algebra (SPEC 7; ``analyses/algebra_spec.py``).

    Raises:
        UnknownOptionError: a keyword that is no option (names the closest valid ones).
        OptionTypeError / OptionError / DeviceError: see the ``check_*`` functions.
    """

    __slots__ = ()

    # The options of the paper's analyses, typed (the report's own are GeneralOptions'): each the return type of its
    # declared validator (tests/unit/analyses/test_report_options.py checks names, types and defaults against the
    # registry). An option of an analysis registered besides these reads as ``options["name"]``.
    nulls: Option[int] = Option("Orientation-scramble draws per head (0: no controls).")
    search: Option[bool] = Option("Whether the constructive search runs.")
    algebra: Option[bool] = Option("Whether the shared-value algebra runs.")

    def __init__(self, **options: Unpack[ReportOptionsArgs]) -> None:
        super().__init__(**options)

    @classmethod
    def specs(cls) -> tuple[OptionSpec, ...]:
        """The options it holds: :func:`report_options` (read from the registry at each call)."""
        return report_options()

    @classmethod
    def from_kwargs(
        cls, where: str, options: Mapping[str, Any], others: Iterable[str] = (), **fixed: Unpack[ReportOptionsArgs]
    ) -> ReportOptions:
        """The options an entry point was given as ``**options`` (each absent one at its declared default).

        Args:
            where: the entry point, for messages (``"sweep()"``).
            options: the keyword arguments it received besides its own parameters.
            others: its own parameter names (suggested too when a keyword is unknown).
            **fixed: options the entry point sets itself (e.g. ``algebra=True``), refused when also given.

        Raises:
            UnknownOptionError: a keyword that is no option (names the closest valid ones).
            OptionError: an option the entry point sets itself. OptionTypeError / OptionError / DeviceError:
                a bad value (:class:`ReportOptions`).
        """
        check_option_names(where, options, others)
        clash = sorted(set(options) & set(fixed))
        if clash:
            raise OptionError(f"{where} sets {clash} itself; do not pass them.")
        return cls(**{**options, **fixed})

    def key(self) -> dict[str, Any]:
        """The options that change numbers, as JSON values (what caches and resume parts key on).

        ``layers`` is not part of the key: a layer's numbers do not depend on which other
        layers ran. The device is (results agree across devices to float64 rounding, not bit
        for bit).
        """
        return {o.name: _encode(o.name, self._values[o.name]) for o in report_options() if o.in_key}

    def as_dict(self) -> dict[str, Any]:
        """Every option as a JSON value (for summaries and saved reports): :meth:`key`, then the others."""
        out_of_key = {o.name: _encode(o.name, self._values[o.name]) for o in report_options() if not o.in_key}
        return {**self.key(), **out_of_key}

    @classmethod
    def for_elsewhere(
        cls, where: str, options: Mapping[str, Any], others: Iterable[str] = ()
    ) -> tuple[dict[str, Any], str]:
        """The options of work that runs in other processes (sweep workers, job-array tasks, trajectory tasks),
        in their one encoding: the validated options without the device as a JSON record (:meth:`as_dict`
        without ``device``) and the device as asked, a name resolved where the work runs (:meth:`at_device`).

        Raises:
            UnknownOptionError / OptionTypeError / OptionError: as :meth:`from_kwargs` and
                :func:`check_device_name`.
        """
        check_option_names(where, options, others)
        device = check_device_name(options.get("device", default("device")))
        opts = cls(**{k: v for k, v in options.items() if k != "device"})
        return {k: v for k, v in opts.as_dict().items() if k != "device"}, device

    @classmethod
    def at_device(cls, record: Mapping[str, Any], device: str) -> ReportOptions:
        """Options from :meth:`for_elsewhere`'s record, with the device resolved here (where the work runs).

        Raises:
            OptionError / OptionTypeError: a record that is not valid options. DeviceError: a device this machine
                does not have.
        """
        if "device" in record:
            raise OptionError("an options record for elsewhere holds no device (it is given apart).")
        return cls.from_kwargs("options record", record, device=device)

    def with_threshold(self, threshold: RealLike) -> ReportOptions:
        """A copy with another threshold (validated); the device is kept as is."""
        out = ReportOptions.from_record({**self.as_dict(), "threshold": check_threshold(threshold)})
        return ReportOptions._restore({**out._values, "device": self.device})

    @classmethod
    def from_record(cls, record: object) -> ReportOptions:
        """Options from :meth:`as_dict` (a saved report's record), validated.

        The device is restored as recorded without asking whether it exists here: a report
        computed on a GPU loads on a CPU-only machine.

        An option declared after the record was written (:attr:`~tl_idempotence.core.option_specs.OptionSpec.absent`
        not ``REQUIRED``, e.g. a new analysis's on/off option) takes the value such a record means.

        Raises:
            OptionTypeError / OptionError: a record that is not a dict of valid options, or that
                lacks one (a missing option is never filled with its default: the numbers were
                computed with whatever value it had).
        """
        if not isinstance(record, dict):
            raise OptionTypeError(f"options record must be a dict; got {type(record).__name__}.")
        unknown = set(record) - set(cls.names())
        if unknown:
            raise unknown_option_error("ReportOptions record", sorted(unknown), cls.names())
        specs = report_options()
        missing = [o.name for o in specs if o.name not in record and o.absent is REQUIRED]
        if missing:
            raise OptionError(f"options record lacks {missing}: it does not say how its numbers were computed.")
        # an option declared after the record was written: the value the record means (its analysis did not run)
        record = with_absent(record)
        dev = record.get("device", "cpu")
        if not isinstance(dev, str):
            raise OptionTypeError(f"options.device must be a device name; got {dev!r}.")
        out = cls(**{**record, "device": "cpu"})
        import torch

        try:
            device = torch.device(dev)
        except RuntimeError as e:
            raise OptionError(f"options.device={dev!r} is not a device name.") from e
        return cls._restore({**out._values, "device": device})
