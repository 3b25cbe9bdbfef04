"""The declarations of the two joins of head roles with a report (:mod:`.roles`): ``rep.roles`` (what the closed
heads do, SPEC 11) and ``rep.circuit`` (a circuit against the closed set). Torch- and pandas-free
(:mod:`.join_spec`); the bodies import what they run when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.kwargs import strict_kwargs, warn_at_caller
from ..core.lazy import Lazy
from ..errors import OptionError, OptionTypeError
from .join_defaults import DEFAULT_N_PERMUTATIONS, DEFAULT_N_SETS, EXPORT_ROLE_COLUMNS, MAX_RESAMPLES
from .join_spec import (
    JoinFlag,
    JoinSpec,
    check_identity,
    count_option,
    fits_heads,
    needs_model_text,
    page_at_threshold,
    resamples_option,
    seed_option,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .roles import Circuit, RoleAssociation

__all__ = [
    "CIRCUIT",
    "DEFAULT_N_PERMUTATIONS",
    "DEFAULT_N_SETS",
    "EXPORT_ROLE_COLUMNS",
    "MAX_RESAMPLES",
    "ROLES",
    "check_length",
]


def check_length(x: Any, name: str) -> int | None:
    """The head detector's ``repeat_len`` (the length of ``x`` in each ``BOS x x`` sequence; None: not given):
    an integer in 2 .. :data:`~tl_idempotence.probes.roles.MAX_REPEAT_LEN` (imports torch when called).

    Raises:
        OptionTypeError: not an integer. OptionError: out of range (names ``name``).
    """
    from ..core.options import check_int
    from ..probes.roles import MAX_REPEAT_LEN

    return None if x is None else check_int(x, name, 2, MAX_REPEAT_LEN)


def _check_sequences(x: Any, name: str) -> int | None:
    from ..core.options import check_int
    from ..probes.roles import MAX_SEQUENCES

    return None if x is None else check_int(x, name, 1, MAX_SEQUENCES)


_PERMUTATIONS = resamples_option("n_permutations", DEFAULT_N_PERMUTATIONS, "permutations of each Spearman test")
_SEED = seed_option("the seed of the head detector's tokens and of the permutations")


@strict_kwargs
def run_roles(
    rep: Any,
    model: Any = None,
    roles: Any = None,
    *,
    repeat_len: int | None,
    n_sequences: int | None,
    n_permutations: int,
    seed: int,
    n_tokens: Any = None,
    progress: Any = True,
) -> RoleAssociation:
    """``rep.roles`` (its docstring): the head roles given, or computed on the model once it is checked against the
    report by content, joined with the report's P, α and closed set. ``n_tokens``: the deprecated name of
    ``repeat_len`` (warns; its errors name it). ``progress``: the bars of ``head_roles`` and of the association
    on stderr (a bool; not a computation option: declared by the body, as the report's own ``progress``)."""
    from ..core.options import check_bool
    from ..probes.roles import HeadRoles, head_roles
    from .roles import role_association

    progress = check_bool(progress, "progress")
    length_name = "repeat_len"
    if n_tokens is not None:
        if repeat_len is not None:
            raise OptionError(
                "rep.roles takes repeat_len (the length of x in each BOS x x sequence); n_tokens is its deprecated "
                "name: give repeat_len only."
            )
        warn_at_caller(
            "rep.roles(n_tokens=...) is deprecated: use repeat_len=..., the length of x in each BOS x x sequence "
            "of the head detector (n_tokens is the token readout's sample of source tokens, rep.mechanism and "
            "tli.head_tokens).",
            DeprecationWarning,
        )
        repeat_len, length_name = check_length(n_tokens, "n_tokens"), "n_tokens"
    if roles is not None:
        if not isinstance(roles, HeadRoles):
            raise OptionTypeError(f"roles must be the HeadRoles of tli.head_roles(model); got {type(roles).__name__}.")
        made = roles.options
        ignored = [
            f"{name}={value!r} (the roles were made with {made.get(key)!r})"
            for name, key, value in ((length_name, "n_tokens", repeat_len), ("n_sequences", "n_sequences", n_sequences))
            if value is not None and value != made.get(key)
        ]
        if ignored:
            raise OptionError(
                f"rep.roles(roles=...) uses the head roles given; {', '.join(ignored)} would be ignored. Drop "
                "them, or pass model=... without roles= to compute the roles again."
            )
        if model is not None:  # it would be ignored: refused unless it is, by content, the roles' model
            check_identity(rep, model=model)
        check_identity(rep, roles=roles)
    else:
        m = ROLES.model_of(rep, model)  # before the model is run: the report's own model too (edited in place?)
        given = {k: v for k, v in (("repeat_len", repeat_len), ("n_sequences", n_sequences)) if v is not None}
        roles = head_roles(m, **given, seed=seed, progress=progress)  # the detector's defaults for what is not given
        check_identity(rep, roles=roles)  # the weights the scores were computed from (the same path)
    return role_association(
        rep.heads, roles, rep.threshold, n_permutations=n_permutations, seed=seed, progress=progress
    )


def _record(assoc: Any) -> dict[str, Any]:
    return {
        "headline": assoc.headline,
        "summary": assoc.summary,
        "association": [{"role": r, **row.to_dict()} for r, row in assoc.association.iterrows()],
    }


def _columns(assoc: Any) -> pd.DataFrame:
    return assoc.table[list(EXPORT_ROLE_COLUMNS)]


def _text(assoc: Any) -> str:
    """The association table of ``--roles`` as text (one row per role)."""
    import pandas as pd

    cols = ["n", "spearman_rho", "spearman_q", "median_closed", "median_other", "mannwhitney_q"]
    with pd.option_context("display.float_format", "{:.3g}".format, "display.width", 200):
        return (
            "head roles vs closure (Spearman ρ of P and the score, BH q across roles):\n"
            + assoc.association[cols].to_string()
        )


ROLES = JoinSpec(
    name="roles",
    result=Lazy("tl_idempotence.report.roles", "RoleAssociation").load,
    run=run_roles,
    options=(
        count_option(
            "repeat_len",
            None,
            "the length of x in each BOS x x sequence of the head detector (None: the detector's default, 24)",
            check_length,
            none=True,
            needs_torch=True,
        ),
        count_option(
            "n_sequences",
            None,
            "seeded sequences the attention roles average over (None: the detector's default, 8)",
            _check_sequences,
            none=True,
            needs_torch=True,
        ),
        _PERMUTATIONS,
        _SEED,
    ),
    model="weights",
    why="the head detector runs it on tokens",
    roles=True,
    fits=fits_heads(Lazy("tl_idempotence.report.roles", "check_roles_fit_report")),
    page=page_at_threshold(Lazy("tl_idempotence.views.page", "roles_section")),
    record=_record,
    columns=_columns,
    cli=JoinFlag(
        "--roles",
        "also compute head roles (TransformerLens's previous-token, duplicate-token and induction scores and the OV "
        "circuit's copying score) on the model and join them with the report: a page section, the role columns in "
        "--csv, the association table in --json; the tokens and permutations are seeded by --seed (needs a model "
        "TransformerLens can run: a zoo model or a hub name)",
        needs_model=needs_model_text("--roles", "runs TransformerLens's head detector on the model", "rep.roles"),
        # then the bars of head_roles and of the association (seconds on SmolLM2, minutes on a loaded machine)
        progress="tl-idempotence: computing head roles (head detector and copying score)...",
        text=_text,
    ),
)


@strict_kwargs
def run_circuit(rep: Any, heads: Any, roles: Any = None, *, n_sets: int, seed: int) -> Circuit:
    """``rep.circuit`` (its docstring): the circuit's heads parsed against the report's sizes and measured layers,
    ``roles`` checked by content, then the overlap with the closed set and its two p-values."""
    from .roles import circuit_overlap, parse_circuit

    pairs = parse_circuit(heads, rep.info.n_layers, rep.info.n_heads, rep.heads["layer"].unique().tolist())
    r = None if roles is None else check_identity(rep, roles=roles)
    return circuit_overlap(rep.heads, pairs, rep.threshold, roles=r, n_sets=n_sets, seed=seed)


CIRCUIT = JoinSpec(
    name="circuit",
    result=Lazy("tl_idempotence.report.roles", "Circuit").load,
    run=run_circuit,
    options=(
        resamples_option(
            "n_sets", DEFAULT_N_SETS, "random layer-matched sets of the permutation p-value", "; floor 1/(n_sets + 1)"
        ),
        seed_option("the random sets' seed"),
    ),
    roles=True,
)
