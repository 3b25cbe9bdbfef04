"""The declaration of the attention view of a report's flagged heads (:mod:`.attention`): ``rep.show_attention``
and the page's attention section (``rep.save_html(attention_text=...)``, the CLI's ``--attention-text``).
Torch- and pandas-free (:mod:`.join_spec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.kwargs import strict_kwargs
from ..core.lazy import Lazy
from ..errors import OptionError, OptionTypeError
from .join_spec import JoinFlag, JoinSpec, count_option, int_option, optional

__all__ = ["ATTENTION", "AttentionRequest", "refuse_unused_options"]


_MAX_TOKENS = count_option(
    "max_tokens",
    64,
    "cut the text to this many tokens, special tokens included (the view says so when it cuts)",
    int_option(2),
)
_TOP_K = count_option(
    "top_k",
    None,
    "cap on the default heads (every closed head, else the top 8 by P)",
    optional(int_option(1)),
    metavar="K",
    none=True,
)


@dataclass(frozen=True)
class AttentionRequest:
    """The page's attention section, asked for (run when the page is rendered, after the output's checks): the
    view of ``heads`` (default: every closed head, else the top 8 by P, at most ``top_k``) on ``text``, run on
    ``model`` (default: the report's own while it is alive), cut to ``max_tokens``. The value of ``"attention"``
    in the ``joins`` of the page (a plain ``str`` is the text with the defaults)."""

    text: str
    model: Any = None
    heads: Any = None
    top_k: Any = None
    max_tokens: Any = _MAX_TOKENS.default


def refuse_unused_options(heads: Any, top_k: Any, max_tokens: Any) -> None:
    """``rep.save_html`` without ``attention_text``: its attention options would be silently ignored.

    Raises:
        OptionError: names the options given (``max_tokens`` other than its default).
    """
    ignored = [n for n, v in (("attention_heads", heads), ("top_k", top_k)) if v is not None]
    default = _MAX_TOKENS.default
    if not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens == default):
        ignored.append("max_tokens")
    if ignored:
        raise OptionError(
            f"{', '.join(ignored)} only apply to the attention view: give attention_text='...' too, or drop them."
        )


@strict_kwargs
def run_attention(rep: Any, text: Any, model: Any = None, heads: Any = None, *, top_k: Any, max_tokens: Any) -> Any:
    """``rep.show_attention`` (its docstring): :func:`~tl_idempotence.report.attention.report_attention_view`,
    which checks the model against the report by content (``rep.check_joins``, processing may differ)."""
    from .attention import report_attention_view

    return report_attention_view(rep, text, model=model, heads=heads, top_k=top_k, max_tokens=max_tokens)


def _fits(rep: Any, value: Any) -> AttentionRequest:
    if isinstance(value, str):
        return AttentionRequest(value)
    if not isinstance(value, AttentionRequest):
        raise OptionTypeError(
            f"the page's attention section is a text (str) or an AttentionRequest; got {type(value).__name__}."
        )
    return value


def _section(rep: Any, req: AttentionRequest) -> dict[str, Any]:
    from .attention import attention_section_html

    return {
        "html": attention_section_html(
            rep, req.text, model=req.model, heads=req.heads, top_k=req.top_k, max_tokens=req.max_tokens
        )
    }


ATTENTION = JoinSpec(
    name="attention",
    call="rep.show_attention",
    result=Lazy("tl_idempotence.views.attention", "AttentionView").load,
    run=run_attention,
    options=(_TOP_K, _MAX_TOKENS),
    model="weights_any_processing",
    why="the attention view runs it on the text",
    fits=_fits,
    page=_section,
    cli=JoinFlag(
        "--attention-text",
        "add circuitsvis attention patterns of the closed heads on TEXT to the HTML (needs a model TransformerLens "
        "can run: a zoo model or a hub name)",
        compute=lambda rep, model, value, joined, args: AttentionRequest(value, model=model),
        metavar="TEXT",
        needs_model="--attention-text needs a model TransformerLens can run (a zoo model or a hub name); a "
        "checkpoint path is read as weights only",
        page_only="adds attention views to the HTML page",
    ),
)
