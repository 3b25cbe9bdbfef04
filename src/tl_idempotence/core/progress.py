"""Progress bars: one helper for every bar the package shows, and a switch for transformers' own bars.

* :func:`progress_bar` — a tqdm bar: a notebook widget (``tqdm.auto``) in a Jupyter kernel when
  ipywidgets is installed, plain text on stderr otherwise. ``tqdm.auto`` itself, imported in a kernel
  without ipywidgets, warns (``TqdmWarning: IProgress not found``) and falls back to text; this helper
  never imports it there, so no analysis of this package triggers that warning.
* :func:`quiet_transformers` — while active, transformers' own progress bars ("Writing model shards",
  "Loading weights") are off; the previous setting is restored afterwards.

``tqdm`` is imported when a bar is made, never at import time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["progress_bar", "quiet_transformers", "tqdm_class"]


def _in_kernel() -> bool:
    """True inside a Jupyter (IPython) kernel, where ``tqdm.auto`` would draw a widget."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except AttributeError:  # pragma: no cover - a stub IPython module
        return False
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def tqdm_class() -> Any:
    """``tqdm.auto.tqdm`` in a Jupyter kernel with ipywidgets installed, else ``tqdm.std.tqdm`` (text)."""
    if _in_kernel() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm as auto_tqdm

        return auto_tqdm
    from tqdm.std import tqdm as std_tqdm

    return std_tqdm


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    desc: str,
    enabled: bool = True,
    total: int | None = None,
    unit: str = "it",
    leave: bool = True,
) -> Any:
    """A tqdm bar over ``iterable`` (module docstring), writing to stderr; ``enabled=False``: no output.

    Args:
        iterable: what to iterate over (or None, then call ``update``).
        desc: what the bar measures; name the unit cost when a default takes minutes
            (e.g. ``"layers (search ~3 s/layer)"``).
        enabled: draw the bar (the ``progress=`` option of the public functions).
        total: number of steps (default: ``len(iterable)``).
        unit: the step's unit.
        leave: keep the finished bar on screen.
    """
    return tqdm_class()(iterable, desc=desc, total=total, unit=unit, disable=not enabled, leave=leave, file=sys.stderr)


@contextmanager
def quiet_transformers(active: bool = True) -> Iterator[None]:
    """Turn transformers' own progress bars off while the block runs (``active=False``: leave them).

    Restores the previous setting (a bar the user disabled stays disabled). A no-op when
    transformers is not installed.
    """
    if not active or importlib.util.find_spec("transformers") is None:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # transformers' GGUF loader draws its "Converting and de-quantizing GGUF tensors" bar with
    # tqdm.auto directly (not through its logging switch): give it a disabled tqdm while the block runs.
    gguf_utils: Any = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if gguf_utils is None and importlib.util.find_spec("gguf") is not None:
        gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    their_tqdm = getattr(gguf_utils, "tqdm", None)
    if their_tqdm is not None:
        gguf_utils.tqdm = functools.partial(their_tqdm, disable=True)
    try:
        yield
    finally:
        if their_tqdm is not None:
            gguf_utils.tqdm = their_tqdm
        if was_on:
            hf_logging.enable_progress_bar()
