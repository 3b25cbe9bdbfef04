"""A saved report that lies, replayed as a user (or a careless script) makes it lie, on real files in tmp_path.

* ``rep.save(folder, overwrite=True)`` deletes only the files an earlier report wrote: those its ``report.json``
  lists, when that record passes its own digest and lists only tables the format writes. An edited record (a
  user's file added to its list) is refused by name and every file of the folder stays byte for byte.
* ``tli.load_report`` recomputes the summary from the tables, the info and the options: an edited summary number
  whose digest was recomputed (``n_closed=6`` with its per-layer counts and fraction forged to match, beside 5
  closed rows; ``threshold`` 0.2 beside a ``closed`` column at 0.9; a median, the model's name, the algebra's
  range pairs, ...) is refused naming the field and both values; ``n_closed=99`` beside 12 heads is impossible on
  its own. The CLI's ``sweep --collect`` reports such an item as having no report, with the same reason.
* ``ReportSummary.from_dict`` validates every field's type and range (one table of bad values) and raises only
  the library's errors, naming the field.
* ``rep.with_threshold(t)`` of an ``algebra=True`` report equals a fresh report at ``t`` on every summary field,
  the algebra's closed range pairs and their angles included.

The model: a small synthetic GQA source (2 layers x 6 query heads sharing 2 kv heads, d_model 32, d_head 4)
whose heads are oblique projections plus seeded noise of growing size, so that P spreads over (0, 1]: at 0.9
5 of its 12 heads close (1 pair of closed heads shares a kv group), at 0.5 10 do (8 such pairs).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import tl_idempotence as tli
from helpers import SyntheticSource, closed_head_for, rewrite_record
from tl_idempotence.core.heads import LayerHeads, kv_layout
from tl_idempotence.errors import OptionError, OptionTypeError, ReportFileError, TLIError
from tl_idempotence.report.store import NOT_DERIVED, RECORD, TABLE_NAMES
from tl_idempotence.report.summary import ReportSummary, field_rules

F64 = torch.float64
#: Noise added to each head's exact projection, as a multiple of its norm (head h of layer l gets
#: NOISE[(h + l) % 6]): P = 1, 0.84, 0.82, 1, 0.77, 0.39 in layer 0.
NOISE = [0.0, 0.8, 3.0, 0.0, 1.5, 10.0]


def gqa_source(seed: int = 0) -> SyntheticSource:
    g = torch.Generator().manual_seed(seed)
    n_heads, n_kv, d, r = 6, 2, 32, 4
    kv = kv_layout(n_heads, n_kv)
    lhs = []
    for layer in range(2):
        V = torch.randn(n_kv, d, r, generator=g, dtype=F64)
        O = []
        for h in range(n_heads):
            base = closed_head_for(V[int(kv[h])], [0.8] * r, g)
            noise = torch.randn(d, r, generator=g, dtype=F64)
            O.append(base + NOISE[(h + layer) % n_heads] * noise * base.norm() / noise.norm())
        lhs.append(LayerHeads(layer, torch.stack(O), V, kv))
    return SyntheticSource(lhs, name="synthetic-gqa")


@pytest.fixture(scope="module")
def rep():
    return tli.idempotence_report(gqa_source(), nulls=4, seed=1, search=True, algebra=True, progress=False)


@pytest.fixture
def saved(rep, tmp_path):
    return Path(rep.save(tmp_path / "report"))


def folder_bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_the_model_closes_some_heads_at_0_9_and_more_at_0_5(rep):
    assert rep.summary["n_closed"] == 5 and list(rep.closed_heads.index) == ["L0H0", "L0H3", "L1H2", "L1H5", "L1H0"]
    assert rep.with_threshold(0.5).summary["n_closed"] == 10
    assert set(rep.tables) | {"heads", "layers"} <= TABLE_NAMES  # a report with every analysis writes no other


# --------------------------------------------------------------------------- overwrite


def _list_user_file(rec):
    rec["files"]["mine"] = hashlib.sha256(b"my own table").hexdigest()
    rec["tables"].append("mine")


@pytest.mark.parametrize(
    ("digest", "says"),
    [
        (False, r"report\.json does not match its recorded sha256 digest \(it was edited or damaged\)"),
        (True, r"lists .*mine\.parquet, which is not a table a report save writes"),
    ],
    ids=["digest-stale", "digest-recomputed"],
)
def test_overwrite_never_deletes_a_users_file_an_edited_record_lists(rep, saved, digest, says):
    """The record lists the user's ``mine.parquet``: before, overwrite deleted it. Now nothing is deleted."""
    (saved / "mine.parquet").write_bytes(b"my own table")
    (saved / "notes.md").write_text("my notes")
    rewrite_record(saved, _list_user_file, digest=digest)
    before = folder_bytes(saved)
    with pytest.raises(OptionError, match=says) as err:
        rep.save(saved, overwrite=True)
    assert str(saved) in str(err.value) and "nothing was deleted" in str(err.value)
    assert folder_bytes(saved) == before  # every file byte for byte, the user's and the old report's


def test_overwrite_refuses_a_damaged_record_and_keeps_every_file(rep, saved):
    (saved / "mine.parquet").write_bytes(b"my own table")
    text = (saved / RECORD).read_text()
    (saved / RECORD).write_text(text[: len(text) // 2])
    before = folder_bytes(saved)
    with pytest.raises(OptionError, match=rf"{re.escape(str(saved / RECORD))} cannot be read as a report record"):
        rep.save(saved, overwrite=True)
    assert folder_bytes(saved) == before


def test_overwrite_over_a_valid_record_replaces_only_the_reports_files(rep, saved):
    (saved / "mine.parquet").write_bytes(b"my own table")
    small = tli.idempotence_report(gqa_source(), progress=False)  # no analyses: only heads and layers
    small.save(saved, overwrite=True)
    assert sorted(p.name for p in saved.iterdir()) == ["heads.parquet", "layers.parquet", "mine.parquet", RECORD]
    assert (saved / "mine.parquet").read_bytes() == b"my own table"
    assert tli.load_report(saved).summary == small.summary


# --------------------------------------------------------------------------- load_report recomputes the summary


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            lambda r: r["summary"].update(
                n_closed=6, frac_closed=0.5, closed_per_layer={"__int_keys__": [[0, 3], [1, 3]]}
            ),  # a consistent forgery: the validator passes it
            "summary['n_closed'] is 6 in the record but 5 from its tables",
        ),
        (lambda r: r["summary"].update(threshold=0.2), "summary['threshold'] is 0.2 in the record but 0.9 from"),
        (
            lambda r: r["summary"].update(closed_per_layer={"__int_keys__": [[0, 1], [1, 4]]}),
            "summary['closed_per_layer'][0] is 1 in the record but 2 from",
        ),
        (lambda r: r["summary"].update(median_P=0.5), "summary['median_P'] is 0.5 in the record but 0.8"),
        (
            lambda r: r["summary"].update(model_name="gpt-5"),
            "summary['model_name'] is 'gpt-5' in the record but 'synth",
        ),
        (
            lambda r: r["summary"]["algebra"].update(n_closed_range_pairs=7),
            "summary['algebra']['n_closed_range_pairs'] is 7 in the record but 1 from",
        ),
        (
            lambda r: r["summary"].update(n_heads_beating_scramble=0, frac_beats_scramble=0.0),
            "summary['n_heads_beating_scramble'] is 0 in the record but",
        ),
        (lambda r: r["summary"].update(n_feasible_layers=0, infeasible_layers=[0, 1]), "summary['n_feasible_layers']"),
        (lambda r: r["summary"].update(weights_fingerprint="0" * 64), "summary['weights_fingerprint'] is '0000"),
        (lambda r: r["summary"]["options"].update(nulls=64), "summary['options']['nulls'] is 64 in the record but 4"),
        (lambda r: r["summary"].update(algebra_ranges_threshold=0.5), "summary['algebra_ranges_threshold'] is 0.5"),
    ],
    ids=[
        "n_closed",
        "threshold",
        "closed_per_layer",
        "median_P",
        "model_name",
        "algebra",
        "frac_beats_scramble",
        "n_feasible_layers",
        "fingerprint",
        "options",
        "ranges threshold",
    ],
)
def test_an_edited_summary_with_its_digest_recomputed_is_refused(saved, edit, says):
    rewrite_record(saved, edit)
    with pytest.raises(ReportFileError, match=re.escape(says)) as err:
        tli.load_report(saved)
    assert str(saved / RECORD) in str(err.value) and "the record was edited" in str(err.value)


def test_a_record_without_one_of_an_analysiss_fields_is_refused(saved):
    """The scramble ran but its record lacks median_P_scrambled: no summary at all (the analysis's record is
    incomplete), refused by the validator before anything is compared, naming the file and the field."""
    rewrite_record(saved, lambda r: r["summary"].pop("median_P_scrambled"))
    says = "summary record (OptionError: summary lacks ['median_P_scrambled'])"
    with pytest.raises(ReportFileError, match=re.escape(says)) as e:
        tli.load_report(saved)
    assert str(saved / RECORD) in str(e.value)


def test_an_impossible_count_is_refused_before_anything_is_compared(saved):
    """``n_closed=99`` beside 12 heads: the summary itself is impossible (the validator names it)."""
    rewrite_record(saved, lambda r: r["summary"].update(n_closed=99))
    with pytest.raises(ReportFileError, match=re.escape("n_closed=99 is impossible: more than n_heads=12")) as err:
        tli.load_report(saved)
    assert str(saved / RECORD) in str(err.value)


def test_the_threshold_moved_with_the_options_is_refused_by_the_closed_column(saved):
    """options.threshold and summary.threshold both 0.2 (consistent record), the 'closed' column at 0.9."""
    rewrite_record(saved, lambda r: (r["options"].update(threshold=0.2), r["summary"].update(threshold=0.2)))
    with pytest.raises(
        ReportFileError, match=r"'closed' disagrees with P >= threshold \(0\.2\) at L\d+H\d+ \(first of \d+ head"
    ):
        tli.load_report(saved)


def test_what_the_tables_cannot_give_may_differ(saved, rep):
    """The code versions and a route's additions are not derived: a record that differs there loads as it is."""
    rewrite_record(saved, lambda r: r["summary"].update(versions={"tl_idempotence": "0.0"}, n_params=12345))
    back = tli.load_report(saved)
    assert back.summary["versions"] == {"tl_idempotence": "0.0"} and back.summary["n_params"] == 12345
    assert NOT_DERIVED == {"versions", "n_layers_resumed", "n_params"}
    same = [k for k in rep.summary if k not in NOT_DERIVED]
    assert json.dumps([back.summary[k] for k in same]) == json.dumps([rep.summary[k] for k in same])


# --------------------------------------------------------------------------- ReportSummary.from_dict


BAD_VALUES = [
    # (field, value, error type, what the message says)
    ("n_closed", "3", OptionTypeError, "summary field n_closed must be an int (not a bool or a float); got str '3'"),
    ("n_closed", True, OptionTypeError, "summary field n_closed must be an int (not a bool or a float); got bool"),
    ("n_closed", 3.0, OptionTypeError, "summary field n_closed must be an int (not a bool or a float); got float"),
    ("n_closed", -1, OptionError, "summary field n_closed=-1 is impossible: it must be an int >= 0"),
    ("n_closed", 13, OptionError, "summary field n_closed=13 is impossible: more than n_heads=12"),
    ("n_closed", 4, OptionError, "closed_per_layer counts 5 closed heads, but n_closed=4"),
    ("n_heads_per_layer", 0, OptionError, "summary field n_heads_per_layer=0 is impossible: it must be an int >= 1"),
    ("d_model", None, OptionTypeError, "summary field d_model must be an int (not a bool or a float); got NoneType"),
    ("median_P", 2.0, OptionError, "summary field median_P=2.0 is impossible: it must be in [0, 1] (or NaN"),
    ("median_P", -0.1, OptionError, "summary field median_P=-0.1 is impossible"),
    ("median_P", float("nan"), OptionError, "median_P=nan is impossible: it is NaN (undefined) exactly when"),
    ("median_P", "0.5", OptionTypeError, "summary field median_P must be a real number (not a bool or a str)"),
    ("median_P", False, OptionTypeError, "summary field median_P must be a real number"),
    ("frac_closed", float("inf"), OptionError, "summary field frac_closed=inf is impossible"),
    ("threshold", float("nan"), OptionError, "summary field threshold=nan is impossible: it must be a finite number"),
    ("threshold", 1.5, OptionError, "summary field threshold=1.5 is impossible"),
    ("threshold", True, OptionTypeError, "summary field threshold must be a real number"),
    ("algebra_ranges_threshold", -0.5, OptionError, "summary field algebra_ranges_threshold=-0.5 is impossible"),
    ("mismatch_P_max", 1.0000001, OptionError, "summary field mismatch_P_max=1.0000001 is impossible"),
    ("frac_beats_scramble", float("nan"), OptionError, "frac_beats_scramble=nan is impossible: it is NaN (undefined"),
    ("n_heads_beating_scramble", 99, OptionError, "n_heads_beating_scramble=99 is impossible: more than n_heads_c"),
    ("model_name", 7, OptionTypeError, "summary field model_name must be a str; got int 7"),
    ("closed_per_layer", [2, 3], OptionTypeError, "summary field closed_per_layer must be a dict {layer: count}"),
    ("closed_per_layer", {0: -2, 1: 7}, OptionError, "closed_per_layer must map layer indices (ints >= 0) to counts"),
    ("closed_per_layer", {0: 2, 5: 3}, OptionError, "closed_per_layer has layer 5, but n_layers=2"),
    ("closed_per_layer", {"0": 2, 1: 3}, OptionError, "closed_per_layer must map layer indices"),
    ("layers_trained_loses", [0, -1], OptionError, "layers_trained_loses must be a list of layer indices"),
    ("layers_trained_loses", "0", OptionTypeError, "summary field layers_trained_loses must be a list"),
    ("infeasible_layers", [True], OptionError, "infeasible_layers must be a list of layer indices (ints >= 0)"),
    ("mismatch_notes", ["ok", 3], OptionTypeError, "summary field mismatch_notes must be a list of str"),
    ("options", [], OptionTypeError, "summary field options must be a dict; got list"),
    ("algebra", {1: 2}, OptionTypeError, "summary field algebra must be keyed by str"),
    ("n_params", -5, OptionError, "summary field n_params=-5 is impossible"),
    ("n_clossed", 1, OptionError, "summary keys ['n_clossed'] are not fields of a report summary"),
]


@pytest.mark.parametrize(("field", "value", "error", "says"), BAD_VALUES, ids=[f"{b[0]}={b[1]!r}" for b in BAD_VALUES])
def test_from_dict_refuses_wrong_types_and_impossible_values(rep, field, value, error, says):
    d = rep.summary.to_dict()
    assert d["n_heads"] == 12 and d["n_closed"] == 5 and d["n_layers"] == 2
    with pytest.raises(error, match=re.escape(says)) as err:
        ReportSummary.from_dict({**d, field: value})
    assert isinstance(err.value, TLIError)
    if field in field_rules():  # the same rule for every way a summary is made
        with pytest.raises(error, match=re.escape(says)):
            rep.summary.replace(**{field: value})


def test_from_dict_of_what_is_not_a_mapping_raises_the_librarys_error(rep):
    for bad in (None, [("n_closed", 3)], "summary", 3):
        with pytest.raises(OptionTypeError, match="a report summary must be a mapping of its fields"):
            ReportSummary.from_dict(bad)  # type: ignore[arg-type]
    d = rep.summary.to_dict()
    del d["n_closed"]
    with pytest.raises(OptionError, match=re.escape("summary lacks ['n_closed']")):
        ReportSummary.from_dict(d)


def test_from_dict_takes_every_valid_summary_back(rep):
    """The validator refuses no summary the library makes: NaN where it is undefined, the report at 0.0 and 1.0."""
    for r in (rep, rep.with_threshold(0.0), rep.with_threshold(1.0)):
        assert ReportSummary.from_dict(r.summary.to_dict()) == r.summary
    nan = float("nan")
    nothing = {
        "n_attention_layers": 0,
        "n_heads": 0,
        "n_closed": 0,
        "frac_closed": nan,
        "median_P": nan,
        "n_undefined_P": 0,
    }
    nothing.update(closed_per_layer={}, layers_trained_loses=[], n_layers_trained_wins=0, n_feasible_layers=0)
    nothing.update(
        infeasible_layers=[],
        n_mismatch_pairs=0,
        n_mismatch_closed=0,
        n_heads_compared=0,
        n_heads_beating_scramble=0,
        frac_beats_scramble=nan,
    )
    assert math.isnan(ReportSummary.from_dict({**rep.summary.to_dict(), **nothing}).median_P)
    # every flat field of 0.2's summary keeps its name (now the report's own fields and the analyses' records)
    assert set(field_rules()) == set(V02_SUMMARY_FIELDS)
    assert set(rep.summary.to_dict()) <= set(V02_SUMMARY_FIELDS)


V02_SUMMARY_FIELDS = (
    "model_name model_class n_layers n_attention_layers n_heads n_heads_per_layer n_kv_heads d_model d_head "
    "threshold n_closed frac_closed median_P n_undefined_P closed_per_layer n_scramble_draws median_P_trained "
    "median_P_scrambled n_heads_compared n_heads_beating_scramble frac_beats_scramble n_layers_trained_wins "
    "layers_trained_loses n_heads_q05 n_mismatch_pairs n_mismatch_closed mismatch_P_max mismatch_notes "
    "n_feasible_layers infeasible_layers processing options versions weights_fingerprint source notes algebra "
    "algebra_ranges_threshold n_layers_resumed n_params"
).split()


def test_an_impossible_summary_in_a_saved_report_is_refused_naming_the_file_and_the_field(saved):
    rewrite_record(saved, lambda r: r["summary"].update(n_closed=True))
    with pytest.raises(ReportFileError, match=r"report\.json has a malformed info/options/summary record .*n_closed"):
        tli.load_report(saved)


# --------------------------------------------------------------------------- with_threshold equals a fresh report


@pytest.mark.parametrize("t", [0.5, 0.0, 0.95])
def test_with_threshold_equals_a_fresh_report_on_every_summary_field(rep, t, tmp_path):
    """The algebra's closed range pairs and their angles at the new threshold too (at 0.5: 8 pairs,
    where the report at 0.9 has 2)."""
    fresh = tli.idempotence_report(
        gqa_source(), nulls=4, seed=1, search=True, algebra=True, threshold=t, progress=False
    )
    moved = rep.with_threshold(t)
    assert set(moved.summary) == set(fresh.summary)
    for k in fresh.summary:
        if k != "versions":
            assert json.dumps(moved.summary[k], sort_keys=True) == json.dumps(fresh.summary[k], sort_keys=True), k
    assert moved.summary["algebra_ranges_threshold"] == t
    if t == 0.5:
        assert rep.summary["algebra"]["n_closed_range_pairs"] == 1
        assert moved.summary["algebra"]["n_closed_range_pairs"] == 8
    for name in fresh.tables:
        assert moved.tables[name].equals(fresh.tables[name]), name
    assert moved.layers.equals(fresh.layers)
    assert moved.algebra.closed_ranges.equals(fresh.algebra.closed_ranges)
    # and it saves and loads as itself (the summary check passes on a moved report)
    assert tli.load_report(moved.save(tmp_path / "moved")).summary == moved.summary


def test_a_report_saved_before_every_pairs_angles_were_kept_warns_when_lowered(saved):
    """A legacy record (no algebra_ranges table) keeps its old meaning and says so below its run's threshold."""
    rewrite_record(
        saved,
        lambda r: (r["files"].pop("algebra_ranges"), r["tables"].remove("algebra_ranges")),
    )
    (saved / "algebra_ranges.parquet").unlink()
    old = tli.load_report(saved)
    with pytest.warns(UserWarning, match=r"cover only the pairs closed at its run's threshold 0\.9, not every pair"):
        low = old.with_threshold(0.5)
    # the one pair closed at 0.9 (of the 8 closed at 0.5), as the record says
    assert low.summary["algebra_ranges_threshold"] == 0.9 and low.summary["algebra"]["n_closed_range_pairs"] == 1
    assert len(low.algebra.closed_ranges) == 1


def test_a_record_written_before_a_derived_field_existed_loads_with_it(rep, saved):
    """A record without ``n_heads_q05`` (a field derived from the tables) loads, the field computed from its tables;
    any other missing field is still an edit and is refused."""
    want = rep.summary["n_heads_q05"]
    assert isinstance(want, int)

    def drop(field):
        return lambda rec: rec["summary"].pop(field)

    rewrite_record(saved, drop("n_heads_q05"))
    back = tli.load_report(saved)
    assert back.summary["n_heads_q05"] == want
    rewrite_record(saved, drop("median_P"))
    with pytest.raises(ReportFileError, match=re.escape("summary lacks ['median_P']")):
        tli.load_report(saved)


# --------------------------------------------------------------------------- index columns that are not whole numbers


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("kv_head", -0.5, r"column 'kv_head' holds values that are not whole numbers \(\[-0\.5\]\)"),
        ("head", 1.5, r"column 'head' holds values that are not whole numbers \(\[1\.5\]\)"),
        ("layer", float("nan"), r"column 'layer' holds values that are not whole numbers \(\[nan\]\)"),
        ("head", "text", r"column 'head' is of type \w+, not an integer index"),
    ],
)
def test_a_head_index_that_is_not_a_whole_number_is_refused_not_truncated(saved, column, value, says):
    """A lying index with every digest recomputed: a cast to int64 would read kv_head -0.5 as 0."""
    f = saved / "heads.parquet"
    df = pd.read_parquet(f)
    if isinstance(value, str):  # the whole column as text (parquet holds one type per column)
        df[column] = df[column].astype(str)
    else:
        df[column] = df[column].astype("float64")
        df.loc[df.index[0], column] = value
    df.to_parquet(f)
    rewrite_record(saved, lambda r: r["files"].__setitem__("heads", hashlib.sha256(f.read_bytes()).hexdigest()))
    with pytest.raises(ReportFileError, match=says):
        tli.load_report(saved)


def test_a_whole_float_index_column_is_read_as_its_integers(saved, rep):
    """A table another tool rewrote with float indices that are whole numbers still loads, to the same report."""
    f = saved / "heads.parquet"
    df = pd.read_parquet(f)
    df["kv_head"] = df["kv_head"].astype("float64")
    df.to_parquet(f)
    rewrite_record(saved, lambda r: r["files"].__setitem__("heads", hashlib.sha256(f.read_bytes()).hexdigest()))
    back = tli.load_report(saved)
    assert back.heads["kv_head"].tolist() == rep.heads["kv_head"].tolist()
