"""tl_idempotence: near-idempotent attention heads (T² ≈ αT) in TransformerLens models.

Implements the analyses of "Scaled Idempotence in Transformer Attention: Paired OV
Geometry and Shared-Value Algebras" (arXiv 2609.01129); definitions in ``docs/definitions.md``.

Importing this package attaches :func:`idempotence_report` as a method
``model.idempotence_report(...)`` to TransformerLens's HookedTransformer,
HookedEncoder (when the installed transformer-lens has them) and TransformerBridge.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .heads import HeadSource, LayerHeads, ModelInfo, head_source, kv_layout
from .linalg import Closure, closure
from .report import IdempotenceReport, idempotence_report
from .nulls import MismatchResult, Scramble, mismatch, orientation_scramble
from .search import SearchResult, constructive_search
from .lineage import Lineage, train_lineage
from .trajectory import Trajectory, trajectory
from .algebra import SharedValueAlgebra, shared_value_algebra
from .activations import ActivationReturns, activation_returns, default_corpus
from .attention import AttentionView, attention_view, flagged_heads
from . import models  # the offline model zoo: tli.models.load("smollm2-135m")

try:
    __version__ = version("tl_idempotence")
except PackageNotFoundError:  # pragma: no cover
    __version__ = "0+unknown"

__all__ = [
    "Closure",
    "HeadSource",
    "IdempotenceReport",
    "LayerHeads",
    "ModelInfo",
    "closure",
    "head_source",
    "idempotence_report",
    "kv_layout",
    "MismatchResult",
    "Scramble",
    "SearchResult",
    "constructive_search",
    "mismatch",
    "orientation_scramble",
    "Lineage",
    "Trajectory",
    "train_lineage",
    "trajectory",
    "ActivationReturns",
    "AttentionView",
    "SharedValueAlgebra",
    "activation_returns",
    "attention_view",
    "default_corpus",
    "flagged_heads",
    "shared_value_algebra",
]


def _method(self, *args, **kwargs):
    return idempotence_report(self, *args, **kwargs)


_method.__doc__ = idempotence_report.__doc__
_method.__name__ = "idempotence_report"


def _attach() -> list[str]:
    """Attach ``idempotence_report`` to the TransformerLens model classes that exist."""
    attached = []
    targets = [
        ("transformer_lens", "HookedTransformer"),
        ("transformer_lens", "HookedEncoder"),
        ("transformer_lens.model_bridge", "TransformerBridge"),
    ]
    import importlib

    for mod_name, cls_name in targets:
        try:
            mod = importlib.import_module(mod_name)
            cls = getattr(mod, cls_name)
        except (ImportError, AttributeError):
            continue
        setattr(cls, "idempotence_report", _method)
        attached.append(cls_name)
    return attached


ATTACHED_TO = _attach()
