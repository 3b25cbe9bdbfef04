"""The argument types of the command line: each turns a string into a value or refuses it with
``argparse.ArgumentTypeError`` (exit 2, before any work); they import nothing heavy (``--help`` imports no torch)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def nonneg_int(s: str) -> int:
    """An integer >= 0 (``--retries``)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {v}")
    return v


def positive_int(s: str) -> int:
    """An integer >= 1 (``--workers``)."""
    v = nonneg_int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {v}")
    return v


def parse_layers(s: str) -> list[int]:
    """``"0,5,10-12"`` -> ``[0, 5, 10, 11, 12]`` (distinct, in the given order).

    Every index is checked against :data:`~tl_idempotence.core.limits.MAX_LAYER_INDEX` before a range
    is expanded, so ``0-1000000000`` is refused at once (whether a layer exists is checked against the
    model before any work).

    Raises:
        argparse.ArgumentTypeError: anything else (empty, negative, reversed range, an index above the
            maximum, repeated layer).
    """
    from ..core.limits import MAX_LAYER_INDEX  # imports nothing (no torch at parse time)

    out: list[int] = []
    seen: set[int] = set()
    for part in s.split(","):
        part = part.strip()
        if not part:
            raise argparse.ArgumentTypeError(f"empty item in layer list {s!r}; use e.g. 0,5,10-12")
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a layer index or range: {part!r} (use e.g. 0,5,10-12)") from None
        if a < 0 or b < a:
            raise argparse.ArgumentTypeError(f"bad layer range {part!r}: indices are >= 0 and ranges run upwards")
        if b > MAX_LAYER_INDEX:
            raise argparse.ArgumentTypeError(f"layer {b} in {part!r}: layer indices are at most {MAX_LAYER_INDEX}")
        for v in range(a, b + 1):
            if v in seen:
                raise argparse.ArgumentTypeError(f"layer {v} given twice in {s!r}")
            seen.add(v)
            out.append(v)
    return out


def output_file(s: str) -> str:
    """A file to write (``--out``, ``--csv``, ``--json``): the API's rule
    (:func:`~tl_idempotence.core.outputs.file_path_problem`: not a folder, nor a path ending in a separator, in a
    folder that exists; a stream such as ``/dev/stdout`` is written in place), checked before any work, and a
    writable folder. Returns the path as given (a trailing separator kept, so the writer refuses it too)."""
    from ..core.files import is_stream
    from ..core.outputs import file_path_problem

    if not s.strip():
        raise argparse.ArgumentTypeError("must not be empty; give a file name")
    problem = file_path_problem(s)
    if problem is not None:
        raise argparse.ArgumentTypeError(
            f"{s} is a folder; give a file name" if problem.startswith("it is") else problem
        )
    p = Path(s).expanduser()
    if not is_stream(p) and not os.access(p.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {p.parent} is not writable")
    return s


def nonempty(s: str) -> str:
    """Any string but an empty or blank one (MODEL, ITEM, ``--source``, ``--scheduler``, ``--attention-text``)."""
    if not s.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return s


def folder(s: str) -> str:
    """A folder to create or reuse (``--resume``, ``sweep --out``): the API's rule
    (:func:`~tl_idempotence.core.files.check_work_folder`)."""
    from ..core.files import check_work_folder
    from ..errors import TLIError

    try:
        return str(check_work_folder(s, "folder"))
    except TLIError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("folder ").removeprefix("folder: ")) from None


FROM_ENV = -1  # --task-index without a value (not a string: argparse applies no type to it): from the environment


def task_index(s: str) -> int:
    """An item index of ``sweep --task-index`` (from 0, at most 10,000,000)."""
    v = nonneg_int(s)
    if v > 10_000_000:
        raise argparse.ArgumentTypeError(f"must be an item index (from 0); got {v}")
    return v


def seconds(s: str) -> float:
    """A number of seconds in [1, 604800] (``--worker-timeout``; refuses nan and inf)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {s!r}") from None
    if not 1.0 <= v <= 7 * 24 * 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be in [1, 604800] seconds; got {s}")
    return v


def package_version() -> str:
    """The installed package's version (``--version``; ``0+unknown`` in a source tree without installation)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tl_idempotence")
    except PackageNotFoundError:  # pragma: no cover - a source tree without installation
        return "0+unknown"


def validated(parse: Any, check: Any, name: str) -> Any:
    """An argparse type: ``parse`` the string, then the library's own validator ``check`` (the same rule as the
    Python API), its error as argparse's (exit 2)."""

    def convert(s: str) -> Any:
        from ..errors import OptionError, OptionTypeError

        try:
            return check(parse(s), name)
        except (ValueError, OptionError, OptionTypeError) as e:
            msg = (
                str(e)
                if isinstance(e, (OptionError, OptionTypeError))
                else f"not {'an integer' if parse is int else 'a number'}: {s!r}"
            )
            if msg.startswith(name + " "):  # argparse already names the flag: "argument --seed: must be >= 0"
                msg = msg[len(name) + 1 :]
            raise argparse.ArgumentTypeError(msg) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert
