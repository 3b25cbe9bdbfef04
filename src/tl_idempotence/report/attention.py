"""Attention views of a report's flagged heads: the probe runs the model, the view draws its result.

:func:`~tl_idempotence.probes.attention.attention_patterns` runs the forward pass (TransformerLens's
``hook_pattern``) and returns an :class:`~tl_idempotence.probes.attention.AttentionPatterns`;
:mod:`tl_idempotence.views.attention` only draws it (circuitsvis, offline). This module joins the two for the
public entry points — :func:`attention_view` (``tli.attention_view``), ``rep.show_attention`` and the attention
section of ``rep.save_html`` — and checks, with the one report-identity function
(:func:`~tl_idempotence.report.identity.check_report_matches`), that a model given for a report is the model it
measured. The views' drawing functions are imported where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from ..core.kwargs import strict_kwargs
from ..errors import OptionError
from ..probes.attention import FlaggedHeads, attention_patterns, flagged_heads
from ..sources.dispatch import head_source
from .identity import check_report_matches

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import HeadPairs, IntLike, TLModel

__all__ = ["attention_section_html", "attention_view", "check_model_matches", "report_attention_view"]


@strict_kwargs
def attention_view(
    model: TLModel,
    text: str,
    heads: HeadPairs,
    *,
    max_tokens: IntLike = 64,
    head_table: pd.DataFrame | None = None,
    threshold: float | None = None,
    why: str | None = None,
) -> Any:
    """Run ``model`` on ``text`` and draw the attention patterns of ``heads`` with circuitsvis, offline
    (a view of the flagged heads of SPEC 2; not a SPEC quantity).

    Args:
        model: a TransformerLens model with a tokenizer.
        text: the text to run.
        heads: ``(layer, head)`` pairs (e.g. from :func:`~tl_idempotence.probes.attention.flagged_heads`).
        max_tokens: cut the text to this many positions (its tokens and the special tokens); the caption says so.
        head_table: optional per-head table (``layer, head, P, alpha``) for the labels.
        threshold: the P threshold (labels never round across it).
        why: what these heads are, for the caption (default: a FlaggedHeads' own description).

    Returns:
        :class:`~tl_idempotence.views.attention.AttentionView`: patterns ``[n_heads_sel, query, key]`` drawn, with
        a caption that counts the text's own tokens and the special tokens separately.

    Raises:
        UnsupportedModelError / OptionError / OptionTypeError: see
            :func:`~tl_idempotence.probes.attention.attention_patterns`.
    """
    pats = attention_patterns(model, text, heads, max_tokens=max_tokens)
    if why is None:
        why = heads.describe() if isinstance(heads, FlaggedHeads) else f"{len(pats.heads)} chosen heads"
    from ..views import draw_attention

    return draw_attention(pats, why=why, max_tokens=int(max_tokens), head_table=head_table, threshold=threshold)


def check_model_matches(rep: Any, model: Any) -> None:
    """Refuse a model that is not the one ``rep`` measured: other attention sizes, or — when both record the
    same weight processing (SPEC 10) — other attention weights (a measured layer's O/V sha256 fingerprint,
    :meth:`~tl_idempotence.core.heads.LayerHeads.fingerprint`, differs from the one the report records).

    The report-identity check (:func:`~tl_idempotence.report.identity.check_report_matches`) with the model's
    head source. Names are not compared (a checkpoint folder and the TransformerLens model of the same weights
    carry different names); sizes and weights are. Weights processed differently (a raw-weights report, a
    ``fold_ln`` model) cannot be compared byte for byte and are not.

    Raises:
        ReportMismatchError (an OptionError): the sizes or a layer's weights differ (names the report's model
            and the model given).
    """
    joins = getattr(rep, "check_joins", None)
    if joins is not None:  # the report's one join check (IdempotenceReport.check_joins)
        joins(model=model, processing_may_differ=True)
        return
    src = head_source(model)  # pragma: no cover - a report-like object without it
    check_report_matches(
        rep,
        what=f"The model given, {src.info.model_name!r} ({type(model).__name__}),",
        fix="Pass the model the report was made from.",
        source=src,
        processing_may_differ=True,
    )


@strict_kwargs
def report_attention_view(
    rep: Any, text: Any, model: Any = None, heads: Any = None, top_k: Any = None, max_tokens: Any = 64
) -> Any:
    """The attention view of a report's flagged heads (every closed head, else the top 8 by P).

    The model (given, or the report's own while it is alive) is checked against the report first, by content
    (:func:`check_model_matches`; a model edited in place since the report was made is refused): the view labels
    its heads with the report's P.

    Returns:
        :class:`~tl_idempotence.views.attention.AttentionView`.

    Raises:
        OptionError: no TransformerLens model (pass ``model=``; a report keeps only a weak reference),
            or a ``model`` that is not the one the report measured (other sizes or weights).
    """
    m = model if model is not None else rep.model
    if m is None:
        raise OptionError(
            "No TransformerLens model to run: this report was made from a checkpoint file or a transformers model, "
            "or the model object is gone. Pass it: rep.show_attention(text, model=model)."
        )
    check_model_matches(rep, m)  # the report's own model too: one edited in place since is another model
    chosen = flagged_heads(rep, top_k=top_k) if heads is None else heads  # pairs checked by attention_patterns
    return attention_view(m, text, chosen, max_tokens=max_tokens, head_table=rep.heads, threshold=rep.threshold)


@strict_kwargs
def attention_section_html(
    rep: Any, text: Any, model: Any = None, heads: Any = None, top_k: Any = None, max_tokens: Any = 64
) -> str:
    """The attention section (heading, caption, circuitsvis view) of the report page: :func:`report_attention_view`
    drawn by :func:`tl_idempotence.views.attention.attention_section`.

    Raises:
        The errors of :func:`report_attention_view`.
    """
    view = report_attention_view(rep, text, model=model, heads=heads, top_k=top_k, max_tokens=max_tokens)
    from ..views import attention_section

    return str(attention_section(view, text))
