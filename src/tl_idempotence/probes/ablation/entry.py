"""The public :func:`ablation`: its arguments checked where they enter, then the head sets planned
(:mod:`~tl_idempotence.probes.ablation.controls`), the passes run (:mod:`~tl_idempotence.probes.ablation.passes`)
and the result built (:mod:`~tl_idempotence.probes.ablation.result`). Definitions: the
:mod:`tl_idempotence.probes.ablation` package docstring (the "module docstring" below), which re-exports it.
"""

from __future__ import annotations

import difflib
from collections.abc import Sized
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ...core.defaults import default_of
from ...core.heads import kv_layout
from ...core.kwargs import warn_at_caller
from ...core.options import check_bool, check_int, check_seed, strict_kwargs
from ...core.selection import select_heads
from ...errors import OptionError, OptionTypeError, UnsupportedModelError
from ...sources.tl import TLModelSource, is_causal_lm, is_tl_model
from ..tokens import corpus_name, prepare_tokens
from .controls import plan_sets
from .kinds import ABLATION_HOOKS, ABLATION_KINDS
from .passes import run_sets
from .result import Ablation, AblationSummary, Losses, ablation_summary, ablation_tables, window_sums_table

if TYPE_CHECKING:  # pragma: no cover
    from typing import Literal

    from torch import Tensor

    from ...core.hints import HeadsLike, IntLike, TextsLike, TLModel

__all__ = ["ABLATION_HOOKS", "ABLATION_KINDS", "DEFAULT_N_CONTROLS", "MAX_CONTROLS", "AblationArgs", "ablation"]

#: The most control sets accepted.
MAX_CONTROLS = 1000
#: Default number of matched control sets: the p-value's floor is 1/40 = 0.025, so a flagged set that beats
#: all of them, or all but one, gets p <= 0.05.
DEFAULT_N_CONTROLS = default_of("tli.ablation", "n_controls")


def _check_model(model: Any) -> None:
    """Refuse what ``ablation`` cannot run: not a TransformerLens model, or not a causal LM.

    Raises:
        UnsupportedModelError: either (names the class).
    """
    if not is_tl_model(model):
        raise UnsupportedModelError(
            f"ablation needs a TransformerLens model (HookedTransformer or TransformerBridge) to run with hooks; got "
            f"{type(model).__name__}. Load one with tl_idempotence.models.load(...)."
        )
    if not is_causal_lm(model):
        raise UnsupportedModelError(
            f"ablation measures next-token loss, which needs a causal language model; {type(model).__name__} "
            f"({getattr(model.cfg, 'model_name', '?')}) is an encoder (bidirectional attention)."
        )


def _check_kind(kind: Any) -> None:
    """``kind`` checked: ``"mean"`` or ``"zero"``.

    Raises:
        OptionTypeError: not a string. OptionError: another string (names the closest kind).
    """
    if not isinstance(kind, str):
        raise OptionTypeError(f"kind must be 'mean' or 'zero'; got {type(kind).__name__} {kind!r}.")
    if kind not in ABLATION_KINDS:
        close = difflib.get_close_matches(kind, ABLATION_KINDS, n=1, cutoff=0.4)
        raise OptionError(
            f"kind must be 'mean' or 'zero'; got {kind!r}" + (f" (did you mean {close[0]!r}?)" if close else "") + "."
        )


def _check_heads_given(heads: Any) -> None:
    """Refuse no heads at all (None or empty) with what to pass; the pairs themselves are checked by
    :func:`~tl_idempotence.core.selection.select_heads`.

    Raises:
        OptionError: ``heads`` is None or empty.
    """
    if heads is None:
        raise OptionError("heads is None: give the (layer, head) pairs to ablate, e.g. rep.closed_heads.")
    if hasattr(heads, "__len__") and not isinstance(heads, (str, bytes)) and len(cast(Sized, heads)) == 0:
        raise OptionError(
            "heads is empty: give the (layer, head) pairs to ablate (rep.closed_heads is empty when no head "
            "reaches the report's threshold)."
        )


def _windows(model: Any, texts: Any, seq_len: int, max_tokens: Any, text_column: str) -> tuple[Tensor, Tensor]:
    """The token windows (:func:`~tl_idempotence.probes.tokens.prepare_tokens`) and their counted positions,
    refused when no window has a counted target token.

    Raises:
        OptionError: no counted target (or the errors of ``prepare_tokens``: empty texts, bad counts, ...).
    """
    toks, counted = prepare_tokens(model, texts, seq_len=seq_len, max_tokens=max_tokens, text_column=text_column)
    if toks.shape[1] < 2 or not bool(counted[:, 1:].any()):
        raise OptionError(
            "No counted target token: next-token loss needs windows of at least 2 tokens with a non-special "
            "token after the first position."
        )
    return toks, counted


class AblationArgs(TypedDict, total=False):
    """The keyword options of :func:`ablation` besides ``model`` and ``heads`` (``**kwargs: Unpack[AblationArgs]``
    where they are forwarded, e.g. ``rep.ablation(model, ...)``); meaning and validation in :func:`ablation`."""

    texts: TextsLike | None
    kind: Literal["mean", "zero"]
    n_controls: IntLike
    seed: IntLike
    seq_len: IntLike
    max_tokens: IntLike | None
    batch_size: IntLike
    singles: bool
    text_column: str
    progress: bool


@strict_kwargs
def ablation(
    model: TLModel,
    heads: HeadsLike,
    texts: TextsLike | None = None,
    *,
    kind: Literal["mean", "zero"] = "mean",
    n_controls: IntLike = DEFAULT_N_CONTROLS,
    seed: IntLike = 0,
    seq_len: IntLike = 128,
    max_tokens: IntLike | None = 512,
    batch_size: IntLike = 8,
    singles: bool = False,
    text_column: str = "text",
    progress: bool = True,
) -> Ablation:
    """Next-token loss change when the given heads are ablated, against matched random head sets.

    Runs a clean pass over the text, then every head set (the flagged set, ``n_controls`` matched
    controls and, with ``singles``, each head alone) batched ``batch_size`` at a time on each window,
    sharing the layers before the first ablated one, with TransformerLens hooks on
    ``blocks.{l}.attn.hook_z``; no weight is changed. Definitions (ablation, loss, batching,
    matched controls, p-value, intervals): module docstring. Cost: roughly ``(2 + n_controls)``
    forward passes over ``max_tokens`` tokens, less the shared prefix; on SmolLM2-135M with its 13
    closed heads (first ablated layer 5) and the defaults about 40 s on one idle core (README,
    "What each analysis costs"); the progress bar shows an estimate after the first forward pass.

    Args:
        model: a causal ``HookedTransformer`` or ``TransformerBridge`` (with a tokenizer for text).
        heads: ``(layer, head)`` pairs or a DataFrame with ``layer``/``head`` columns
            (``rep.closed_heads``; ``rep.ablation(model=...)`` passes it).
        texts: ``None`` (the default corpus: standard-library docstrings), a string, a list of
            strings / ``pathlib.Path`` files, a ``datasets.Dataset`` or token ids ``[batch, pos]``.
        kind: ``"mean"`` (replace ``z_h`` by its clean mean over the counted positions) or ``"zero"``.
        n_controls: matched random sets (0..1000; 0 gives no p-value), pairwise distinct and never the flagged
            set; when at most that many distinct matched sets exist, all of them are used (``summary
            ["n_distinct_controls"]``). The p-value cannot go below ``1/(controls used + 1)``.
        seed: seed of the control draws and of the bootstrap.
        seq_len: window length in tokens (with the special tokens), >= 2.
        max_tokens: counted tokens to use at least, in whole windows
            (:func:`~tl_idempotence.probes.tokens.prepare_tokens`); None: all of ``texts``.
            ``summary["n_tokens"]`` counts the targets measured (the counted positions after each
            window's first): on the default corpus with SmolLM2's tokenizer the default 512 takes 5
            windows of 128, 634 targets.
        batch_size: sequences per forward pass (1..4096): windows in the clean pass, head sets of one
            window afterwards. Memory ~ ``batch_size × seq_len × d_vocab`` floats; numbers agree across
            values to float rounding; 1 runs one forward pass per set.
        singles: also ablate each head alone (one more set per head) for ``heads.delta_loss``.
        text_column: text column of a ``datasets.Dataset``.
        progress: tqdm bar over forward passes, with a time estimate.

    Every argument is validated here, where it enters.

    Returns:
        :class:`Ablation` (``.summary`` leads with the flagged Δ, the control median and the p-value;
        ``.controls``, ``.heads``, ``.window_losses``).

    Raises:
        UnsupportedModelError: not a TransformerLens model, or not a causal LM (an encoder has no
            next-token loss).
        OptionError: ``heads`` empty or naming a layer/head the model lacks, an unknown ``kind``,
            ``n_controls`` outside 0..1000, ``batch_size`` outside 1..4096, empty texts, no counted
            target token, bad counts; ``n_controls > 0`` when no matched control set exists (every head of
            every flagged layer is flagged).
        OptionTypeError: an argument of the wrong type (``singles="yes"``, ``n_controls=2.0``, ...).
        Exception: whatever the model or a hook registered on it raises (an error in a shared-prefix pass is
            taken for the model refusing the repeated residual only when no hook of the user's is registered).

    Warns:
        UserWarning: ``n_controls > 0`` and fewer than :data:`MIN_CONTROLS_FOR_P_005` distinct matched sets exist
            (``p <= 0.05`` is impossible; also in ``summary["controls_warning"]``, the note and ``repr``).
    """
    _check_model(model)
    _check_kind(kind)
    n_controls = check_int(n_controls, "n_controls", 0, MAX_CONTROLS)
    seed = check_seed(seed)
    seq_len = check_int(seq_len, "seq_len", 2, 1 << 20)
    batch_size = check_int(batch_size, "batch_size", 1, 4096)
    singles = check_bool(singles, "singles")
    progress = check_bool(progress, "progress")
    _check_heads_given(heads)
    src = TLModelSource(model)
    n_heads = src.info.n_heads
    flagged = select_heads(heads, list(src.layers()), n_heads)
    toks, counted = _windows(model, texts, seq_len, max_tokens, text_column)
    plan = plan_sets(flagged, n_heads, n_controls, seed, singles)
    if plan.warning:
        warn_at_caller(f"tli.ablation: {plan.warning}.", UserWarning)  # the user's line, via rep.ablation too

    clean_s, sums, n_tok, run = run_sets(model, toks, counted, plan.sets, kind, batch_size, progress)
    losses = Losses.of(clean_s, sums, n_tok, plan.n_controls)
    heads_df, ctrl_df, win_df = ablation_tables(plan, losses, kv_layout(n_heads, src.info.n_kv_heads), singles)
    summary = ablation_summary(plan, losses, run, heads_df, seed, kind, src.info.model_name, int(toks.shape[0]))
    options = {
        "kind": kind,
        "n_controls": plan.n_requested,
        "seed": seed,
        "seq_len": seq_len,
        "max_tokens": max_tokens,
        "batch_size": batch_size,
        "singles": singles,
        "corpus": corpus_name(texts),
        **ABLATION_HOOKS[kind],
    }
    return Ablation(
        heads=heads_df,
        controls=ctrl_df,
        summary=AblationSummary(summary),
        info=src.info,
        options=options,
        window_losses=win_df,
        window_sums=window_sums_table(plan, losses),
        run_info=run,
    )
