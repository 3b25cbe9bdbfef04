"""tl_idempotence: near-idempotent attention heads (T² ≈ αT) in TransformerLens models.

Implements the analyses of "Scaled Idempotence in Transformer Attention: Paired OV
Geometry and Shared-Value Algebras" (arXiv 2609.01129); definitions in ``docs/definitions.md``.

The package is layered (``docs/architecture.md``); data flows one way:

    core (records, files, options) -> views (figures, HTML, displays) -> maths (closure)
    -> sources (models, files -> LayerHeads) -> analyses, probes (per layer)
    -> report (loop, summary, save) -> studies (trajectories, comparisons, sweeps) -> cli

(the views sit low so that every result above them draws itself with a plain import)

``import tl_idempotence`` is cheap: it imports nothing heavy (no torch until a function is
used, never transformer_lens, transformers or plotly); every public name below is loaded
on first use. ``model.idempotence_report(...)`` appears on TransformerLens's
``HookedTransformer``, ``HookedEncoder`` and ``TransformerBridge`` as soon as
transformer_lens (or ``transformer_lens.model_bridge``) is imported — before or after this
package — through a post-import hook (``wrapt.register_post_import_hook``); it keeps the
real signature and docstring of :func:`idempotence_report`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("tl_idempotence")
except PackageNotFoundError:  # pragma: no cover
    __version__ = "0+unknown"

#: Public name -> module that defines it (loaded on first access).
_EXPORTS: dict[str, str] = {
    # maths: the closure maths
    "Closure": "tl_idempotence.maths.closure",
    "closure": "tl_idempotence.maths.closure",
    # core
    "HeadSource": "tl_idempotence.core.heads",
    "LayerHeads": "tl_idempotence.core.heads",
    "ModelInfo": "tl_idempotence.core.heads",
    "kv_layout": "tl_idempotence.core.heads",
    # sources
    "head_source": "tl_idempotence.sources.dispatch",
    "Lineage": "tl_idempotence.sources.lineage",
    "train_lineage": "tl_idempotence.sources.lineage",
    # analyses
    "ReportOptions": "tl_idempotence.analyses.report_options",
    "MismatchResult": "tl_idempotence.analyses.mismatch",
    "mismatch": "tl_idempotence.analyses.mismatch",
    "Scramble": "tl_idempotence.analyses.scramble",
    "orientation_scramble": "tl_idempotence.analyses.scramble",
    "SearchResult": "tl_idempotence.analyses.search",
    "constructive_search": "tl_idempotence.analyses.search",
    "SharedValueAlgebra": "tl_idempotence.analyses.algebra",
    "shared_value_algebra": "tl_idempotence.analyses.algebra",
    "ActivationReturns": "tl_idempotence.probes.activations",
    "activation_returns": "tl_idempotence.probes.activations",
    "default_corpus": "tl_idempotence.probes.tokens",
    "flagged_heads": "tl_idempotence.probes.attention",
    "Ablation": "tl_idempotence.probes.ablation",
    "ablation": "tl_idempotence.probes.ablation",
    "load_ablation": "tl_idempotence.probes.ablation",
    "HeadRoles": "tl_idempotence.probes.roles",
    "head_roles": "tl_idempotence.probes.roles",
    "HeadTokens": "tl_idempotence.probes.head_tokens",
    "head_tokens": "tl_idempotence.probes.head_tokens",
    "load_head_tokens": "tl_idempotence.probes.head_tokens",
    "save_head_tokens": "tl_idempotence.probes.head_tokens",
    "AttendedTokenEffect": "tl_idempotence.probes.token_effect",
    "attended_token_effect": "tl_idempotence.probes.token_effect",
    "load_attended_token_effect": "tl_idempotence.probes.token_effect",
    "save_attended_token_effect": "tl_idempotence.probes.token_effect",
    "EmbeddingTie": "tl_idempotence.probes.tied",
    "CausalClosure": "tl_idempotence.probes.causal",
    "causal_closure": "tl_idempotence.probes.causal",
    "embedding_tie": "tl_idempotence.probes.tied",
    "own_copying_scores": "tl_idempotence.probes.tied",
    # report
    "IdempotenceReport": "tl_idempotence.report.report",
    "idempotence_report": "tl_idempotence.report.report",
    "load_report": "tl_idempotence.report.report",
    "attention_view": "tl_idempotence.report.attention",  # runs the probe, then the view draws
    "RoleAssociation": "tl_idempotence.report.roles",
    "Mechanism": "tl_idempotence.report.mechanism",
    "CausalTest": "tl_idempotence.report.causal",
    "load_roles": "tl_idempotence.report.roles",
    "save_roles": "tl_idempotence.report.roles",
    "load_mechanism": "tl_idempotence.report.mechanism",
    "save_mechanism": "tl_idempotence.report.mechanism",
    # studies
    "Trajectory": "tl_idempotence.studies.trajectory",
    "trajectory": "tl_idempotence.studies.trajectory",
    "load_trajectory": "tl_idempotence.studies.trajectory",
    "Comparison": "tl_idempotence.studies.compare",
    "compare": "tl_idempotence.studies.compare",
    "load_comparison": "tl_idempotence.studies.compare",
    "SweepResult": "tl_idempotence.studies.sweep",
    "sweep": "tl_idempotence.studies.sweep",
    "load_sweep": "tl_idempotence.studies.sweep",
    # views
    "AttentionView": "tl_idempotence.views.attention",
}
#: Public submodules reachable as attributes (``tli.models.load(...)``, ``tli.errors``).
_MODULES: dict[str, str] = {
    "models": "tl_idempotence.sources.zoo",
    "errors": "tl_idempotence.errors",
}

__all__ = sorted(_EXPORTS) + sorted(_MODULES)


# For type checkers only (mypy, pyright, an editor's language server): every public name with its real type, from
# the module the lazy loader takes it from (tests/unit/test_root_typing.py checks that this block and _EXPORTS,
# _MODULES name the same). At run time nothing here is imported: ``import tl_idempotence`` stays light.
if TYPE_CHECKING:  # pragma: no cover
    from tl_idempotence import errors as errors
    from tl_idempotence.analyses.algebra import SharedValueAlgebra as SharedValueAlgebra
    from tl_idempotence.analyses.algebra import shared_value_algebra as shared_value_algebra
    from tl_idempotence.analyses.mismatch import MismatchResult as MismatchResult
    from tl_idempotence.analyses.mismatch import mismatch as mismatch
    from tl_idempotence.analyses.report_options import ReportOptions as ReportOptions
    from tl_idempotence.analyses.scramble import Scramble as Scramble
    from tl_idempotence.analyses.scramble import orientation_scramble as orientation_scramble
    from tl_idempotence.analyses.search import SearchResult as SearchResult
    from tl_idempotence.analyses.search import constructive_search as constructive_search
    from tl_idempotence.core.heads import HeadSource as HeadSource
    from tl_idempotence.core.heads import LayerHeads as LayerHeads
    from tl_idempotence.core.heads import ModelInfo as ModelInfo
    from tl_idempotence.core.heads import kv_layout as kv_layout
    from tl_idempotence.maths.closure import Closure as Closure
    from tl_idempotence.maths.closure import closure as closure
    from tl_idempotence.probes.ablation import Ablation as Ablation
    from tl_idempotence.probes.ablation import ablation as ablation
    from tl_idempotence.probes.ablation import load_ablation as load_ablation
    from tl_idempotence.probes.activations import ActivationReturns as ActivationReturns
    from tl_idempotence.probes.activations import activation_returns as activation_returns
    from tl_idempotence.probes.attention import flagged_heads as flagged_heads
    from tl_idempotence.probes.causal import CausalClosure as CausalClosure
    from tl_idempotence.probes.causal import causal_closure as causal_closure
    from tl_idempotence.probes.head_tokens import HeadTokens as HeadTokens
    from tl_idempotence.probes.head_tokens import head_tokens as head_tokens
    from tl_idempotence.probes.head_tokens import load_head_tokens as load_head_tokens
    from tl_idempotence.probes.head_tokens import save_head_tokens as save_head_tokens
    from tl_idempotence.probes.roles import HeadRoles as HeadRoles
    from tl_idempotence.probes.roles import head_roles as head_roles
    from tl_idempotence.probes.tied import EmbeddingTie as EmbeddingTie
    from tl_idempotence.probes.tied import embedding_tie as embedding_tie
    from tl_idempotence.probes.tied import own_copying_scores as own_copying_scores
    from tl_idempotence.probes.token_effect import AttendedTokenEffect as AttendedTokenEffect
    from tl_idempotence.probes.token_effect import attended_token_effect as attended_token_effect
    from tl_idempotence.probes.token_effect import load_attended_token_effect as load_attended_token_effect
    from tl_idempotence.probes.token_effect import save_attended_token_effect as save_attended_token_effect
    from tl_idempotence.probes.tokens import default_corpus as default_corpus
    from tl_idempotence.report.attention import attention_view as attention_view
    from tl_idempotence.report.causal import CausalTest as CausalTest
    from tl_idempotence.report.mechanism import Mechanism as Mechanism
    from tl_idempotence.report.mechanism import load_mechanism as load_mechanism
    from tl_idempotence.report.mechanism import save_mechanism as save_mechanism
    from tl_idempotence.report.report import IdempotenceReport as IdempotenceReport
    from tl_idempotence.report.report import idempotence_report as idempotence_report
    from tl_idempotence.report.report import load_report as load_report
    from tl_idempotence.report.roles import RoleAssociation as RoleAssociation
    from tl_idempotence.report.roles import load_roles as load_roles
    from tl_idempotence.report.roles import save_roles as save_roles
    from tl_idempotence.sources import zoo as models  # noqa: F401 - tli.models, as _MODULES names it
    from tl_idempotence.sources.dispatch import head_source as head_source
    from tl_idempotence.sources.lineage import Lineage as Lineage
    from tl_idempotence.sources.lineage import train_lineage as train_lineage
    from tl_idempotence.studies.compare import Comparison as Comparison
    from tl_idempotence.studies.compare import compare as compare
    from tl_idempotence.studies.compare import load_comparison as load_comparison
    from tl_idempotence.studies.sweep import SweepResult as SweepResult
    from tl_idempotence.studies.sweep import load_sweep as load_sweep
    from tl_idempotence.studies.sweep import sweep as sweep
    from tl_idempotence.studies.trajectory import Trajectory as Trajectory
    from tl_idempotence.studies.trajectory import load_trajectory as load_trajectory
    from tl_idempotence.studies.trajectory import trajectory as trajectory
    from tl_idempotence.views.attention import AttentionView as AttentionView

else:
    # The lazy loader (PEP 562), hidden from type checkers: they see the imports above, so a misspelled name is
    # an error there instead of ``Any``.
    def __getattr__(name: str) -> Any:
        if name in _MODULES:
            mod = importlib.import_module(_MODULES[name])
            globals()[name] = mod
            return mod
        if name in _EXPORTS:
            value = getattr(importlib.import_module(_EXPORTS[name]), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module 'tl_idempotence' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


#: TransformerLens classes that got ``idempotence_report`` (filled by the post-import hook).
ATTACHED_TO: list[str] = []
_TL_CLASSES = {
    "transformer_lens": ("HookedTransformer", "HookedEncoder"),
    "transformer_lens.model_bridge": ("TransformerBridge",),
}


def _report_method() -> Any:
    """``idempotence_report`` as a method: ``model.idempotence_report(threshold=..., nulls=..., ...)``,
    with the function's real signature (``inspect.signature`` follows ``__wrapped__``) and docstring."""
    import functools

    from .report.report import idempotence_report

    @functools.wraps(idempotence_report)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            from .errors import OptionTypeError

            raise OptionTypeError(
                f"model.idempotence_report() takes its options as keywords (e.g. threshold=0.9, nulls=64); got "
                f"{len(args)} positional argument(s) {args!r:.80}."
            )
        return idempotence_report(self, **kwargs)

    return method


def _attach(module: Any) -> None:
    """Post-import hook: attach ``idempotence_report`` to the TransformerLens classes in ``module``.

    Reads the module's own namespace (``vars(module)``), never ``getattr``: transformer-lens 4.x
    removed ``HookedTransformer``/``HookedEncoder`` and its module ``__getattr__`` raises
    ``ImportError`` (not ``AttributeError``) for those names, so ``getattr(module, name, None)``
    would crash the import of this package. A class that is not there is skipped.
    """
    for cls_name in _TL_CLASSES.get(module.__name__, ()):
        cls = vars(module).get(cls_name)
        if not isinstance(cls, type):
            continue
        current = cls.__dict__.get("idempotence_report")
        if current is not None and getattr(current, "__tli_method__", False):
            continue
        method = _report_method()
        method.__tli_method__ = True
        setattr(cls, "idempotence_report", method)  # noqa: B010 - a class of another package
        if cls_name not in ATTACHED_TO:
            ATTACHED_TO.append(cls_name)


def _install_hooks() -> None:
    from wrapt import register_post_import_hook

    for mod_name in _TL_CLASSES:
        register_post_import_hook(_attach, mod_name)


_install_hooks()
