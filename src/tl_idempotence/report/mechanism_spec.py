"""The declaration of ``rep.mechanism`` (what the closed heads do to tokens, SPEC 12; :mod:`.mechanism`): its
options, identity check, page section, export and flag. Torch- and pandas-free (:mod:`.join_spec`); the body
imports the probes it runs when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.kwargs import strict_kwargs
from ..core.lazy import Lazy
from ..core.option_specs import OptionSpec
from ..core.options import check_bool
from ..errors import OptionError, OptionTypeError
from .join_defaults import DEFAULT_N_PERMUTATIONS, EXPORT_MECHANISM_COLUMNS, MAX_BOOT
from .join_spec import (
    JoinFlag,
    JoinSpec,
    batch_size_option,
    check_identity,
    controls_option,
    count_option,
    fits_heads,
    int_option,
    match_by_option,
    needs_model_text,
    optional,
    page_at_threshold,
    report_heads,
    resamples_option,
    seed_option,
    seq_len_option,
    tokens_option,
)

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from ..core.hints import HeadsLike, JoinReport, TextsLike, TLModel
    from ..probes.roles import HeadRoles
    from .mechanism import Mechanism
    from .roles import RoleAssociation

__all__ = ["DEFAULT_N_PERMUTATIONS", "EXPORT_MECHANISM_COLUMNS", "MECHANISM"]


#: The copy-suppression condition's default k (``attended_token_effect``'s ``predicted_k``; imports nothing).
DEFAULT_PREDICTED_K = 10


def _check_n_tokens(x: Any, name: str) -> int:
    """The token readout's sample of source tokens: 1 .. :data:`~tl_idempotence.probes.head_tokens.MAX_TOKENS`
    (imports torch when called)."""
    from ..core.options import check_int
    from ..probes.head_tokens import MAX_TOKENS

    return check_int(x, name, 1, MAX_TOKENS)


def _text_sets(texts: Any) -> list[Any]:
    """``texts`` as a list of text sets: a list or tuple of two or more sets (each ``None``, a list or tuple of texts,
    a token tensor or array, or a ``datasets.Dataset``) is several; anything else is one.

    Raises:
        OptionTypeError: a list mixing text sets with single texts (strings, paths).
        OptionError: an empty list, or an empty set in the list (names it), before any set runs.
    """
    import os

    def one_set(x: Any) -> bool:
        return x is None or isinstance(x, (list, tuple)) or hasattr(x, "shape") or hasattr(x, "column_names")

    if isinstance(texts, (list, tuple)) and not texts:
        raise OptionError("texts is an empty list: no text and no text set (None: the default corpus).")
    if not isinstance(texts, (list, tuple)) or not any(one_set(x) for x in texts):
        return [texts]
    if not all(one_set(x) for x in texts):
        bad = next(x for x in texts if not one_set(x))
        raise OptionTypeError(
            "texts: a list of text sets (for the stability across sets) holds only sets (None, lists of texts, token "
            f"tensors, datasets); this one also holds {type(bad).__name__} {bad!r:.40}"
            + (" (a list of texts is one set: pass it alone)" if isinstance(bad, (str, os.PathLike)) else "")
        )
    empty = [
        i for i, x in enumerate(texts)
        if (isinstance(x, (list, tuple)) and not x) or (hasattr(x, "shape") and 0 in tuple(x.shape))
    ]  # fmt: skip
    if empty:
        raise OptionError(f"texts[{empty[0]}] is an empty text set (each set of texts=[set1, set2, ...] needs text).")
    for j, b in enumerate(texts):
        i = next((i for i, a in enumerate(texts[:j]) if _same_set(a, b)), None)
        if i is not None:  # every head would keep its direction: a stability of one text read twice
            raise OptionError(f"texts[{j}] is texts[{i}] again: the stability across sets needs different texts.")
    return list(texts)


def _same_set(a: Any, b: Any) -> bool:
    """Whether two text sets are one: the same object, equal lists of texts or equal token arrays."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return all(isinstance(x, str) for x in (*a, *b)) and list(a) == list(b)
    if hasattr(a, "shape") and hasattr(b, "shape") and not hasattr(a, "column_names"):
        import numpy as np

        def host(x: Any) -> Any:
            return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)

        return bool(np.array_equal(host(a), host(b)))
    return False


@strict_kwargs
def run_mechanism(
    rep: JoinReport,
    model: TLModel | None = None,
    texts: TextsLike | Sequence[TextsLike | None] | None = None,
    heads: HeadsLike | None = None,
    roles: HeadRoles | RoleAssociation | None = None,
    *,
    n_tokens: int,
    k: int,
    seq_len: int | None,
    max_tokens: int | None,
    batch_size: int,
    n_permutations: int,
    seed: int,
    match_by: str,
    n_controls: int,
    predicted_k: int | None,
    n_boot: int,
    progress: bool,
) -> Mechanism:
    """``rep.mechanism`` (its docstring): the model checked against the report by content (and ``roles``), the
    matched controls of the closed heads asked for (SPEC 13), then the attended-token effect (on every text set),
    the token readout, both copying scores and the projection facts of the joined heads, joined and tested."""
    from ..core.heads import read_layer
    from ..maths.projection_facts import projection_facts
    from ..probes.head_tokens import head_tokens
    from ..probes.roles import HeadRoles, copying_scores
    from ..probes.tied import embedding_tie, own_copying_scores
    from ..probes.token_effect import attended_token_effect
    from ..sources.tl import TLModelSource
    from .mechanism import mechanism_join
    from .mechanism_controls import controls_matching, weights_frame
    from .roles import RoleAssociation

    if roles is not None and not isinstance(roles, (HeadRoles, RoleAssociation)):
        raise OptionTypeError(
            f"roles must be a HeadRoles (tli.head_roles) or a RoleAssociation (rep.roles); got {type(roles).__name__}."
        )
    m = MECHANISM.model_of(rep, model)  # the one identity check: sizes, processing, every measured layer's weights
    hr = check_identity(rep, roles=roles) if roles is not None else None
    h = rep.heads
    asked = report_heads(rep, heads)
    tie = embedding_tie(m)
    d_vocab = int(getattr(m.cfg, "d_vocab", 0) or 0)
    for name, v in (("k", k), ("predicted_k", predicted_k)):
        if d_vocab and v is not None and v > d_vocab:
            raise OptionError(f"{name} must be at most d_vocab = {d_vocab}; got {v}.")
    sets = _text_sets(texts)
    matching = controls_matching(h, asked, n_controls, match_by)  # weights only: the report's |α|, ‖T‖, closed
    joined = h.index[h.index.isin(asked) | h.index.isin(matching.controls)]  # the report's order
    closed = set(h.index[h["closed"].to_numpy(dtype=bool)])
    compared = [lab for lab in joined if lab in closed or lab in set(matching.controls)]

    def pairs_of(labels: Any) -> list[tuple[int, int]]:
        return [(int(h.loc[x, "layer"]), int(h.loc[x, "head"])) for x in labels]

    kw: dict[str, Any] = dict(
        seq_len=seq_len, max_tokens=max_tokens, batch_size=batch_size, seed=seed, progress=progress
    )
    effect = attended_token_effect(  # first: the text is checked before the readout's cost
        m, heads=pairs_of(joined), texts=sets[0], predicted_k=predicted_k,
        predicted_heads=None if predicted_k is None else pairs_of(compared), **kw,
    )  # fmt: skip
    more = [
        (f"set{i}", attended_token_effect(m, heads=pairs_of(compared), texts=s, predicted_k=None, **kw).table)
        for i, s in enumerate(sets[1:], 1)
        if compared
    ]
    more += [(f"set{i}", effect.table.iloc[:0]) for i in range(len(more) + 1, len(sets))]  # nothing to compare
    tokens = head_tokens(m, heads=pairs_of(joined), n_tokens=n_tokens, k=k, seed=seed, progress=progress)
    copying, _, _ = copying_scores(m)
    own, _ = own_copying_scores(m)
    src = TLModelSource(m)
    by_layer: dict[int, list[int]] = {}
    for a, b in pairs_of(joined):
        by_layer.setdefault(a, []).append(b)
    proj = projection_facts((read_layer(src, lay, src.info) for lay in sorted(by_layer)), heads=by_layer)
    return mechanism_join(
        h.loc[joined], rep.threshold, tokens, effect, copying, own, tie, hr, weights=weights_frame(h, copying, own),
        projection=proj, asked=asked, sets=more, n_permutations=n_permutations, seed=seed, match_by=match_by,
        n_controls=n_controls, n_boot=n_boot,
    )  # fmt: skip


MECHANISM = JoinSpec(
    name="mechanism",
    result=Lazy("tl_idempotence.report.mechanism", "Mechanism").load,
    run=run_mechanism,
    options=(
        count_option("n_tokens", 512, "the token readout's sample of source tokens", _check_n_tokens, needs_torch=True),
        count_option("k", 20, "the token readout's top/bottom size", int_option(1)),
        seq_len_option(
            None, "the attended-token effect's window length (None: 128, or the model's n_ctx when smaller)"
        ),
        tokens_option(2048, "the attended-token effect's token budget (None: no budget)"),
        batch_size_option("the attended-token effect's windows per forward pass"),
        resamples_option("n_permutations", DEFAULT_N_PERMUTATIONS, "permutations of the Spearman test"),
        seed_option("the token sample's, the null sources', the permutations' and the bootstrap's seed"),
        match_by_option("the size the matched controls are nearest in: 'abs_alpha' (|α|) or 'norm' (‖T‖_F)"),
        controls_option(),
        count_option(
            "predicted_k",
            DEFAULT_PREDICTED_K,
            "the copy-suppression condition's k: the attended token among the k largest logits at the head's input "
            "(None: not measured)",
            optional(int_option(1)),
            none=True,
        ),
        count_option(
            "n_boot",
            1000,
            f"bootstrap replicates of the intervals (10 .. {MAX_BOOT})",
            int_option(10, MAX_BOOT),
        ),
        OptionSpec(
            "progress",
            True,
            "tqdm bars of both probes on stderr",
            "choice",
            types="bool",
            hint="bool",
            check=check_bool,
        ),
    ),
    model="weights",
    why="the attended-token effect runs it on text",
    roles=True,
    fits=fits_heads(Lazy("tl_idempotence.report.mechanism", "check_mechanism_fits_report")),
    page=page_at_threshold(Lazy("tl_idempotence.views.page", "mechanism_section")),
    record=Lazy("tl_idempotence.report.mechanism", "mechanism_record"),
    columns=Lazy("tl_idempotence.report.mechanism", "mechanism_columns"),
    cli=JoinFlag(
        "--mechanism",
        "also measure what the heads do to tokens (SPEC 12: the OV circuit's token readout, each head's direct "
        "effect on the token it attends to on the default corpus, the copying score with G = I) and whether sign(α) "
        "predicts that effect (rep.mechanism): a page section, the columns in --csv, the result in --json; seeded "
        "by --seed (needs a model TransformerLens can run: a zoo model or a hub name; minutes on a CPU)",
        compute=lambda rep, model, value, joined, args, progress=True: rep.mechanism(
            model=model, roles=joined.get("roles"), seed=args.seed, progress=progress
        ),
        needs_model=needs_model_text(
            "--mechanism", "runs the model on text (the attended-token effect)", "rep.mechanism"
        ),
        progress="tl-idempotence: measuring what the heads do to tokens (token readout, attended-token effect)...",
        text=lambda mech: str(mech.headline),
    ),
)
