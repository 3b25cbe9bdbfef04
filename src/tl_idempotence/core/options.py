"""Arguments checked where they enter, once: validators and the frozen report options.

Every public entry point runs its arguments through these functions (or through
:class:`ReportOptions`, which uses them) before any work is done, so a typo, a wrong
type, an out-of-range or a huge value is refused with an error that names the
argument, what was given and what is allowed (:mod:`tl_idempotence.errors`):

* wrong type -> :class:`~tl_idempotence.errors.OptionTypeError` (a ``TypeError``):
  ``threshold="0.5"``, ``nulls=1.7``, ``seed=1.5``, ``compute_dtype=torch.int64``;
* wrong value -> :class:`~tl_idempotence.errors.OptionError` (a ``ValueError``):
  ``threshold=1.5``, ``nulls=-1``, ``layers=[]``, ``layers=[0, 0]``;
* unknown keyword -> :class:`~tl_idempotence.errors.UnknownOptionError` (a
  ``TypeError``) naming the closest valid names (:func:`strict_kwargs`);
* a device that is not there -> :class:`~tl_idempotence.errors.DeviceError`.

:class:`ReportOptions` is what the report loop, the resume manifest and every cache
key on (:meth:`ReportOptions.key`). Imports torch and the standard library only.
"""

from __future__ import annotations

import functools
import itertools
import numbers
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..errors import DeviceError, OptionError, OptionTypeError
from .kwargs import strict_kwargs, unknown_option_error
from .limits import MAX_LAYER_INDEX, MAX_NULLS

__all__ = [
    "DEFAULT_NULLS",
    "MAX_LAYER_INDEX",
    "MAX_NULLS",
    "ReportOptions",
    "check_bool",
    "check_compute_dtype",
    "check_device",
    "check_int",
    "check_layers",
    "check_nulls",
    "check_seed",
    "check_threshold",
    "resolve_layers",
    "strict_kwargs",
    "unknown_option_error",
]

#: Scramble draws per head when ``nulls=True``.
DEFAULT_NULLS = 64
_COMPUTE_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _given(x: Any) -> str:
    r = repr(x)
    return f"{type(x).__name__} {r if len(r) <= 60 else r[:57] + '...'}"


def check_threshold(x: Any, name: str = "threshold") -> float:
    """A P threshold: a real number (not bool, not str) in [0, 1] (P is a squared cosine).

    Raises:
        OptionTypeError: not a real number. OptionError: NaN or outside [0, 1].
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise OptionTypeError(f"{name} must be a real number in [0, 1] (P is a squared cosine); got {_given(x)}.")
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
        raise OptionTypeError(f"{name} must be an integer; got {_given(x)}.")
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
    raise OptionTypeError(f"{name} must be True or False; got {_given(x)}.")


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
        raise OptionTypeError(f"{name} must be None or a sequence of layer indices such as [0, 5]; got {_given(x)}.")
    if isinstance(x, torch.Tensor):
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
        raise OptionError(f"{name} repeats layer(s) {dup[:20]}: each layer is measured once.")
    return out


def resolve_layers(layers: Sequence[int] | None, available: Sequence[int]) -> list[int]:
    """The layers to run: all of ``available`` when ``layers`` is None, else ``layers`` (validated order).

    Raises:
        OptionError: a layer that is not an attention layer of the model (lists the available ones).
    """
    avail = [int(a) for a in available]
    if layers is None:
        return avail
    bad = [int(v) for v in layers if int(v) not in set(avail)]
    if bad:
        span = f"{avail[0]}..{avail[-1]}" if avail == list(range(avail[0], avail[-1] + 1)) else str(avail)
        raise OptionError(f"Unknown layer index {bad}: this model's attention layers are {span}.")
    return [int(v) for v in layers]


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


@dataclass(frozen=True, init=False)
class ReportOptions:
    """The validated options of a report (and of every route into it). Frozen.

    Attributes:
        threshold: P threshold of a "closed" head, in [0, 1] (paper: 0.9).
        nulls: orientation-scramble draws per head (0 = no controls; ``True`` gives 64);
            with ``nulls > 0`` the matched O/V mismatch runs too (SPEC 4).
        seed: non-negative seed; layer ``l`` of every random analysis seeds its own
            generator from ``(seed, l)``.
        search: run the constructive search (SPEC 5).
        algebra: run the shared-value algebra (SPEC 7).
        layers: the layer indices to measure, or ``None`` for all.
        compute_dtype: dtype of the ``d_model``-long products (float64 or float32).
        device: where the products and the batched r x r work run (results are CPU float64).

    Raises:
        OptionTypeError / OptionError / DeviceError: see the ``check_*`` functions.
    """

    threshold: float
    nulls: int
    seed: int
    search: bool
    algebra: bool
    layers: tuple[int, ...] | None
    compute_dtype: torch.dtype
    device: torch.device

    def __init__(
        self,
        threshold: Any = 0.9,
        nulls: Any = 0,
        seed: Any = 0,
        search: Any = False,
        algebra: Any = False,
        layers: Any = None,
        compute_dtype: Any = torch.float64,
        device: Any = "cpu",
    ) -> None:
        set_ = functools.partial(object.__setattr__, self)
        set_("threshold", check_threshold(threshold))
        set_("nulls", check_nulls(nulls))
        set_("seed", check_seed(seed))
        set_("search", check_bool(search, "search"))
        set_("algebra", check_bool(algebra, "algebra"))
        set_("layers", check_layers(layers))
        set_("compute_dtype", check_compute_dtype(compute_dtype))
        set_("device", check_device(device))

    @classmethod
    def names(cls) -> list[str]:
        """The option names."""
        return [f.name for f in fields(cls)]

    def key(self) -> dict[str, Any]:
        """The options that change numbers, as JSON values (what caches and resume parts key on).

        ``layers`` is not part of the key: a layer's numbers do not depend on which other
        layers ran. The device is (results agree across devices to float64 rounding, not bit
        for bit).
        """
        return {
            "threshold": self.threshold,
            "nulls": self.nulls,
            "seed": self.seed,
            "search": self.search,
            "algebra": self.algebra,
            "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
            "device": self.device.type,
        }

    def as_dict(self) -> dict[str, Any]:
        """Every option as a JSON value (for summaries and saved reports)."""
        return {**self.key(), "layers": None if self.layers is None else list(self.layers)}

    def with_threshold(self, threshold: float) -> ReportOptions:
        """A copy with another threshold (validated); the device is kept as is."""
        out = ReportOptions.from_record({**self.as_dict(), "threshold": check_threshold(threshold)})
        object.__setattr__(out, "device", self.device)
        return out

    @classmethod
    def from_record(cls, record: Any) -> ReportOptions:
        """Options from :meth:`as_dict` (a saved report's record), validated.

        The device is restored as recorded without asking whether it exists here: a report
        computed on a GPU loads on a CPU-only machine.

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
        missing = [n for n in cls.names() if n not in record]
        if missing:
            raise OptionError(f"options record lacks {missing}: it does not say how its numbers were computed.")
        dev = record.get("device", "cpu")
        if not isinstance(dev, str):
            raise OptionTypeError(f"options.device must be a device name; got {dev!r}.")
        out = cls(**{**record, "device": "cpu"})
        try:
            object.__setattr__(out, "device", torch.device(dev))
        except RuntimeError as e:
            raise OptionError(f"options.device={dev!r} is not a device name.") from e
        return out
