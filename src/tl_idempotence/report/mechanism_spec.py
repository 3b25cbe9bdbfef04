"""The declaration of ``rep.mechanism`` (what the closed heads do to tokens, SPEC 12; :mod:`.mechanism`): its
options, identity check, page section, export and flag. Torch- and pandas-free (:mod:`.join_spec`); the body
imports the probes it runs when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.kwargs import strict_kwargs
from ..errors import OptionError, OptionTypeError
from .join_defaults import DEFAULT_N_PERMUTATIONS, EXPORT_MECHANISM_COLUMNS, MAX_RESAMPLES
from .join_spec import JoinFlag, JoinSpec, check_identity, count_option, int_option, optional, seed_option

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .mechanism import Mechanism

__all__ = ["DEFAULT_N_PERMUTATIONS", "EXPORT_MECHANISM_COLUMNS", "MECHANISM"]


def _check_n_tokens(x: Any, name: str) -> int:
    """The token readout's sample of source tokens: 1 .. :data:`~tl_idempotence.probes.head_tokens.MAX_TOKENS`
    (imports torch when called)."""
    from ..core.options import check_int
    from ..probes.head_tokens import MAX_TOKENS

    return check_int(x, name, 1, MAX_TOKENS)


@strict_kwargs
def run_mechanism(
    rep: Any,
    model: Any = None,
    texts: Any = None,
    heads: Any = None,
    roles: Any = None,
    *,
    n_tokens: int,
    k: int,
    seq_len: int,
    max_tokens: int | None,
    batch_size: int,
    n_permutations: int,
    seed: int,
) -> Mechanism:
    """``rep.mechanism`` (its docstring): the model checked against the report by content (and ``roles``), then the
    token readout, the attended-token effect and both copying scores of the chosen heads, joined and tested."""
    from ..core.selection import head_labels, select_heads
    from ..probes.head_tokens import head_tokens
    from ..probes.roles import HeadRoles, copying_scores
    from ..probes.tied import embedding_tie, own_copying_scores
    from ..probes.token_effect import attended_token_effect
    from .mechanism import mechanism_join
    from .roles import RoleAssociation

    if roles is not None and not isinstance(roles, (HeadRoles, RoleAssociation)):
        raise OptionTypeError(
            f"roles must be a HeadRoles (tli.head_roles) or a RoleAssociation (rep.roles); got {type(roles).__name__}."
        )
    m = MECHANISM.model_of(rep, model)  # the one identity check: sizes, processing, every measured layer's weights
    hr = check_identity(rep, roles=roles) if roles is not None else None
    h = rep.heads
    measured = sorted(int(x) for x in h["layer"].unique())
    sel = select_heads(heads, measured, rep.info.n_heads, labels=True)
    pairs = [(a, b) for a, hs in sorted(sel.items()) for b in hs]
    labels = list(head_labels([a for a, _ in pairs], [b for _, b in pairs]))
    missing = [lab for lab in labels if lab not in h.index]
    if missing:
        raise OptionError(f"Heads {missing[:10]} are not heads this report measured.")
    tie = embedding_tie(m)
    d_vocab = int(getattr(m.cfg, "d_vocab", 0) or 0)
    if d_vocab and k > d_vocab:
        raise OptionError(f"k must be at most d_vocab = {d_vocab} (the token readout's top/bottom size); got {k}.")
    effect = attended_token_effect(  # first: the text is checked before the readout's cost
        m, heads=pairs, texts=texts, seq_len=seq_len, max_tokens=max_tokens, batch_size=batch_size, seed=seed
    )
    tokens = head_tokens(m, heads=pairs, n_tokens=n_tokens, k=k, seed=seed)
    copying, _, _ = copying_scores(m)
    own, _ = own_copying_scores(m)
    return mechanism_join(
        h.loc[labels], rep.threshold, tokens, effect, copying, own, tie, hr, n_permutations=n_permutations, seed=seed
    )


def _mechanism() -> type:
    from .mechanism import Mechanism

    return Mechanism


def _fits(rep: Any, mech: Any) -> Any:
    from .mechanism import check_mechanism_fits_report

    return check_mechanism_fits_report(rep.heads, rep.threshold, mech)


def _section(rep: Any, mech: Any) -> Any:
    from ..views.page import mechanism_section

    return mechanism_section(mech, rep.threshold)


def _record(mech: Any) -> dict[str, Any]:
    from .mechanism import mechanism_record

    return mechanism_record(mech)


def _columns(mech: Any) -> pd.DataFrame:
    from .mechanism import mechanism_columns

    return mechanism_columns(mech)


MECHANISM = JoinSpec(
    name="mechanism",
    call="rep.mechanism",
    result=_mechanism,
    run=run_mechanism,
    options=(
        count_option("n_tokens", 512, "the token readout's sample of source tokens", _check_n_tokens, needs_torch=True),
        count_option("k", 20, "the token readout's top/bottom size", int_option(1)),
        count_option("seq_len", 128, "the attended-token effect's window length", int_option(2, 1 << 24)),
        count_option(
            "max_tokens",
            2048,
            "the attended-token effect's token budget (None: no budget)",
            optional(int_option(1)),
            none=True,
        ),
        count_option("batch_size", 8, "the attended-token effect's windows per forward pass", int_option(1, 1 << 20)),
        count_option(
            "n_permutations",
            DEFAULT_N_PERMUTATIONS,
            f"permutations of the Spearman test (1 .. {MAX_RESAMPLES})",
            int_option(1, MAX_RESAMPLES),
        ),
        seed_option("the token sample's, the null sources' and the permutations' seed"),
    ),
    model="weights",
    why="the attended-token effect runs it on text",
    roles=True,
    fits=_fits,
    page=_section,
    record=_record,
    columns=_columns,
    cli=JoinFlag(
        "--mechanism",
        "also measure what the heads do to tokens (SPEC 12: the OV circuit's token readout, each head's direct "
        "effect on the token it attends to on the default corpus, the copying score with G = I) and whether sign(α) "
        "predicts that effect (rep.mechanism): a page section, the columns in --csv, the result in --json; seeded "
        "by --seed (needs a model TransformerLens can run: a zoo model or a hub name; minutes on a CPU)",
        compute=lambda rep, model, value, joined, args: rep.mechanism(
            model=model, roles=joined.get("roles"), seed=args.seed
        ),
        needs_model="--mechanism runs the model on text (the attended-token effect), and a checkpoint path is read "
        "as weights only (no model to run): use a zoo model or a hub name, or in Python "
        "rep.mechanism(model=TransformerBridge.boot_transformers(folder))",
        progress="tl-idempotence: measuring what the heads do to tokens (token readout, attended-token effect)...",
        text=lambda mech: str(mech.headline),
    ),
)
