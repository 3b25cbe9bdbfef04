"""Closure beside what heads do (SPEC 11): a report's P, α and closed set joined with head roles, and a user's
circuit tested for overlap with the closed set.

* :func:`role_association` (``rep.roles(model=...)``): per role, the Spearman correlation of P and the score with
  a seeded permutation p-value (scipy's ``permutation_test``, pairings, two-sided), the medians of the score among
  closed and other heads, a two-sided Mann-Whitney p (scipy), and Benjamini-Hochberg q-values of both p-values
  across the roles. No role threshold enters the statistics. The signed ``copying`` score also gets ``|copying|``
  (a two-sided relation a signed correlation can hide) and the share of closed heads whose copying sign agrees
  with the sign of their α.
* :func:`circuit_overlap` (``rep.circuit(heads)``): the overlap of a circuit with the closed set, its
  hypergeometric tail among the measured heads (scipy's ``hypergeom.sf``) and a layer-matched permutation p
  (random sets with the circuit's number of heads in each of its layers, seeded; floor ``1/(n_sets + 1)``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..analyses.scramble import bh_q_values
from ..core.frozen import frozen, thawed
from ..core.heads import ModelInfo
from ..core.options import check_bool, check_int, check_seed, strict_kwargs
from ..core.outputs import check_save_target
from ..core.progress import progress_bar
from ..core.readings import circuit_headline, roles_headline
from ..core.records import index_column, json_like, read_tables_record, same_value, write_tables_record
from ..core.selection import head_label, head_labels
from ..core.stats import spearman_permutation
from ..core.store import saved_folder
from ..core.stored import StoredResult, StoreSpec
from ..core.tables import FrozenResult, FrozenSummary, ImmutableResult
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..probes.roles import (
    ASSOCIATION_FORMAT,
    HEAD_ROLES_FORMAT,
    ROLE_TABLE_COLUMNS,
    ROLES,
    ROLES_FLOAT_KEYS,
    ROLES_HINT,
    ROLES_RECORD,
    ROLES_REPLACES,
    HeadRoles,
    head_roles_fields,
    restore_head_roles,
)
from ..views.results import DrawnResult
from .join_defaults import DEFAULT_N_PERMUTATIONS, DEFAULT_N_SETS, MAX_RESAMPLES

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = [
    "DEFAULT_N_PERMUTATIONS",
    "DEFAULT_N_SETS",
    "Circuit",
    "RoleAssociation",
    "RoleAssociationSummary",
    "check_roles_fit_report",
    "circuit_overlap",
    "json_like",
    "load_roles",
    "parse_circuit",
    "role_association",
    "save_roles",
]

#: numpy SeedSequence tags of the two random streams (never shared with the torch streams of core.random).
_TAG_ASSOCIATION, _TAG_CIRCUIT = 6, 5


def _rng(seed: int, tag: int, *extra: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, tag, *extra]))


class RoleAssociationSummary(FrozenSummary):
    """The summary of :class:`RoleAssociation` (typed, read-only; a mapping of the fields given; a field not given
    reads as None): ``roles`` is the joined :class:`~tl_idempotence.probes.roles.HeadRoles`' summary."""

    __slots__ = ()
    model_name: str | None
    n_heads: int | None
    n_closed: int | None
    threshold: float | None
    n_permutations: int | None
    seed: int | None
    p_floor: float | None
    roles: Mapping[str, Any] | None


class RoleAssociation(
    StoredResult,
    FrozenResult,
    DrawnResult,
    repr_keys="model_name n_heads n_closed n_permutations seed",
    frozen=("a role association is", "rep.roles(...) again"),
    summary_type=RoleAssociationSummary,
):
    """Result of ``rep.roles(model=...)``. Immutable, like the report: :attr:`table` and :attr:`association` are
    copies made on each read (editing one leaves the result, and what :meth:`save` writes, as it is),
    :attr:`summary` is a typed read-only :class:`RoleAssociationSummary`, and assigning an attribute raises
    ``dataclasses.FrozenInstanceError``.

    Attributes:
        table: the roles' table (:class:`~tl_idempotence.probes.roles.HeadRoles`) of the report's heads, with the
            report's ``P``, ``alpha``, ``closed``; indexed by ``"L10H8"`` labels.
        association: one row per role (``previous_token, duplicate_token, induction, copying, |copying|``):
            ``n`` (heads with a defined P and score), ``spearman_rho``, ``spearman_p`` (permutation, two-sided),
            ``spearman_q``, ``n_closed``, ``median_closed``, ``median_other``, ``mannwhitney_p`` (two-sided),
            ``mannwhitney_q`` (BH across the roles), ``frac_sign_agrees_alpha`` (``copying`` only: closed heads
            whose sign(copying) = sign(α)), ``note`` (why a value is NaN).
        summary: ``model_name, n_heads, n_closed, threshold, n_permutations, seed, p_floor`` (the smallest two-sided
            permutation p: ``2/(n_permutations + 1)``) and the roles' summary.
        roles: the :class:`~tl_idempotence.probes.roles.HeadRoles` joined.
        loaded_from: the folder :func:`load_roles` read it from (:func:`save_roles` refuses to write there).
    """

    store: ClassVar[StoreSpec] = StoreSpec(  # saved as head roles are, in their record file (load_roles reads both)
        name="role_association",
        record=HeadRoles.store.record,
        formats=(ASSOCIATION_FORMAT,),
        free_fields=HeadRoles.store.free_fields,
    )

    settable: ClassVar[frozenset[str]] = HeadRoles.settable  # loaded_from, set once by load_roles

    _association: pd.DataFrame
    summary: RoleAssociationSummary
    roles: HeadRoles | None

    def __init__(
        self,
        table: pd.DataFrame,
        association: pd.DataFrame,
        summary: Mapping[str, Any],
        roles: HeadRoles | None = None,
        loaded_from: str | None = None,
    ) -> None:
        # _association is never handed out: the property gives copies
        self._freeze_result(table, summary, loaded_from, _association=association.copy(), roles=roles)

    @property
    def association(self) -> pd.DataFrame:
        """One row per role (class docstring): a copy, made on each read."""
        return self._association.copy()

    @property
    def headline(self) -> str:
        """The first sentence (what was asked, the answer, the number): the role that best separates the closed heads
        from the others (smallest Mann-Whitney q) and the closed heads' copying by sign, with sign(copying) =
        sign(α) (:func:`~tl_idempotence.core.readings.roles_headline`; never a signed median of a mixed set)."""
        return roles_headline(self.table, self.association, self.summary)

    @strict_kwargs
    def figure(self) -> Any:
        """Plotly figure: each role's score against P, one panel per role, closed heads marked
        (:func:`tl_idempotence.views.figures.roles_figure`)."""
        from ..views import roles_figure

        return roles_figure(self)

    @classmethod
    def load(cls, path: PathLike) -> RoleAssociation:
        """:func:`load_roles` of a folder :meth:`save` wrote (refused: a head-roles save, which
        :meth:`HeadRoles.load` reads).

        Raises:
            MissingFileError: no such folder, or a file its record lists is missing (names it).
            ReportFileError: another format (a head-roles save: read it with tli.load_roles), an edited or foreign
                file, or a field that is not what the saved tables give (names the file and the field).
        """
        got = load_roles(path)
        if not isinstance(got, RoleAssociation):
            raise ReportFileError(f"{path} holds head roles, not a role association: read it with tli.load_roles.")
        return got

    @strict_kwargs
    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Save as a folder of parquet tables and one JSON record with their sha256s (no pickle, like
        ``rep.save``); :func:`load_roles` reads it back and refuses an edited file by name. See :func:`save_roles`."""
        return _save_association(self, path, overwrite)


def role_association(
    heads: pd.DataFrame,
    roles: HeadRoles,
    threshold: float,
    n_permutations: Any = DEFAULT_N_PERMUTATIONS,
    seed: Any = 0,
    *,
    progress: bool = False,
) -> RoleAssociation:
    """Join a report's heads with head roles and test each role's association with closure (module docstring).

    Args:
        heads: the report's ``heads`` (``layer, head, P, alpha, closed``, indexed by labels).
        roles: :func:`~tl_idempotence.probes.roles.head_roles` of the same model.
        threshold: the report's P threshold (stated in the summary).
        n_permutations: permutations of each Spearman test (1 .. MAX_RESAMPLES).
        seed: the permutations' seed (each role its own stream).
        progress: a tqdm bar on stderr over the roles' tests (``rep.roles(progress=True)``; a load recomputes
            the association without one).

    Returns:
        :class:`RoleAssociation`.

    Raises:
        OptionTypeError: ``roles`` is not a HeadRoles; a bad count or seed type. OptionError: a count or seed out
            of range; the roles miss heads the report measured (another model: names them) or a role score
            column (a HeadRoles made by hand: names them).
    """
    if not isinstance(roles, HeadRoles):
        raise OptionTypeError(f"roles must be the HeadRoles of tli.head_roles(model); got {type(roles).__name__}.")
    n_perm = check_int(n_permutations, "n_permutations", 1, MAX_RESAMPLES)
    seed = check_seed(seed)
    progress = check_bool(progress, "progress")
    role_table = roles.table  # a copy: taken once
    absent = [c for c in ("layer", "head", "kv_head", *ROLES) if c not in role_table.columns]
    if absent:  # a HeadRoles made by hand without every score: named, not a KeyError from pandas
        raise OptionError(
            f"The head roles' table has no column(s) {absent}: a HeadRoles holds every role score "
            f"({', '.join(ROLES)}); compute them with tli.head_roles(model)."
        )
    have = set(role_table.index)
    missing = [lab for lab in heads.index if lab not in have]
    if missing:
        raise OptionError(
            f"The head roles lack {len(missing)} head(s) the report measured ({missing[:5]}): they are not of the "
            "report's model."
        )
    rt = role_table.loc[list(heads.index)]
    table = rt.join(heads[["P", "alpha", "closed"]])
    P = table["P"].to_numpy(dtype=float)
    alpha = table["alpha"].to_numpy(dtype=float)
    closed = table["closed"].to_numpy(dtype=bool)
    rows = []
    names = [*ROLES, "|copying|"]
    desc = f"association with closure ({len(names)} roles x {n_perm} permutations; ~0.3 CPU-s/role on SmolLM2)"
    for i, role in enumerate(progress_bar(names, desc=desc, unit="role", enabled=progress)):
        s = np.abs(table["copying"].to_numpy(dtype=float)) if role == "|copying|" else table[role].to_numpy(dtype=float)
        ok = np.isfinite(P) & np.isfinite(s)
        notes = []
        rho, p_rho = spearman_permutation(P[ok], s[ok], n_perm, _rng(seed, _TAG_ASSOCIATION, i))
        if not np.isfinite(rho):
            notes.append("Spearman undefined (fewer than 3 heads or a constant P/score)")
        c, o = s[ok & closed], s[ok & ~closed]
        if len(c) and len(o):
            from scipy.stats import mannwhitneyu

            p_mw = float(mannwhitneyu(c, o, alternative="two-sided").pvalue)
        else:
            p_mw = float("nan")
            notes.append(
                "Mann-Whitney undefined: no closed head" if not len(c) else "Mann-Whitney undefined: no other head"
            )
        agree = float("nan")
        if role == "copying":
            cc = ok & closed & (alpha != 0) & (s != 0)
            agree = float((np.sign(s[cc]) == np.sign(alpha[cc])).mean()) if cc.any() else float("nan")
            if not cc.any():
                notes.append("no closed head with a signed copying score and α")
        rows.append(
            {
                "role": role,
                "n": int(ok.sum()),
                "spearman_rho": rho,
                "spearman_p": p_rho,
                "n_closed": int((ok & closed).sum()),
                "median_closed": float(np.median(c)) if len(c) else float("nan"),
                "median_other": float(np.median(o)) if len(o) else float("nan"),
                "mannwhitney_p": p_mw,
                "frac_sign_agrees_alpha": agree,
                "note": "; ".join(notes),
            }
        )
    assoc = pd.DataFrame(rows).set_index("role")
    assoc.insert(assoc.columns.get_loc("spearman_p") + 1, "spearman_q", bh_q_values(assoc["spearman_p"]))
    assoc.insert(assoc.columns.get_loc("mannwhitney_p") + 1, "mannwhitney_q", bh_q_values(assoc["mannwhitney_p"]))
    summary = {
        "model_name": roles.summary.get("model_name"),
        "n_heads": len(table),
        "n_closed": int(closed.sum()),
        "threshold": float(threshold),
        "n_permutations": n_perm,
        "seed": seed,
        "p_floor": min(1.0, 2 / (n_perm + 1)),  # two-sided: twice the one-sided floor (scipy's permutation_test)
        "roles": thawed(roles.summary),
    }
    return RoleAssociation(table=table, association=assoc, summary=summary, roles=roles)


_HOOK = re.compile(r"blocks\.(\d+)\.attn\.hook_(z|q|result|pattern|attn_scores)")
_LABEL = re.compile(r"L(\d+)H(\d+)")


def parse_circuit(heads: Any, n_layers: int, n_heads: int, measured: Iterable[int]) -> list[tuple[int, int]]:
    """A circuit as ``(layer, head)`` pairs from ``[(layer, head)]``, ``"L10H8"`` labels, rows of ``rep.heads`` (a
    DataFrame with ``layer``/``head`` columns), or ``rep.hook_points``
    output (:class:`~tl_idempotence.report.report.HookPoint`: its ``query_heads``; a plain ``(hook name, head)``
    pair of a query-head hook, ``blocks.10.attn.hook_z``).

    Raises:
        OptionTypeError: not an iterable of such items (names the item).
        OptionError: empty; a head the model does not have, a duplicate, a head outside the measured layers (each
            names the heads).
    """
    if isinstance(heads, pd.DataFrame):  # rows of rep.heads (rep.closed_heads, a filter of it)
        if not {"layer", "head"} <= set(heads.columns):
            raise OptionTypeError(f"A heads DataFrame needs 'layer' and 'head' columns; got {list(heads.columns)}.")
        heads = list(zip(heads["layer"], heads["head"]))
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise OptionTypeError(
            f"heads must be a list of (layer, head) pairs, 'L10H8' labels or hook points; got {type(heads).__name__}."
        )
    pairs: list[tuple[int, int]] = []
    for item in heads:
        qh = getattr(item, "query_heads", None)
        if qh is not None and hasattr(item, "layer"):  # a HookPoint
            pairs.extend((int(item.layer), int(h)) for h in qh)
            continue
        if isinstance(item, str):
            m = _LABEL.fullmatch(item)
            if not m:
                raise OptionTypeError(f"{item!r} is not a head label like 'L10H8'.")
            pairs.append((int(m[1]), int(m[2])))
            continue
        if isinstance(item, (tuple, list)) and len(item) == 2:
            a, b = item
            if isinstance(a, str):
                m = _HOOK.fullmatch(a)
                if not m:
                    raise OptionTypeError(
                        f"{item!r}: {a!r} is not a query-head hook (blocks.L.attn.hook_z/q/result/pattern/attn_scores);"
                        " for hook_k/hook_v pass rep.hook_points(...) output, which says the query heads it serves."
                    )
                pairs.append((int(m[1]), check_int(b, "head", 0)))
            else:
                pairs.append((check_int(a, "layer", 0), check_int(b, "head", 0)))
            continue
        raise OptionTypeError(f"A circuit head must be (layer, head), 'L10H8' or a hook point; got {item!r:.60}.")
    if not pairs:
        raise OptionError("The circuit has no heads.")
    bad = [head_label(a, b) for a, b in pairs if not (a < n_layers and b < n_heads)]
    if bad:
        raise OptionError(f"Heads {bad[:10]} do not exist (the model has {n_layers} layers of {n_heads} heads).")
    seen: set[tuple[int, int]] = set()
    dup = [head_label(*p) for p in pairs if p in seen or seen.add(p)]  # type: ignore[func-returns-value]
    if dup:
        raise OptionError(f"Heads {sorted(set(dup))[:10]} are listed more than once in the circuit.")
    ms = set(measured)
    out = [head_label(a, b) for a, b in pairs if a not in ms]
    if out:
        raise OptionError(f"Heads {out[:10]} are outside the report's measured layers {sorted(ms)[:12]}.")
    return pairs


class Circuit(
    ImmutableResult,
    DrawnResult,
    repr_keys="n_heads n_overlap n_closed p_hypergeom p_layer_matched",
    frozen=("a circuit result is", "rep.circuit(...) again"),
):
    """Result of ``rep.circuit(heads)``. Immutable, like the report: :attr:`heads` is a copy made on each read,
    :attr:`summary` is read-only and :attr:`set_overlaps` a read-only array.

    Attributes:
        heads: one row per circuit head (labels): ``layer, head, P, alpha, closed`` (and the role scores when
            roles were given).
        summary: ``n_heads`` (circuit), ``n_overlap`` (closed circuit heads), ``n_measured``, ``n_closed``,
            ``p_hypergeom`` (``P[X >= n_overlap]``, X hypergeometric over the measured heads), ``p_layer_matched``
            (``(1 + #{sets with overlap >= n_overlap}) / (n_sets + 1)``), ``p_layer_matched_floor``, ``n_sets``,
            ``seed``, ``layers`` ({layer: circuit heads in it}), ``threshold``.
        set_overlaps: ``[n_sets]`` int64, the overlap of each random layer-matched set.
    """

    _heads: pd.DataFrame
    summary: Mapping[str, Any]
    set_overlaps: np.ndarray

    def __init__(self, heads: pd.DataFrame, summary: Mapping[str, Any], set_overlaps: np.ndarray | None = None):
        set_ = functools.partial(object.__setattr__, self)
        set_("_heads", heads.copy())
        set_("summary", frozen(dict(summary)))
        overlaps = np.array(np.zeros(0, dtype=np.int64) if set_overlaps is None else set_overlaps, copy=True)
        overlaps.flags.writeable = False
        set_("set_overlaps", overlaps)

    @property
    def heads(self) -> pd.DataFrame:
        """One row per circuit head (class docstring): a copy, made on each read."""
        return self._heads.copy()

    @property
    def headline(self) -> str:
        """The first sentence: the circuit's overlap with the closed set, what chance gives (the hypergeometric
        expectation), the enrichment (hypergeometric) p and the layer-matched p with its floor
        (:func:`~tl_idempotence.core.readings.circuit_headline`)."""
        return circuit_headline(self.summary)

    @property
    def n_overlap(self) -> int:
        """Circuit heads that are closed."""
        return int(self.summary["n_overlap"])

    @property
    def p_hypergeom(self) -> float:
        """scipy's hypergeometric tail ``P[X >= n_overlap]`` over the measured heads."""
        return float(self.summary["p_hypergeom"])

    @property
    def p_layer_matched(self) -> float:
        """The layer-matched permutation p-value (floor ``p_layer_matched_floor``)."""
        return float(self.summary["p_layer_matched"])


def circuit_overlap(
    rep_heads: pd.DataFrame,
    pairs: list[tuple[int, int]],
    threshold: float,
    roles: HeadRoles | None = None,
    n_sets: Any = DEFAULT_N_SETS,
    seed: Any = 0,
) -> Circuit:
    """The circuit's overlap with the closed set and its two p-values (module docstring).

    Args:
        rep_heads: the report's ``heads``; pairs: :func:`parse_circuit` output; threshold: the report's.
        roles: add these role scores to the circuit's rows (optional).
        n_sets: random layer-matched sets (1 .. MAX_RESAMPLES); seed: their seed.

    Raises:
        OptionTypeError / OptionError: bad ``n_sets``, ``seed`` or ``roles``.
    """
    from scipy.stats import hypergeom

    n_sets = check_int(n_sets, "n_sets", 1, MAX_RESAMPLES)
    seed = check_seed(seed)
    if roles is not None and not isinstance(roles, HeadRoles):
        raise OptionTypeError(f"roles must be a HeadRoles (tli.head_roles); got {type(roles).__name__}.")
    labels = [head_label(a, b) for a, b in pairs]
    cols = ["layer", "head", "P", "alpha", "closed"]
    heads = rep_heads.loc[labels, cols].copy()
    if roles is not None:
        role_table = roles.table
        heads = heads.join(role_table[[r for r in ROLES if r in role_table.columns]])
    closed = rep_heads["closed"].to_numpy(dtype=bool)
    N, K, n = len(rep_heads), int(closed.sum()), len(pairs)
    k = int(heads["closed"].to_numpy(dtype=bool).sum())
    p_h = float(hypergeom.sf(k - 1, N, K, n))
    rng = _rng(seed, _TAG_CIRCUIT)
    per_layer = pd.Series([a for a, _ in pairs]).value_counts().sort_index()
    overlaps = np.zeros(n_sets, dtype=np.int64)
    L = rep_heads["layer"].to_numpy()
    for layer, cnt in per_layer.items():
        c_layer = closed[L == layer]  # the layer's heads, closed or not
        draws = rng.random((n_sets, len(c_layer))).argsort(1)[:, : int(cnt)]  # sets without replacement
        overlaps += c_layer[draws].sum(1)
    p_lm = float((1 + int((overlaps >= k).sum())) / (n_sets + 1))
    summary = {
        "n_heads": n,
        "n_overlap": k,
        "n_measured": N,
        "n_closed": K,
        "threshold": float(threshold),
        "p_hypergeom": p_h,
        "p_layer_matched": p_lm,
        "p_layer_matched_floor": 1 / (n_sets + 1),
        "n_sets": n_sets,
        "seed": seed,
        "layers": {int(a): int(b) for a, b in per_layer.items()},
    }
    return Circuit(heads=heads, summary=summary, set_overlaps=overlaps)


# ----------------------------------------------------------------------------- the roles beside a report's page


def check_roles_fit_report(rep_heads: pd.DataFrame, threshold: float, assoc: Any) -> RoleAssociation:
    """``assoc`` as the roles of the report whose heads are ``rep_heads`` (the page's roles section), or an error.

    Raises:
        OptionTypeError: ``assoc`` is not a :class:`RoleAssociation` (``rep.roles(...)``).
        OptionError: its heads, P or threshold are not the report's (another report or model; names the heads).
    """
    if not isinstance(assoc, RoleAssociation):
        raise OptionTypeError(f"roles must be the RoleAssociation of rep.roles(model=...); got {type(assoc).__name__}.")
    assoc_table = assoc.table  # a copy: taken once
    want, got = list(rep_heads.index), list(assoc_table.index)
    if want != got:
        extra = [x for x in got if x not in set(want)][:5]
        lack = [x for x in want if x not in set(got)][:5]
        raise OptionError(
            f"These roles are not of this report's heads (the report lacks {extra}, the roles lack {lack}): join them "
            "with this report, rep.roles(model=...)."
        )
    a = rep_heads["P"].to_numpy(dtype=float)
    b = assoc_table["P"].to_numpy(dtype=float)
    differ = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    if differ.any() or float(assoc.summary.get("threshold", math.nan)) != float(threshold):
        bad = [lab for lab, d in zip(want, differ) if d][:5]
        raise OptionError(
            f"These roles were joined with another report (P differs at {bad} or threshold "
            f"{assoc.summary.get('threshold')} != {threshold:g}): join them with this report, rep.roles(model=...)."
        )
    return assoc


# ----------------------------------------------------------------------------- save and load (no pickle)

#: The report columns a role association's table adds.
JOIN_COLUMNS = ("P", "alpha", "closed")


def _info_fields(info: ModelInfo) -> dict[str, Any]:
    return {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}


@strict_kwargs
def save_roles(result: HeadRoles | RoleAssociation, path: PathLike, overwrite: bool = False) -> str:
    """Save head roles (``tli.head_roles``) or their join with a report (``rep.roles``) to the folder ``path``, the
    way a report is saved (:func:`~tl_idempotence.core.records.write_tables_record`: parquet tables, one JSON
    record ``roles.json`` with their sha256s and its own digest; no pickle).

    Layout: ``roles.parquet`` (the :attr:`HeadRoles.table` columns, labels rebuilt from layer/head on load) and,
    for a :class:`RoleAssociation`, ``table.parquet`` (roles + ``P``, ``alpha``, ``closed``) and
    ``association.parquet`` (one row per role).

    Returns:
        The folder, as a string.

    Raises:
        OptionTypeError: ``result`` is neither; ``path`` not a path; ``overwrite`` not a bool.
        OutputOverInputError (an ``OptionError``): ``path`` is the folder ``result`` was loaded from
            (:func:`load_roles`), or a file in it.
        OptionError: as :func:`~tl_idempotence.core.records.write_tables_record` (non-empty folder, missing parent,
            an edited earlier record; names it); ``path`` ends in a file extension (``.html``, ``.json``, ``.csv``,
            ``.parquet``): a roles save is a folder (a page: ``rep.save_html(path, roles=...)``; a table or JSON:
            ``rep.export``).
    """
    if isinstance(result, (RoleAssociation, HeadRoles)):
        return result.save(path, overwrite=overwrite)
    raise OptionTypeError(
        f"save_roles saves a HeadRoles (tli.head_roles) or a RoleAssociation (rep.roles); got {type(result).__name__}."
    )


def _save_association(result: RoleAssociation, path: PathLike, overwrite: bool) -> str:
    """:meth:`RoleAssociation.save` (its :func:`save_roles` layout), THE store: one folder put in place in one step.

    Raises:
        as :func:`save_roles`; OptionError: a RoleAssociation without its HeadRoles.
    """
    check_save_target(path, "save_roles", "roles", result.loaded_from, ROLES_HINT)
    if result.roles is None:
        raise OptionError("This RoleAssociation carries no HeadRoles (it was not made by rep.roles); cannot save.")
    roles = result.roles
    tables = {
        "roles": roles.table.loc[:, list(ROLE_TABLE_COLUMNS)],
        "table": result.table.loc[:, [*ROLE_TABLE_COLUMNS, *JOIN_COLUMNS]],
        "association": result.association.reset_index(),
    }
    fields = {**head_roles_fields(roles), "association_summary": result.summary}
    d = write_tables_record(path, ASSOCIATION_FORMAT, ROLES_RECORD, tables, fields, overwrite, replaces=ROLES_REPLACES)
    return str(d)


def load_roles(path: PathLike) -> HeadRoles | RoleAssociation:
    """Read back what :func:`save_roles` wrote: a :class:`HeadRoles`, or a :class:`RoleAssociation` (whose
    association is recomputed from its table and must equal the saved one).

    Raises:
        MissingFileError: no such folder, no ``roles.json``, a listed table missing.
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a table whose
            columns, heads, summary medians, ``closed`` (vs P >= threshold) or association are not what the rest of
            the record gives (the edit had its digests recomputed; names the file and the field).
        OptionTypeError: ``path`` is not a path.
    """
    fields, tables = read_tables_record(path, ROLES_RECORD, (HEAD_ROLES_FORMAT, ASSOCIATION_FORMAT), ROLES_FLOAT_KEYS)
    d = saved_folder(Path(path).expanduser(), ROLES_RECORD)  # an overwrite stopped between its two renames
    want = {"roles"} if fields["format"] == HEAD_ROLES_FORMAT else {"roles", "table", "association"}
    if set(tables) != want:
        raise ReportFileError(
            f"{d / ROLES_RECORD} lists tables {sorted(tables)}; a {fields['format']} has {sorted(want)}."
        )
    roles = restore_head_roles(d, tables["roles"], fields)
    roles.loaded_from = str(d)  # save_roles refuses to write over the folder it was read from
    if fields["format"] == HEAD_ROLES_FORMAT:
        return roles
    table, assoc = tables["table"], tables["association"]
    f = d / "table.parquet"
    if tuple(table.columns) != (*ROLE_TABLE_COLUMNS, *JOIN_COLUMNS):
        raise ReportFileError(f"{f} has columns {list(table.columns)}, not a role association's table.")
    table.index = head_labels(index_column(table, "layer", f), index_column(table, "head", f))
    role_table = roles.table  # a copy: taken once
    lacks = [x for x in table.index if x not in set(role_table.index)]
    same_roles = not lacks and all(
        same_value(table[c].tolist(), role_table.loc[table.index, c].tolist()) for c in ROLE_TABLE_COLUMNS
    )
    if not same_roles:
        raise ReportFileError(f"{f}: its role columns are not those of {d / 'roles.parquet'}: a table was edited.")
    s = fields.get("association_summary")
    if not isinstance(s, dict):
        raise ReportFileError(f"{d / ROLES_RECORD} has no association summary.")
    try:
        threshold, n_perm, seed = float(s["threshold"]), int(s["n_permutations"]), int(s["seed"])
    except (KeyError, TypeError, ValueError) as e:
        raise ReportFileError(f"{d / ROLES_RECORD}: a malformed association summary ({type(e).__name__}: {e}).") from e
    if not 0.0 <= threshold <= 1.0:
        raise ReportFileError(
            f"{d / ROLES_RECORD}: the association's threshold {threshold!r} is not in [0, 1]: edited."
        )
    closed = table["closed"].to_numpy(dtype=bool)
    if not (closed == (table["P"].to_numpy(dtype=float) >= threshold)).all():
        raise ReportFileError(f"{f}: 'closed' disagrees with P >= threshold ({threshold:g}): a table was edited.")
    fresh = role_association(table[["layer", "head", *JOIN_COLUMNS]], roles, threshold, n_perm, seed)
    stored = assoc.set_index("role") if "role" in assoc.columns else assoc
    ok = list(stored.columns) == list(fresh.association.columns) and list(stored.index) == list(fresh.association.index)
    for col in fresh.association.columns if ok else []:
        if not same_value(stored[col].tolist(), fresh.association[col].tolist()):
            raise ReportFileError(
                f"{d / 'association.parquet'}: column {col!r} is not what {f} gives (recomputed): a table was edited."
            )
    if not ok:
        raise ReportFileError(f"{d / 'association.parquet'} is not a role association table (columns or roles differ).")
    if not same_value(json_like(s), json_like(fresh.summary)):
        raise ReportFileError(
            f"{d / ROLES_RECORD}: the association summary is not what its tables give: it was edited."
        )
    fresh.loaded_from = str(d)
    return fresh
