"""A saved head-roles record that contradicts itself is refused, digests recomputed: ``kv_head``
against the kv map of the info's sizes, ``info.n_heads`` against the table, ``model_name`` against the info,
``n_tokens`` against the options and the sequence it states; ``save_roles`` refuses to write such a result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tl_idempotence as tli
from helpers import closed_pairs_layers, rewrite_saved
from tl_idempotence.errors import OptionError, ReportFileError
from tl_idempotence.probes.roles import ROLES, HeadRoles

pytestmark = pytest.mark.bridge


@pytest.fixture(scope="module")
def roles():
    rep = tli.idempotence_report(closed_pairs_layers(), progress=False)
    t = rep.heads[["layer", "head", "kv_head"]].copy()
    g = np.random.default_rng(0)
    for r in ROLES:
        t[r] = g.uniform(0, 1, len(t))
    t["reason"] = ""
    summary = {
        "model_name": rep.info.model_name,
        "model_class": rep.info.model_class,
        "n_heads": len(t),
        "n_tokens": 24,
        "n_sequences": 8,
        "seed": 0,
        "sequence": "BOS x x, x = 24 random non-special token ids (BOS id 0)",
        "processing": dict(rep.info.processing),
        **{f"median_{r}": float(np.median(t[r])) for r in ROLES},
    }
    return HeadRoles(table=t, summary=summary, info=rep.info, options={"n_tokens": 24, "n_sequences": 8, "seed": 0})


def edited(folder: Path, record=None, table=None) -> Path:
    """The roles folder with its record and/or table edited, every sha256 and the digest recomputed."""
    return rewrite_saved(folder, "roles.json", "roles", table, record)


def refused(folder: Path) -> str:
    with pytest.raises(ReportFileError) as e:
        tli.load_roles(folder)
    return str(e.value)


def test_an_untouched_save_round_trips(roles, tmp_path):
    back = tli.load_roles(tli.save_roles(roles, tmp_path / "r"))
    assert back.table.values.tolist() == roles.table.values.tolist() and list(back.table.index) == list(
        roles.table.index
    )
    assert back.summary == roles.summary


def test_kv_heads_swapped_within_a_layer_are_refused(roles, tmp_path):
    d = Path(tli.save_roles(roles, tmp_path / "r"))
    kv = roles.table["kv_head"].tolist()
    i = next(i for i in range(len(kv) - 1) if kv[i] != kv[i + 1])
    swapped = kv.copy()
    swapped[i], swapped[i + 1] = kv[i + 1], kv[i]
    edited(d, table=lambda df: df.assign(kv_head=swapped))
    t = roles.table
    label = f"L{t['layer'].iloc[i]}H{t['head'].iloc[i]}"
    assert "roles.parquet: column 'kv_head' disagrees with the kv map of info.n_heads=" in refused(d)
    assert f"at {label} (first of 2)" in refused(d)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda r: r["info"].update(n_heads=2 * r["info"]["n_heads"]), "heads, but the record's info.n_heads is"),
        (lambda r: r["summary"].update(model_name="gpt2"), "summary['model_name'] is 'gpt2' but info.model_name is"),
        (lambda r: r["summary"].update(n_tokens=25), "summary['n_tokens'] is 25 but options['n_tokens'] is 24"),
        (
            lambda r: (r["summary"].update(n_tokens=25), r["options"].update(n_tokens=25)),
            "summary['sequence'] ('BOS x x, x = 24 random",
        ),
    ],
)
def test_a_record_that_contradicts_itself_is_refused_naming_the_field(roles, tmp_path, edit, says):
    d = Path(tli.save_roles(roles, tmp_path / "r"))
    edited(d, record=edit)
    assert says in refused(d)


def test_save_roles_never_writes_what_load_roles_refuses(roles, tmp_path):
    bad = HeadRoles(table=roles.table, summary={**roles.summary, "model_name": "other"}, info=roles.info,
                    options=roles.options)  # fmt: skip
    with pytest.raises(OptionError, match=r"summary\['model_name'\] is 'other' but info.model_name is .*nothing was"):
        tli.save_roles(bad, tmp_path / "r")
    assert not (tmp_path / "r").exists()
