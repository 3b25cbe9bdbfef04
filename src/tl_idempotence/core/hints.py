"""Type aliases of the public API's parameters (what editors, ``help()`` and type checkers show).

Every public argument is also validated where it enters (``core/option_specs.py``, ``core/options.py`` and the
``check_*`` functions); these aliases say what those validators accept. Imported for annotations only (under
``TYPE_CHECKING``), so they cost nothing at run time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Union

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd
    import torch

    from .heads import HeadSource, LayerHeads

__all__ = [
    "ArchitectureLike",
    "DeviceLike",
    "DtypeLike",
    "HeadsLike",
    "IntLike",
    "LayersLike",
    "ModelLike",
    "PathLike",
    "RealLike",
]

#: A file or folder: ``str`` or ``os.PathLike`` (``pathlib.Path``); ``~`` is expanded.
PathLike: TypeAlias = Union[str, "os.PathLike[str]"]
#: A real number (``int`` accepted; numpy scalars too).
RealLike: TypeAlias = Union[float, "np.floating[Any]", "np.integer[Any]"]
#: An integer (numpy integers accepted; never a float or a bool).
IntLike: TypeAlias = Union[int, "np.integer[Any]"]
#: Layer indices in order (a list, tuple, range, array or 1-D tensor), or None for every layer.
LayersLike: TypeAlias = Iterable[int] | None
#: ``torch.float64`` / ``torch.float32`` or their names.
DtypeLike: TypeAlias = Union["torch.dtype", str]
#: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` or a ``torch.device``.
DeviceLike: TypeAlias = Union[str, "torch.device"]
#: What a report measures: a TransformerLens or ``transformers`` model (a ``torch.nn.Module``), a checkpoint
#: path or zoo name, ``LayerHeads`` (one or a sequence) or a ``HeadSource``.
ModelLike: TypeAlias = Union[
    str, "os.PathLike[str]", "torch.nn.Module", "LayerHeads", Sequence["LayerHeads"], "HeadSource"
]
#: ``(layer, head)`` pairs, or a DataFrame with ``layer`` and ``head`` columns (e.g. ``rep.closed_heads``).
HeadsLike: TypeAlias = Union[Iterable[tuple[int, int]], "pd.DataFrame"]
#: An architecture-table name or an entry dict (``data/architectures.json``).
ArchitectureLike: TypeAlias = str | dict[str, Any]
