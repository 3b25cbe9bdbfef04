"""The declaration of ``rep.ablation``: the report's closed heads ablated in its model against matched random sets
(:func:`~tl_idempotence.probes.ablation.ablation`, whose options it forwards and which validates them). Torch- and
pandas-free (:mod:`.join_spec`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.lazy import Lazy
from .join_spec import JoinSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..probes.ablation import Ablation

__all__ = ["ABLATION"]


def run_ablation(rep: Any, model: Any = None, **options: Any) -> Ablation:
    """``rep.ablation`` (its docstring): the model checked against the report by content (its processing may
    differ), then ``tli.ablation`` of the report's closed heads with ``options``."""
    from ..probes.ablation import ablation

    m = ABLATION.model_of(rep, model)  # the closed heads are this report's: of this model
    return ablation(m, rep.closed_heads, **options)


ABLATION = JoinSpec(
    name="ablation",
    result=Lazy("tl_idempotence.probes.ablation", "Ablation").load,
    run=run_ablation,
    options=(),  # tli.ablation's own (AblationArgs), forwarded and validated there
    model="weights_any_processing",
    why="the ablation runs it with its heads zeroed",
)
