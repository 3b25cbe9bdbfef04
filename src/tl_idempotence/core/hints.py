"""Type aliases of the public API's parameters (what editors, ``help()`` and type checkers show).

Every public argument is also validated where it enters (``core/option_specs.py``, ``core/options.py`` and the
``check_*`` functions); these aliases say what those validators accept. Imported for annotations only (under
``TYPE_CHECKING``), so they cost nothing at run time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, Union

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import numpy as np
    import pandas as pd
    import torch

    from .heads import HeadSource, LayerHeads, ModelInfo

__all__ = [
    "ArchitectureLike",
    "ArrayLike",
    "ClientLike",
    "DeviceLike",
    "DtypeLike",
    "FactoredMatrixLike",
    "FloatLike",
    "HeadPairs",
    "HeadWeightsLike",
    "HeadsLike",
    "HeadsReport",
    "IntLike",
    "JoinReport",
    "LayersLike",
    "ModelLike",
    "NullsLike",
    "PathLike",
    "RealLike",
    "TLModel",
    "TextDataset",
    "TextsLike",
]

#: A file or folder: ``str`` or ``os.PathLike`` (``pathlib.Path``); ``~`` is expanded.
PathLike: TypeAlias = Union[str, "os.PathLike[str]"]
#: A real number (``int`` accepted; numpy scalars too).
RealLike: TypeAlias = Union[float, "np.floating[Any]", "np.integer[Any]"]
#: A float (``int`` accepted) or a numpy float; not a numpy integer.
FloatLike: TypeAlias = Union[float, "np.floating[Any]"]
#: An integer (numpy integers accepted; never a float or a bool).
IntLike: TypeAlias = Union[int, "np.integer[Any]"]
#: Scramble draws per head: ``True`` (the default count), ``False`` (off) or a count.
NullsLike: TypeAlias = bool | IntLike
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
#: A TransformerLens model run with hooks (``HookedTransformer``, ``HookedEncoder`` or ``TransformerBridge``;
#: recognised by class name, transformer_lens is never imported here).
TLModel: TypeAlias = "torch.nn.Module"
#: ``(layer, head)`` pairs (tuples or two-item lists).
HeadPairs: TypeAlias = Iterable[tuple[IntLike, IntLike] | Sequence[IntLike]]
#: ``(layer, head)`` pairs, or a DataFrame with ``layer`` and ``head`` columns (e.g. ``rep.closed_heads``).
HeadsLike: TypeAlias = Union[HeadPairs, "pd.DataFrame"]
#: An architecture-table name or an entry dict (``data/architectures.json``).
ArchitectureLike: TypeAlias = str | dict[str, Any]
#: A ``torch.Tensor`` or a numpy array.
ArrayLike: TypeAlias = Union["torch.Tensor", "np.ndarray[Any, Any]"]


class FactoredMatrixLike(Protocol):
    """A TransformerLens ``FactoredMatrix`` (``model.OV``, ``model.OV[l, h]``): ``A = W_V``, ``B = W_O``."""

    @property
    def A(self) -> torch.Tensor: ...

    @property
    def B(self) -> torch.Tensor: ...


#: Heads' OV weights: a ``LayerHeads``, a ``FactoredMatrix`` or a ``(W_V, W_O)`` pair of tensors / arrays in
#: TransformerLens row form.
HeadWeightsLike: TypeAlias = Union["LayerHeads", FactoredMatrixLike, tuple[ArrayLike, ArrayLike], list[ArrayLike]]


class HeadsReport(Protocol):
    """What has a per-head table and a threshold (an ``IdempotenceReport``)."""

    @property
    def heads(self) -> pd.DataFrame: ...

    @property
    def threshold(self) -> float: ...


class JoinReport(HeadsReport, Protocol):
    """What a join runs on (an ``IdempotenceReport``): a per-head table and a threshold, and what was measured
    (``info``: the model's sizes, name and class)."""

    @property
    def info(self) -> ModelInfo: ...


class TextDataset(Protocol):
    """A ``datasets.Dataset`` (its text column is read by name)."""

    @property
    def column_names(self) -> list[str]: ...

    def __getitem__(self, key: str, /) -> Any: ...


#: Text to run: a string, a ``pathlib.Path`` file, a sequence of those, a ``datasets.Dataset``, or token ids
#: (an integer tensor / array ``[batch, pos]`` or ``[pos]``).
TextsLike: TypeAlias = Union[str, "Path", Iterable[Union[str, "Path"]], TextDataset, ArrayLike]


class ClientLike(Protocol):
    """A ``distributed.Client`` (anything with its ``submit`` and ``gather``)."""

    def submit(self, *args: Any, **kwargs: Any) -> Any: ...

    def gather(self, *args: Any, **kwargs: Any) -> Any: ...
