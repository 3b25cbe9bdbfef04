"""The validators of every argument, each raising the library's error where the argument enters.

Every route into a report — ``idempotence_report``, ``compare``, ``sweep``, ``trajectory``, the CLI — and every
public function checks its arguments with these, so the same input is refused the same way before any work is
done, with an error that names the argument, what was given and what is allowed (:mod:`tl_idempotence.errors`):

* wrong type -> :class:`~tl_idempotence.errors.OptionTypeError` (a ``TypeError``):
  ``threshold="0.5"``, ``nulls=1.7``, ``seed=1.5``, ``compute_dtype=torch.int64``;
* wrong value -> :class:`~tl_idempotence.errors.OptionError` (a ``ValueError``):
  ``threshold=1.5``, ``nulls=-1``, ``layers=[]``, ``layers=[0, 0]``;
* unknown keyword -> :class:`~tl_idempotence.errors.UnknownOptionError` (a ``TypeError``) naming the closest
  valid names (:func:`strict_kwargs`);
* a device that is not there -> :class:`~tl_idempotence.errors.DeviceError`.

The report options are declared with these validators in :mod:`tl_idempotence.core.option_specs` (the report's
own) and beside each analysis; :class:`~tl_idempotence.analyses.report_options.ReportOptions` holds them.
Imports no torch at import (the validators of a dtype and a device import it when called), so the CLI's
``--help`` and a mistyped flag answer in a fraction of a second.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any

from ..errors import DeviceError, OptionError, OptionTypeError
from .defaults import default_of
from .kwargs import strict_kwargs, unknown_option_error
from .limits import MAX_LAYER_INDEX, MAX_NULLS

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DEFAULT_NULLS",
    "MAX_LAYER_INDEX",
    "MAX_NULLS",
    "SHOWN_RUNS",
    "check_bool",
    "check_compute_dtype",
    "check_device",
    "check_device_name",
    "check_int",
    "check_layers",
    "check_nulls",
    "check_seed",
    "check_threshold",
    "given",
    "index_summary",
    "resolve_layers",
    "strict_kwargs",
    "unknown_option_error",
]

#: Scramble draws per head when ``nulls=True`` (:mod:`tl_idempotence.core.defaults`).
DEFAULT_NULLS: int = default_of("nulls=True", "nulls")

_COMPUTE_DTYPES = ("float64", "float32")


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


def check_compute_dtype(x: Any, name: str = "compute_dtype") -> torch.dtype:
    """The dtype of the ``d_model``-long products: ``torch.float64`` (default) or ``torch.float32``.

    Strings ``"float64"``/``"float32"`` (also ``"torch.float32"``) are accepted. Integer,
    complex and bool dtypes would silently truncate the products and are refused; so are
    float16/bfloat16, whose products over ``d_model`` lose most of their digits.

    Raises:
        OptionTypeError: not a dtype or dtype name. OptionError: a dtype other than float32/float64.
    """
    import torch

    if isinstance(x, str):
        key = x.removeprefix("torch.")
        if key in _COMPUTE_DTYPES:
            return torch.float64 if key == "float64" else torch.float32
        if key == "double":
            return torch.float64
        raise OptionError(f"{name}={x!r} is not supported; use 'float64' (default) or 'float32'.")
    if not isinstance(x, torch.dtype):
        raise OptionTypeError(f"{name} must be torch.float64 or torch.float32 (or their names); got {given(x)}.")
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
    import torch

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
        raise OptionTypeError(f"{name} must be 'cpu', 'cuda', 'cuda:N', 'auto' or a torch.device; got {given(x)}.")
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
    import torch

    if isinstance(x, torch.device):
        x = str(x)
    if not isinstance(x, str):
        raise OptionTypeError(f"{name} must be a device name such as 'cpu', 'cuda' or 'auto'; got {given(x)}.")
    if x != "auto":
        try:
            kind = torch.device(x).type
        except RuntimeError as e:
            raise OptionError(f"{name}={x!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'auto'.") from e
        if kind not in ("cpu", "cuda"):
            raise OptionError(f"{name}={x!r}: the work runs on 'cpu' or 'cuda' (or 'auto').")
    return x
