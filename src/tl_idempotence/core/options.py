"""The frozen report options and the two validators that need torch; arguments are checked where they enter.

The options are declared once in :mod:`tl_idempotence.core.option_specs` (names, defaults, help, the CLI's
form; the torch-free validators): :class:`ReportOptions` takes its defaults from there and validates every
option when it is built, so every route — ``idempotence_report``, ``compare``, ``sweep``, ``trajectory``,
the CLI — refuses the same input the same way before any work is done, with an error that names the
argument, what was given and what is allowed (:mod:`tl_idempotence.errors`):

* wrong type -> :class:`~tl_idempotence.errors.OptionTypeError` (a ``TypeError``):
  ``threshold="0.5"``, ``nulls=1.7``, ``seed=1.5``, ``compute_dtype=torch.int64``;
* wrong value -> :class:`~tl_idempotence.errors.OptionError` (a ``ValueError``):
  ``threshold=1.5``, ``nulls=-1``, ``layers=[]``, ``layers=[0, 0]``;
* unknown keyword -> :class:`~tl_idempotence.errors.UnknownOptionError` (a
  ``TypeError``) naming the closest valid names (:func:`strict_kwargs`, :meth:`ReportOptions.from_kwargs`);
* a device that is not there -> :class:`~tl_idempotence.errors.DeviceError`.

:class:`ReportOptions` is what the report loop, the resume manifest and every cache key on
(:meth:`ReportOptions.key`); its one encoding in files is :meth:`ReportOptions.as_dict` /
:meth:`ReportOptions.from_record`, and between processes :meth:`ReportOptions.for_elsewhere` /
:meth:`ReportOptions.at_device` (the same record without the device, plus the device's name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import FrozenInstanceError
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from ..errors import DeviceError, OptionError, OptionTypeError
from .kwargs import strict_kwargs, unknown_option_error
from .limits import MAX_LAYER_INDEX, MAX_NULLS
from .option_specs import (
    DEFAULT_NULLS,
    REQUIRED,
    ReportOptionsArgs,
    check_bool,
    check_int,
    check_layers,
    check_nulls,
    check_option_names,
    check_seed,
    check_threshold,
    default,
    given,
    report_options,
    resolve_layers,
    use_torch_checks,
    with_absent,
)

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

    from .hints import RealLike

__all__ = [
    "DEFAULT_NULLS",
    "MAX_LAYER_INDEX",
    "MAX_NULLS",
    "ReportOptions",
    "ReportOptionsArgs",
    "check_bool",
    "check_compute_dtype",
    "check_device",
    "check_device_name",
    "check_int",
    "check_layers",
    "check_nulls",
    "check_seed",
    "check_threshold",
    "resolve_layers",
    "strict_kwargs",
    "unknown_option_error",
]

_COMPUTE_DTYPES = {"float64": torch.float64, "float32": torch.float32}
_given = given


def check_compute_dtype(x: Any, name: str = "compute_dtype") -> torch.dtype:
    """The dtype of the ``d_model``-long products: ``torch.float64`` (default) or ``torch.float32``.

    Strings ``"float64"``/``"float32"`` (also ``"torch.float32"``) are accepted. Integer,
    complex and bool dtypes would silently truncate the products and are refused; so are
    float16/bfloat16, whose products over ``d_model`` lose most of their digits.

    Raises:
        OptionTypeError: not a dtype or dtype name. OptionError: a dtype other than float32/float64.
    """
    if isinstance(x, str):
        key = x.removeprefix("torch.")
        if key in _COMPUTE_DTYPES:
            return _COMPUTE_DTYPES[key]
        if key == "double":
            return torch.float64
        raise OptionError(f"{name}={x!r} is not supported; use 'float64' (default) or 'float32'.")
    if not isinstance(x, torch.dtype):
        raise OptionTypeError(f"{name} must be torch.float64 or torch.float32 (or their names); got {_given(x)}.")
    if x in (torch.float64, torch.float32):
        return x
    why = (
        "an integer/bool dtype truncates the products"
        if not (x.is_floating_point or x.is_complex)
        else (
            "complex products are not the real OV circuit"
            if x.is_complex
            else "half-precision products over d_model lose most of their digits"
        )
    )
    raise OptionError(f"{name}={x} is not supported ({why}); use torch.float64 (default) or torch.float32.")


def check_device(x: Any, name: str = "device") -> torch.device:
    """A torch device that exists here: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a ``torch.device``.

    ``"auto"`` is ``cuda`` when CUDA is available, else ``cpu``.

    Raises:
        OptionTypeError: not a string or device. DeviceError: an unknown device string, or a
            device that is not available (``"cuda"`` without CUDA, ``"cuda:3"`` with 1 GPU).
    """
    if isinstance(x, str):
        if x == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(x)
        except RuntimeError as e:
            raise DeviceError(f"{name}={x!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'auto'.") from e
    elif isinstance(x, torch.device):
        dev = x
    else:
        raise OptionTypeError(f"{name} must be 'cpu', 'cuda', 'cuda:N', 'auto' or a torch.device; got {_given(x)}.")
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"{name}={x!r}: CUDA is not available on this machine (torch {torch.__version__}, "
                f"cuda build: {torch.version.cuda or 'no'}). Use device='cpu' or device='auto'."
            )
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise DeviceError(f"{name}={x!r}: this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1}).")
        return dev
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceError(f"{name}={x!r}: MPS is not available on this machine; use device='cpu'.")
        raise DeviceError(f"{name}={x!r}: MPS has no float64, which the closure maths needs; use 'cpu' or 'cuda'.")
    raise DeviceError(f"{name}={x!r}: device type {dev.type!r} is not supported; use 'cpu', 'cuda' or 'auto'.")


def check_device_name(x: Any, name: str = "device") -> str:
    """A device *name* to resolve where the work runs (a sweep's or a trajectory's workers may have GPUs this
    process lacks): ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a ``torch.device`` (as its name).

    Raises:
        OptionTypeError: not a string or device. OptionError: not a device name, or a device type other than
            cpu and cuda.
    """
    if isinstance(x, torch.device):
        x = str(x)
    if not isinstance(x, str):
        raise OptionTypeError(f"{name} must be a device name such as 'cpu', 'cuda' or 'auto'; got {_given(x)}.")
    if x != "auto":
        try:
            kind = torch.device(x).type
        except RuntimeError as e:
            raise OptionError(f"{name}={x!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'auto'.") from e
        if kind not in ("cpu", "cuda"):
            raise OptionError(f"{name}={x!r}: the work runs on 'cpu' or 'cuda' (or 'auto').")
    return x


#: The validators of the report's own options that need torch, handed down to their declarations (which say
#: ``check=torch_check``; the declarations' module imports no torch), their defaults checked there.
_TORCH_CHECKS: dict[str, Callable[[Any, str], Any]] = {"compute_dtype": check_compute_dtype, "device": check_device}
use_torch_checks(_TORCH_CHECKS)


def _encode(name: str, value: Any) -> Any:
    """An option's value as a JSON value (the dtype and device by name, layers as a list)."""
    if name == "compute_dtype":
        return str(value).removeprefix("torch.")
    if name == "device":
        return value.type
    if name == "layers":
        return None if value is None else list(value)
    return value


class ReportOptions:
    """The validated options of a report (and of every route into it). Frozen (assigning an attribute raises
    ``dataclasses.FrozenInstanceError``), compared and hashed by value.

    Its options are :func:`~tl_idempotence.core.option_specs.report_options`: the report's own (below) and every
    registered analysis's (``nulls``, ``search``, ``algebra``, ...; declared beside the analysis, read as
    attributes: ``options.nulls``), each validated by its declared validator when the options are built.

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

    __slots__ = ("_values",)
    _values: MappingProxyType[str, Any]

    threshold: float
    seed: int
    layers: tuple[int, ...] | None
    compute_dtype: torch.dtype
    device: torch.device

    def __init__(self, **options: Unpack[ReportOptionsArgs]) -> None:
        specs = report_options()
        given_ = dict(options)
        check_option_names("ReportOptions()", given_)
        values: dict[str, Any] = {}
        for o in specs:
            v = given_.get(o.name, o.default)
            values[o.name] = o.validate(v)
        object.__setattr__(self, "_values", MappingProxyType(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return object.__getattribute__(self, "_values")[name]
        except (KeyError, AttributeError):
            raise AttributeError(f"ReportOptions has no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: ReportOptions is frozen")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}: ReportOptions is frozen")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReportOptions):
            return NotImplemented
        return dict(self._values) == dict(other._values)

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return f"ReportOptions({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (dict(self._values),))

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._values})

    @classmethod
    def names(cls) -> list[str]:
        """The option names (the order of :func:`~tl_idempotence.core.option_specs.report_options`)."""
        return [o.name for o in report_options()]

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
        return _restore({**out._values, "device": self.device})

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
        try:
            device = torch.device(dev)
        except RuntimeError as e:
            raise OptionError(f"options.device={dev!r} is not a device name.") from e
        return _restore({**out._values, "device": device})


def _restore(values: Mapping[str, Any]) -> ReportOptions:
    """Options from values already validated (unpickling, :meth:`ReportOptions.from_record`'s recorded device)."""
    out = object.__new__(ReportOptions)
    object.__setattr__(out, "_values", MappingProxyType(dict(values)))
    return out


def __getattr__(name: str) -> Any:
    """:data:`REPORT_OPTIONS` and :data:`DEFAULTS`, as :mod:`tl_idempotence.core.option_specs` assembles them (names
    this module exported before the options were declared beside the analyses)."""
    if name in ("REPORT_OPTIONS", "DEFAULTS", "REPORT_OPTION_NAMES"):
        from . import option_specs

        return getattr(option_specs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
