"""A causal test of closure joined to the report (``rep.causal``, SPEC 13; docs/definitions.md §13): the closed heads
and their matched controls edited (:func:`~tl_idempotence.probes.causal.causal_closure`), and closed against controls
compared per variant.

**Controls** (:func:`~tl_idempotence.core.matching.match_controls`): for each closed head the ``n_controls``
non-closed heads of the same layer nearest in size (``match_by="abs_alpha"``: ``|α|``; ``"norm"``: ``‖T‖_F``), from
the report's own α, ‖T‖ and closed flags (the ``candidates`` table: every head of the closed heads' layers).

**Per head** (:attr:`CausalTest.table`): the probe's medians over positions, per variant ``v``: ``total_{v}`` (the
attended token's final-logit change), ``abs_total_{v}`` (its absolute value: how far the edit moves the token, either
way), ``direct_{v}``, ``self_repair_{v}`` (= direct - total), ``loss_{v}`` (mean next-token loss change, nats),
``p_{v}``, ``q_{v}`` (sign test of the total change over positions, BH q), ``rel_change_{v}``, ``reason_{v}``.

**Closed against controls** (:attr:`CausalTest.comparison`, :func:`~tl_idempotence.core.matching.matched_difference`):
for each variant and quantity (:data:`QUANTITIES`), the mean over the closed heads minus the mean over their controls
of the per-head value, with a two-sided p from relabelling closed and control **within each layer** (exact when the
relabellings number at most 100,000, else ``n_permutations`` seeded draws), the p floor the method can reach, and the
heads in each group. A head whose value is NaN (its variant refused) leaves the pool (a note).

Saved with the probe's own save as a part (``causal_closure/``); :func:`load_causal_test` recomputes the matching
from the candidates, the per-head values from the probe (whose loader recomputes them from the positions) and the
comparisons from the per-head table and the seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pandas as pd

from ..core.frozen import thawed
from ..core.matching import Matching, match_controls, matched_difference
from ..core.outputs import check_save_target
from ..core.records import (
    index_column,
    json_like,
    read_summary_record,
    same_value,
    write_summary_record,
)
from ..core.selection import head_labels
from ..core.stored import StoredResult, StoreSpec, loads, saves
from ..core.tables import FrozenResult, FrozenSummary
from ..errors import OptionError, OptionTypeError, ReportFileError
from ..probes.causal import CAUSAL_FORMAT as PROBE_FORMAT
from ..probes.causal import CAUSAL_RECORD as PROBE_RECORD
from ..probes.causal import CausalClosure, closure_tables, load_causal_closure
from ..probes.token_records import probe_fields
from ..views.results import DrawnResult

if TYPE_CHECKING:  # pragma: no cover
    from ..core.hints import PathLike

__all__ = [
    "COMPARISON_COLUMNS",
    "QUANTITIES",
    "CausalTest",
    "CausalTestSummary",
    "causal_columns",
    "causal_join",
    "causal_record",
    "check_causal_fits_report",
    "load_causal_test",
    "save_causal_test",
]

#: Why the permutations' count and seed are free fields of a save.
_ONLY_DRAWN = (
    "used only where the relabellings exceed 100,000 (the comparison records the method and count used, recomputed "
    "on load)"
)
#: The record fields of its save that nothing derives or restates, with why (:attr:`StoreSpec.free_fields`).
CAUSAL_TEST_FREE_FIELDS = (
    ("summary.n_permutations", _ONLY_DRAWN),
    ("summary.seed", _ONLY_DRAWN),
)
#: How a causal test is stored (:class:`~tl_idempotence.core.stored.StoreSpec`).
CAUSAL_TEST_STORE = StoreSpec(name="causal_test", formats=("tli-causal-test-1",), free_fields=CAUSAL_TEST_FREE_FIELDS)
CAUSAL_TEST_FORMAT = CAUSAL_TEST_STORE.format
CAUSAL_TEST_RECORD = CAUSAL_TEST_STORE.record
#: The quantities compared, closed against controls (per-head column ``{quantity}_{variant}``), and what each is.
QUANTITIES = {
    "abs_total": "|median total change| of the attended token's final logit (logit units)",
    "total": "median total change of the attended token's final logit (signed, logit units)",
    "self_repair": "median self-repair = direct - total (logit units)",
    "loss": "mean next-token loss change (nats)",
}
COMPARISON_COLUMNS = (
    "variant", "quantity", "statistic", "closed", "controls", "difference", "p_value", "q_value", "method",
    "n_relabelings", "p_floor", "n_closed", "n_controls", "notes",
)  # fmt: skip
CANDIDATE_COLUMNS = ("layer", "head", "closed", "alpha", "norm", "P")
#: The per-head columns taken from the probe's per-variant ones (``{column}_{variant}``), in order.
PER_VARIANT = ("total", "abs_total", "direct", "self_repair", "loss", "p", "q", "rel_change", "reason")
#: The group statistic of the comparison (over heads).
STATISTIC = "mean"
#: The relabellings enumerated exactly (more: ``n_permutations`` seeded draws).
MAX_EXACT = 100_000
#: The level the headline reads p at.
LEVEL = 0.05


class CausalTestSummary(FrozenSummary):
    """The summary of :class:`CausalTest` (typed, read-only)."""

    __slots__ = ()
    model_name: str
    threshold: float
    n_closed: int
    n_matched: int
    n_control_heads: int
    n_controls: int
    match_by: str
    variants: list[str]
    statistic: str
    n_permutations: int
    seed: int
    n_positions: int
    notes: list[str]
    headline: str


class CausalTest(
    StoredResult,
    FrozenResult,
    DrawnResult,
    repr_keys="model_name n_closed n_matched n_control_heads variants",
    display_kind="causal",
    frozen=("a causal test is", "rep.causal again"),
    summary_type=CausalTestSummary,
):
    """Result of ``rep.causal(...)`` (module docstring). Immutable: frames are copies made on each read, the summary is
    read-only, assigning an attribute raises ``dataclasses.FrozenInstanceError``.

    Attributes:
        table: one row per head run, indexed by ``"L10H8"``: ``layer, head, kv_head, group`` (``"closed"`` or
            ``"control"``), ``matched_with`` (its controls, or the closed heads it controls, comma-separated),
            ``P, alpha, norm, closed`` (the report's), ``n_positions`` and per variant :data:`PER_VARIANT`.
        pairs: the matching (:data:`~tl_idempotence.core.matching.PAIR_COLUMNS`: one row per closed head and control).
        comparison: one row per (variant, quantity): :data:`COMPARISON_COLUMNS`.
        candidates: every head of the closed heads' layers (``layer, head, closed, alpha, norm, P``): what the
            controls were chosen from.
        summary: :class:`CausalTestSummary`. headline: what holds and what does not, with sizes and floors.
        probe: the :class:`~tl_idempotence.probes.causal.CausalClosure` run (its positions and changes).
        loaded_from: the folder :func:`load_causal_test` read it from, else None.
    """

    store: ClassVar[StoreSpec] = CAUSAL_TEST_STORE

    pairs: pd.DataFrame
    comparison: pd.DataFrame
    candidates: pd.DataFrame
    summary: CausalTestSummary
    probe: CausalClosure

    def __init__(
        self,
        table: pd.DataFrame,
        pairs: pd.DataFrame,
        comparison: pd.DataFrame,
        candidates: pd.DataFrame,
        summary: Mapping[str, Any],
        probe: CausalClosure,
        loaded_from: str | None = None,
    ) -> None:
        self._freeze_result(
            table, summary, loaded_from, pairs=pairs, comparison=comparison, candidates=candidates,
            probe=probe,
        )  # fmt: skip

    @property
    def headline(self) -> str:
        """What holds and what does not (module docstring), with the groups' sizes and the p floor."""
        return str(self.summary["headline"])

    def __str__(self) -> str:
        return "\n".join([self.headline, self.comparison.to_string(index=False)])


def _matching(candidates: pd.DataFrame, k: int, size: str) -> Matching:
    return match_controls(candidates, k=k, by=size)


def comparisons(
    table: pd.DataFrame, matching: Matching, variants: Sequence[str], n_permutations: int, seed: int
) -> pd.DataFrame:
    """The comparison table (module docstring): one row per variant and quantity."""
    rows = []
    for v in variants:
        for q in QUANTITIES:
            md = matched_difference(
                table, f"{q}_{v}", matching, statistic=STATISTIC, n_permutations=n_permutations, seed=seed,
                max_exact=MAX_EXACT,
            )  # fmt: skip
            rows.append({
                "variant": v, "quantity": q, "statistic": md.statistic, "closed": md.closed, "controls": md.controls,
                "difference": md.difference, "p_value": md.p_value, "q_value": math.nan, "method": md.method,
                "n_relabelings": int(md.n_relabelings), "p_floor": md.p_floor, "n_closed": int(md.n_closed),
                "n_controls": int(md.n_controls), "notes": "; ".join(md.notes[len(matching.notes) :]),
            })  # fmt: skip
    out = pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
    p = out["p_value"].to_numpy(dtype=float)
    fin = np.isfinite(p)
    if fin.any():
        from scipy.stats import false_discovery_control

        qv = np.full(len(p), np.nan)
        qv[fin] = false_discovery_control(p[fin], method="bh")
        out["q_value"] = qv
    return out


def _fmt(x: float, signed: bool = True) -> str:
    return "nan" if not np.isfinite(x) else f"{x:+.3g}" if signed else f"{x:.3g}"


def _p(row: Mapping[str, Any]) -> str:
    p = float(row["p_value"])
    return "no test" if not np.isfinite(p) else f"p = {p:.2g}"


#: How the headline names each quantity.
_NAMES = {"abs_total": "|Δ logit|", "total": "Δ logit", "self_repair": "self-repair", "loss": "Δ loss"}


def causal_headline(comparison: pd.DataFrame, n_matched: int, n_controls: int, size: str) -> str:
    """The headline (module docstring): per variant the closed heads' mean against their controls' for |Δ logit|,
    self-repair and Δ loss with p; then what holds (BH q <= 0.05 over the comparisons), what reaches p <= 0.05 only
    before that correction, and the p floor ("too few heads" when it is above 0.05)."""
    if n_matched == 0:
        return (
            "Causal test of closure: no closed head has a non-closed head of its layer to be matched with, so nothing "
            "is compared (see the notes)."
        )
    by = "|α|" if size == "abs_alpha" else "‖T‖" if size == "norm" else size
    c = comparison.set_index(["variant", "quantity"])
    floors = comparison["p_floor"].to_numpy(dtype=float)
    floor = float(np.nanmax(floors)) if np.isfinite(floors).any() else math.nan
    parts = []
    for v in dict.fromkeys(comparison["variant"]):
        bits = []
        for q in ("abs_total", "self_repair", "loss"):
            if (v, q) in c.index:
                r = c.loc[(v, q)]
                signed = q != "abs_total"
                bits.append(f"{_NAMES[q]} {_fmt(r['closed'], signed)} vs {_fmt(r['controls'], signed)} ({_p(r)})")
        parts.append(f"{v}: " + ", ".join(bits))
    p, qv = comparison["p_value"].to_numpy(dtype=float), comparison["q_value"].to_numpy(dtype=float)
    names = [f"{_NAMES[q]} ({v})" for v, q in zip(comparison["variant"], comparison["quantity"], strict=True)]
    holds = [n for n, x in zip(names, qv, strict=True) if np.isfinite(x) and x <= LEVEL]
    only_p = [n for n, x, y in zip(names, p, qv, strict=True) if np.isfinite(x) and x <= LEVEL and not y <= LEVEL]
    n_tests = int(np.isfinite(p).sum())
    lead = (
        f"Causal test of closure: {n_matched} closed heads against {n_controls} matched controls (same layer, nearest "
        f"{by}; mean over heads, two-sided p from relabelling within layers, BH q over the {n_tests} comparisons"
        + (f"; p floor {floor:.2g}). " if np.isfinite(floor) else "). ")
    )
    verdict = f" Holds (q <= {LEVEL:g}): " + (", ".join(holds) if holds else "nothing") + "."
    if only_p:
        verdict += f" p <= {LEVEL:g} but not after BH: {', '.join(only_p)}."
    if np.isfinite(floor) and floor > LEVEL:
        verdict += f" Too few heads to reach p <= {LEVEL:g}: the smallest p the relabelling can give is {floor:.2g}."
    return lead + "; ".join(parts) + "." + verdict


def _per_head(probe: CausalClosure, heads: pd.DataFrame, pairs: pd.DataFrame, variants: Sequence[str]) -> pd.DataFrame:
    """The per-head table (class docstring) from the probe's table and changes and the report's heads."""
    pt, ch = probe._table, probe.changes
    mates: dict[str, list[str]] = {}
    for a, b in zip(pairs["closed_label"], pairs["control_label"], strict=True):
        mates.setdefault(a, []).append(b)
        mates.setdefault(b, []).append(a)
    t = pd.DataFrame(index=pt.index)
    t["layer"], t["head"], t["kv_head"] = pt["layer"], pt["head"], pt["kv_head"]
    t["group"] = ["closed" if bool(heads.loc[lab, "closed"]) else "control" for lab in t.index]
    t["matched_with"] = [",".join(dict.fromkeys(mates.get(lab, []))) for lab in t.index]
    for col in ("P", "alpha", "norm"):
        t[col] = heads.loc[t.index, col].to_numpy(dtype=float)
    t["closed"] = heads.loc[t.index, "closed"].to_numpy(dtype=bool)
    t["n_positions"] = pt["n_positions"].to_numpy(dtype=np.int64)
    for v in variants:
        reasons = ch[ch["variant"] == v].set_index("label")["reason"].reindex(t.index)
        for col in PER_VARIANT:
            if col == "abs_total":
                t[f"abs_total_{v}"] = np.abs(pt[f"total_{v}"].to_numpy(dtype=float))
            elif col == "reason":
                t[f"reason_{v}"] = [str(x) for x in reasons]
            else:
                t[f"{col}_{v}"] = pt[f"{col}_{v}"].to_numpy(dtype=float)
    return t


def _summary(
    probe: CausalClosure, table: pd.DataFrame, matching: Matching, comparison: pd.DataFrame, threshold: float,
    k: int, size: str, variants: Sequence[str], n_permutations: int, seed: int,
) -> dict[str, Any]:  # fmt: skip
    n_matched, n_ctrl = len(matching.closed), len(matching.controls)
    return {
        "model_name": probe.summary["model_name"],
        "threshold": float(threshold),
        "n_closed": int((table["group"] == "closed").sum()),
        "n_matched": n_matched,
        "n_control_heads": n_ctrl,
        "n_controls": int(k),
        "match_by": size,
        "variants": list(variants),
        "statistic": STATISTIC,
        "n_permutations": int(n_permutations),
        "seed": int(seed),
        "n_positions": int(probe.summary["n_positions"]),
        "notes": list(matching.notes),
        "headline": causal_headline(comparison, n_matched, n_ctrl, size),
    }


def candidates_of(heads: pd.DataFrame, layers: Sequence[int]) -> pd.DataFrame:
    """The report's heads of ``layers`` (:data:`CANDIDATE_COLUMNS`, indexed by label): what controls are chosen
    from."""
    c = heads[heads["layer"].isin(list(layers))].loc[:, list(CANDIDATE_COLUMNS)].copy()
    c["closed"] = c["closed"].astype(bool)
    for col in ("alpha", "norm", "P"):
        c[col] = c[col].astype(float)
    return c


def plan_heads(heads: pd.DataFrame, chosen: Sequence[str], k: int, size: str) -> tuple[pd.DataFrame, Matching]:
    """The candidates (every head of the chosen closed heads' layers; the closed heads not chosen left out) and
    the matching of the chosen closed heads (:func:`~tl_idempotence.core.matching.match_controls`)."""
    layers = sorted({int(heads.loc[lab, "layer"]) for lab in chosen})
    cand = candidates_of(heads, layers)
    keep = [lab for lab in cand.index if lab in set(chosen) or not bool(cand.loc[lab, "closed"])]
    return cand, _matching(cand.loc[keep], k, size)


def causal_join(
    probe: CausalClosure, heads: pd.DataFrame, chosen: Sequence[str], threshold: float, *, k: int, size: str,
    n_permutations: int, seed: int,
) -> CausalTest:  # fmt: skip
    """The closed heads ``chosen`` and their matched controls, joined with the report's ``heads`` (indexed by
    label: ``layer, head, closed, alpha, norm, P``) and compared (module docstring); ``probe`` ran on them."""
    cand, matching = plan_heads(heads, chosen, k, size)
    variants = list(probe.summary["variants"])
    table = _per_head(probe, heads, matching.pairs, variants)
    comparison = comparisons(table, matching, variants, n_permutations, seed)
    summary = _summary(probe, table, matching, comparison, threshold, k, size, variants, n_permutations, seed)
    return CausalTest(table, matching.pairs, comparison, cand, summary, probe)


def check_causal_fits_report(heads: pd.DataFrame, threshold: float, result: Any) -> CausalTest:
    """A causal test joined with *this* report: every head and candidate is one of the report's, with its P, α,
    ‖T‖ and closed flag, at the report's threshold (a result of another report is refused, never joined by label).

    Raises:
        OptionTypeError: not a :class:`CausalTest`. OptionError: heads, numbers or threshold not the report's.
    """
    if not isinstance(result, CausalTest):
        raise OptionTypeError(f"causal must be the result of rep.causal(...); got {type(result).__name__}.")
    cand = result.candidates
    lack = [x for x in cand.index if x not in heads.index]
    bad = list(lack)
    if not lack:
        h = heads.loc[cand.index]
        for col in ("P", "alpha", "norm", "closed"):
            a, b = cand[col].to_numpy(dtype=float), h[col].to_numpy(dtype=float)
            bad += [lab for lab, same in zip(cand.index, (a == b) | (np.isnan(a) & np.isnan(b))) if not same]
    if bad or float(result.summary["threshold"]) != float(threshold):
        raise OptionError(
            "This causal test was made with another report (heads, P, α, ‖T‖ or closed differ at "
            f"{sorted(set(bad))[:5]}, or threshold {result.summary['threshold']} != {threshold:g}): make it with this "
            "report, rep.causal()."
        )
    return result


def causal_columns(result: CausalTest) -> pd.DataFrame:
    """The per-head columns the report's exports add: ``causal_group`` and, per variant, ``causal_total_{v}``,
    ``causal_self_repair_{v}``, ``causal_loss_{v}``."""
    t = result._table
    out = pd.DataFrame(index=t.index)
    out["causal_group"] = t["group"].astype(object)
    for v in result.summary["variants"]:
        for col in ("total", "self_repair", "loss"):
            out[f"causal_{col}_{v}"] = t[f"{col}_{v}"].to_numpy(dtype=float)
    return out


def causal_record(result: CausalTest) -> dict[str, Any]:
    """The JSON export of a causal test: its summary, the comparison rows and the matched pairs."""
    return {
        "summary": thawed(dict(result.summary)),
        "comparison": result.comparison.to_dict("records"),
        "pairs": result.pairs.to_dict("records"),
    }


@saves("causal_test")
def save_causal_test(result: CausalTest, path: PathLike, overwrite: bool = False) -> str:
    """Save a causal test to the folder ``path``: ``table``, ``pairs``, ``comparison`` and ``candidates`` (parquet),
    ``causal_test.json`` (the summary, the sha256 of each table, its digest) and the probe's own save in
    ``causal_closure/``, through the one store; no pickle.

    Raises:
        OptionTypeError: ``result`` is not a :class:`CausalTest`; every other error as
            :meth:`StoredResult.save <tl_idempotence.core.stored.StoredResult.save>`.
    """
    from ..core.records import tables_record_files

    if not isinstance(result, CausalTest):
        raise OptionTypeError(f"save_causal_test saves a CausalTest (rep.causal); got {type(result).__name__}.")
    check_save_target(path, "A causal test save", "causal_test", result.loaded_from)
    tables = {
        "table": result._table,
        "pairs": result.pairs,
        "comparison": result.comparison,
        "candidates": result.candidates,
    }
    part = tables_record_files(PROBE_FORMAT, PROBE_RECORD, closure_tables(result.probe), probe_fields(result.probe))
    summary = thawed(dict(result.summary))
    parts = {"causal_closure": part}
    return str(write_summary_record(path, CausalTest.store, tables, summary, parts, overwrite))


def _refuse(f: Path, what: str) -> ReportFileError:
    return ReportFileError(f"{f}: {what}: the record or a table was edited. Make the causal test again (rep.causal).")


def _frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    return all(same_value(json_like(a[c].tolist()), json_like(b[c].tolist())) for c in a.columns)


@loads("causal_test")
def load_causal_test(path: PathLike) -> CausalTest:
    """Read back what :func:`save_causal_test` wrote, checking every digest and recomputing the matching (from the
    candidates), the per-head table (from the probe's save, whose loader recomputes it from the positions), the
    comparisons (from the per-head table and the seed) and the summary.

    Raises:
        MissingFileError: no such folder, no ``causal_test.json``, a listed table missing (names it).
        ReportFileError: another format; an edited record (digest) or table (sha256), each named; a table or summary
            field that is not what the saved tables give (names the file and the field); a probe part refused by its
            loader.
        OptionTypeError: ``path`` is not a path.
    """
    names = frozenset({"table", "pairs", "comparison", "candidates"})
    d, raw, summary, tables = read_summary_record(path, CausalTest.store, names, "a causal test")
    rec = d / CAUSAL_TEST_RECORD
    f = {n: d / f"{n}.parquet" for n in ("table", "pairs", "comparison", "candidates")}
    if raw.get("parts") != ["causal_closure"]:
        raise _refuse(rec, f"parts {raw.get('parts')!r} are not ['causal_closure']")
    probe = load_causal_closure(d / "causal_closure")
    try:
        s = CausalTestSummary(summary)
        threshold, k, size = float(s["threshold"]), int(s["n_controls"]), str(s["match_by"])
        n_perm, seed, variants = int(s["n_permutations"]), int(s["seed"]), list(s["variants"])
        cand = tables["candidates"]
        cand.index = head_labels(
            index_column(cand, "layer", f["candidates"]), index_column(cand, "head", f["candidates"])
        )
    except (KeyError, TypeError, ValueError, OptionError) as e:
        raise ReportFileError(f"{rec}: a malformed summary or candidates ({type(e).__name__}: {e}).") from e
    try:
        return _check_loaded(d, rec, f, tables, summary, probe, cand, threshold, k, size, n_perm, seed, variants)
    except (OptionError, OptionTypeError) as e:  # the matching or the comparison refused what the record says
        raise _refuse(rec, f"the summary or a table cannot be what rep.causal wrote ({e})") from e


def _check_loaded(
    d: Path, rec: Path, f: Mapping[str, Path], tables: Mapping[str, pd.DataFrame], summary: dict[str, Any],
    probe: CausalClosure, cand: pd.DataFrame, threshold: float, k: int, size: str, n_perm: int, seed: int,
    variants: list[str],
) -> CausalTest:  # fmt: skip
    """The loader's recomputations (:func:`load_causal_test`)."""
    table, pairs, comp = tables["table"], tables["pairs"], tables["comparison"]
    if list(probe.summary["variants"]) != variants:
        raise _refuse(rec, "summary['variants'] is not the probe's (causal_closure/)")
    if tuple(cand.columns) != CANDIDATE_COLUMNS or cand["closed"].dtype != bool:
        raise _refuse(f["candidates"], f"columns {list(cand.columns)} are not {list(CANDIDATE_COLUMNS)}")
    if not (cand["closed"].to_numpy() == (cand["P"].to_numpy(dtype=float) >= threshold)).all():
        raise _refuse(f["candidates"], f"'closed' disagrees with P >= threshold ({threshold:g})")
    table.index = head_labels(index_column(table, "layer", f["table"]), index_column(table, "head", f["table"]))
    if list(table.index) != list(probe._table.index):
        raise _refuse(f["table"], "its heads are not the probe's (causal_closure/)")
    chosen = [lab for lab in table.index if table.loc[lab, "group"] == "closed"]
    if not set(chosen) <= set(cand.index) or not all(bool(cand.loc[lab, "closed"]) for lab in chosen):
        raise _refuse(f["table"], "a head of group 'closed' is not a closed candidate")
    keep = [lab for lab in cand.index if lab in set(chosen) or not bool(cand.loc[lab, "closed"])]
    matching = _matching(cand.loc[keep], k, size)
    if not _frames_equal(pairs, matching.pairs):
        raise _refuse(f["pairs"], "the pairs are not what the candidates, n_controls and match_by give")
    heads = cand.copy()
    fresh = _per_head(probe, heads, matching.pairs, variants)
    if not _frames_equal(table, fresh):
        raise _refuse(f["table"], "the per-head table is not what the probe (causal_closure/) and candidates give")
    fresh_comp = comparisons(fresh, matching, variants, n_perm, seed)
    if not _frames_equal(comp, fresh_comp):
        raise _refuse(f["comparison"], "the comparison is not what the per-head table and the seed give")
    want = _summary(probe, fresh, matching, fresh_comp, threshold, k, size, variants, n_perm, seed)
    for key, v in want.items():
        if not same_value(json_like(summary.get(key)), json_like(v)) or type(summary.get(key)) is not type(v):
            raise _refuse(rec, f"summary[{key!r}] is {summary.get(key)!r} but {v!r} from the tables")
    return CausalTest(table, pairs, comp, cand, summary, probe, loaded_from=str(d))
