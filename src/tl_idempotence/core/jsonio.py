"""THE JSON encoder of the package, with its two NaN policies (docs/definitions.md, "Output formats").

A non-finite float has no JSON literal (``NaN`` is not JSON: ``jq``, JavaScript's ``JSON.parse`` and strict
parsers refuse it), so every JSON file or text the package writes goes through :func:`json_ready` with one of
two policies, chosen by what the file is for:

* :data:`RECORD` — **records the package reads back** (a saved report's ``report.json``, a resume folder's part
  records, a sweep's task records): NaN, +inf and -inf are the strings ``"NaN"``, ``"Infinity"`` and
  ``"-Infinity"``, and :func:`json_restore` turns them back into the same floats. A NaN of a summary read back
  is a NaN, never a missing value, so a record round-trips exactly. (The format of every record already on
  disk: old files keep their meaning.)
* :data:`EXPORT` — **machine-readable user exports** (the CLI's ``--json``, a ``.json`` output file): NaN and
  ±inf are ``null``, what every JSON reader takes as "no value". The export is for other programs and is never
  read back by the package; the reason for each NaN is in the report's ``note``/``reason`` columns.

Both policies turn numpy scalars (and 0-d arrays) into Python scalars, tuples into lists and every mapping into
a dict with string keys, and :func:`json_text` writes with ``allow_nan=False``: a non-finite float that escaped
the policy raises instead of writing invalid JSON.

Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Set
from typing import Any, Literal

__all__ = ["EXPORT", "NAN_POLICIES", "RECORD", "NanPolicy", "json_ready", "json_restore", "json_text"]

NanPolicy = Literal["record", "export"]

#: NaN/±inf as the strings "NaN"/"Infinity"/"-Infinity" (records the package reads back: exact round trip).
RECORD: NanPolicy = "record"
#: NaN/±inf as ``null`` (user exports for other programs; never read back).
EXPORT: NanPolicy = "export"
#: The policies and what each is for.
NAN_POLICIES: dict[str, str] = {
    RECORD: 'NaN, Infinity, -Infinity as the strings "NaN", "Infinity", "-Infinity" (read back exactly)',
    EXPORT: "NaN, Infinity, -Infinity as null (exports for other programs)",
}

_SPECIAL = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _scalar(x: Any) -> Any:
    """A numpy scalar or 0-d array (``x.item()``) as the Python scalar; anything else unchanged."""
    if x is None or type(x) in (str, int, float, bool):
        return x
    item = getattr(x, "item", None)
    if callable(item) and getattr(x, "ndim", None) == 0:  # numpy scalars (np.float64 too), 0-d arrays and tensors
        return item()
    return x


def json_ready(x: Any, nan: NanPolicy) -> Any:
    """``x`` made JSON-able under the NaN policy ``nan`` (module docstring).

    Args:
        x: nested mappings, lists, tuples and scalars (Python or numpy).
        nan: :data:`RECORD` (``"NaN"``/``"Infinity"``/``"-Infinity"`` strings) or :data:`EXPORT` (``null``).

    Returns:
        Dicts (string keys), lists and Python scalars; other objects are left for ``json.dumps`` to refuse.

    Raises:
        ValueError: an unknown policy.
    """
    if nan not in NAN_POLICIES:
        raise ValueError(f"nan must be one of {tuple(NAN_POLICIES)}; got {nan!r}.")
    return _ready(x, nan)


def _ready(x: Any, nan: NanPolicy) -> Any:
    x = _scalar(x)
    if isinstance(x, Mapping):
        return {str(k): _ready(v, nan) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_ready(v, nan) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        if nan == EXPORT:
            return None
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def json_text(x: Any, nan: NanPolicy, **dumps: Any) -> str:
    """``json.dumps(json_ready(x, nan), allow_nan=False, **dumps)``: strict JSON text under the policy ``nan``.

    Args:
        x: as for :func:`json_ready`. nan: the policy. **dumps: ``json.dumps`` keywords (``indent``, ``sort_keys``).

    Raises:
        TypeError: an object JSON cannot hold. ValueError: an unknown policy.
    """
    return json.dumps(json_ready(x, nan), allow_nan=False, **dumps)


def json_restore(x: Any, float_keys: Set[str] | None = None, int_keys: bool = True) -> Any:
    """Undo the :data:`RECORD` policy for the values of ``float_keys`` (or of every key when None).

    With ``int_keys`` (the default), a dict whose keys are all decimal integers (``"0"``, ``"12"``) gets int keys
    back: JSON keys are strings, and the only such dicts the report record writes are keyed by layer
    (``closed_per_layer``). ``int_keys=False`` leaves keys as written (a record that tags its int-keyed dicts).
    """
    if isinstance(x, dict):
        as_int = int_keys and bool(x) and all(isinstance(k, str) and k.isdecimal() for k in x)
        return {
            (int(k) if as_int else k): (
                _SPECIAL[v]
                if isinstance(v, str) and v in _SPECIAL and (float_keys is None or k in float_keys)
                else json_restore(v, float_keys, int_keys)
            )
            for k, v in x.items()
        }
    if isinstance(x, list):
        return [json_restore(v, float_keys, int_keys) for v in x]
    return x
