"""The declaration of ``rep.causal`` (a causal test of closure, SPEC 13; :mod:`.causal`): its options, identity check,
page section, export and flag. Torch- and pandas-free (:mod:`.join_spec`); the body imports the probe when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.kwargs import strict_kwargs
from ..core.lazy import Lazy
from ..core.option_specs import OptionSpec
from ..errors import OptionError, OptionTypeError
from .join_defaults import CAUSAL_N_PERMUTATIONS, CAUSAL_VARIANTS
from .join_spec import (
    JoinFlag,
    JoinSpec,
    batch_size_option,
    controls_option,
    fits_heads,
    match_by_option,
    needs_model_text,
    report_heads,
    resamples_option,
    seed_option,
    seq_len_option,
    tokens_option,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import HeadsLike, JoinReport, TextsLike, TLModel
    from .causal import CausalTest

__all__ = ["CAUSAL"]


def check_variants(x: Any, name: str) -> tuple[str, ...]:
    """Names from :data:`~tl_idempotence.report.join_defaults.CAUSAL_VARIANTS` (a string or a sequence), distinct,
    returned in that order.

    Raises:
        OptionTypeError: not a string or a sequence of strings. OptionError: an unknown, repeated or no variant.
    """
    if isinstance(x, str):
        x = (x,)
    if not isinstance(x, (list, tuple)):
        raise OptionTypeError(f"{name} must be names from {CAUSAL_VARIANTS} (a str or a list); got {type(x).__name__}.")
    bad = [v for v in x if not isinstance(v, str) or v not in CAUSAL_VARIANTS]
    if bad or not x or len(set(x)) != len(x):
        raise OptionError(f"{name} must be distinct names from {CAUSAL_VARIANTS}; got {list(x)}.")
    return tuple(v for v in CAUSAL_VARIANTS if v in x)


@strict_kwargs
def run_causal(
    rep: JoinReport,
    model: TLModel | None = None,
    texts: TextsLike | None = None,
    heads: HeadsLike | None = None,
    *,
    variants: tuple[str, ...],
    n_controls: int,
    match_by: str,
    seq_len: int,
    max_tokens: int | None,
    batch_size: int,
    n_permutations: int,
    seed: int,
    progress: bool = True,
) -> CausalTest:
    """``rep.causal`` (its docstring): the model checked against the report by content, the closed heads (or
    ``heads``) matched with controls, the probe run on both and the groups compared."""
    from ..probes.causal import causal_closure
    from .causal import causal_join, plan_heads

    m = CAUSAL.model_of(rep, model)  # the one identity check: sizes, processing, every measured layer's weights
    h = rep.heads
    closed = [lab for lab, c in zip(h.index, h["closed"], strict=True) if bool(c)]
    if heads is None:
        chosen = closed
    else:
        chosen = report_heads(rep, heads)
        other = [lab for lab in chosen if lab not in set(closed)]
        if other:
            raise OptionError(
                f"heads {other[:10]} are not closed at this report's threshold ({rep.threshold:g}): rep.causal tests "
                "closed heads against non-closed controls. Lower the threshold (rep.with_threshold(t).causal()) or run "
                "tli.causal_closure(model, heads=...) on any heads."
            )
    if not chosen:
        raise OptionError(
            f"This report has no closed head at threshold {rep.threshold:g}: nothing to test. Lower the threshold "
            "(rep.with_threshold(t).causal()) or run tli.causal_closure(model, heads=...) on any heads."
        )
    _, matching = plan_heads(h, chosen, n_controls, match_by)
    order = {lab: i for i, lab in enumerate(h.index)}
    run = sorted({*chosen, *matching.controls}, key=order.__getitem__)
    probe = causal_closure(
        m, heads=run, texts=texts, variants=variants, seq_len=seq_len, max_tokens=max_tokens, batch_size=batch_size,
        progress=progress,
    )  # fmt: skip
    return causal_join(
        probe, h, chosen, rep.threshold, k=n_controls, size=match_by, n_permutations=n_permutations, seed=seed
    )


def _section(rep: Any, result: Any) -> Any:
    from ..views.causal import causal_section

    return causal_section(result)


CAUSAL = JoinSpec(
    name="causal",
    result=Lazy("tl_idempotence.report.causal", "CausalTest").load,
    run=run_causal,
    options=(
        OptionSpec(
            "variants",
            CAUSAL_VARIANTS,
            "the OV edits (closure_free, closure_only, zero, mean)",
            "choice",
            choices=CAUSAL_VARIANTS,
            types="str | Sequence[str]",
            hint="str | Sequence[str]",
            check=check_variants,
        ),
        controls_option(),
        match_by_option("what controls are matched on: |α| (abs_alpha) or ‖T‖_F (norm)"),
        seq_len_option(128, "the probe's window length"),
        tokens_option(512, "the probe's token budget (whole windows; None: the whole text)"),
        batch_size_option("windows per clean forward pass"),
        resamples_option("n_permutations", CAUSAL_N_PERMUTATIONS, "relabellings drawn where more than 100,000 exist"),
        seed_option("the drawn relabellings' seed"),
    ),
    model="weights",
    why="the causal test runs it with each head's OV edited",
    fits=fits_heads(Lazy("tl_idempotence.report.causal", "check_causal_fits_report")),
    page=_section,
    record=Lazy("tl_idempotence.report.causal", "causal_record"),
    columns=Lazy("tl_idempotence.report.causal", "causal_columns"),
    cli=JoinFlag(
        "--causal",
        "also run the causal test of closure (SPEC 13: each closed head and a matched control of its layer edited "
        "closure-free, closure-only, zero and mean at hook_z; the attended token's final-logit change, self-repair "
        "and the loss change, closed against controls within layers; rep.causal): a page section, the columns in "
        "--csv, the result in --json; seeded by --seed (needs a model TransformerLens can run; CPU-minutes)",
        needs_model=needs_model_text("--causal", "runs the model with heads edited", "rep.causal"),
        progress="tl-idempotence: the causal test of closure (closed heads and matched controls edited)...",
        text=lambda result: str(result.headline),
    ),
    display=Lazy("tl_idempotence.views.causal", "causal_html"),
    display_kind="causal",
)
