"""Where a page is written: the path checked before anything is rendered, and a write whose refusal by the
operating system is an :class:`~tl_idempotence.errors.OptionError` naming the file (report, comparison and
attention pages alike).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import OptionError, OptionTypeError

__all__ = ["page_path", "write_page"]


def page_path(path: Any, what: str) -> Path:
    """The file a page is written to, checked before anything is rendered.

    Raises:
        OptionTypeError: ``path`` is not a string or path. OptionError: empty, a folder, or in a folder
            that does not exist (each names the path and ``what``).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OptionTypeError(f"path of the {what} must be a file path; got {type(path).__name__}.")
    if not str(path).strip():
        raise OptionError(f"path of the {what} must not be empty; give a file name.")
    p = Path(path).expanduser()
    if p.is_dir():
        raise OptionError(f"Cannot write the {what} to {p}: it is a folder; give a file name.")
    if not p.parent.exists():
        raise OptionError(f"Cannot write the {what} to {p}: the folder {p.parent} does not exist.")
    return p


def write_page(p: Path, text: str, what: str) -> Path:
    """Write ``text`` to ``p`` (UTF-8); an operating-system refusal becomes an :class:`OptionError` naming it.

    Raises:
        OptionError: the file cannot be written (permissions, a full disk, ...).
    """
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OptionError(f"Cannot write the {what} to {p}: {e.strerror or e}.") from e
    return p
