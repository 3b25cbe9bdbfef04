"""Joins declared like the analyses (report/join_spec.py, report/joins.py): a toy probe joined to the report in one
module (the section below) plus one registration line is on the page, in the JSON export, in the tables, on the
command line (``--help``, ``--json``, the text summary) and in the notebook; the built-in joins' methods state the
defaults their declarations hold; the registry refuses what it cannot run.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import llama_like
from tl_idempotence import cli
from tl_idempotence.core.option_specs import OptionSpec
from tl_idempotence.core.options import check_int
from tl_idempotence.core.results import DISPLAYS, register_display
from tl_idempotence.errors import OptionError, OptionTypeError, RegistrationError, UnknownOptionError
from tl_idempotence.report import joins
from tl_idempotence.report.join_spec import JoinFlag, JoinSpec
from tl_idempotence.views.results import DrawnResult

# ----------------------------------------------------------------- the toy joined probe: everything it needs, here


class ToyNorms(DrawnResult):
    """The toy probe's result: each head's ||O_h||_F ** power, by label."""

    display_kind = "toy"

    def __init__(self, table: pd.DataFrame, summary: dict) -> None:
        self.table, self.summary = table, summary

    @property
    def heads(self) -> pd.DataFrame:
        return self.table


def toy_norms(model, power: int) -> ToyNorms:
    """A tiny probe: the Frobenius norm of each query head's output weights, to ``power`` (a checkpoint path
    or a model: read through tli.head_source)."""
    rows = {}
    for lh in tli.head_source(model):
        n = lh.O.double().flatten(1).norm(dim=1) ** power
        rows.update({f"L{lh.layer}H{h}": float(v) for h, v in enumerate(n)})
    table = pd.DataFrame({"toy_norm": rows}).rename_axis("label")
    return ToyNorms(table, {"power": power, "n_heads": len(table), "max": float(table["toy_norm"].max())})


def _run(rep, model=None, *, power):
    return toy_norms(TOY.model_of(rep, model), power)


def _fits(rep, res):
    if not isinstance(res, ToyNorms):
        raise OptionTypeError(f"toy must be a ToyNorms; got {type(res).__name__}.")
    if list(res.table.index) != list(rep.heads.index):
        raise OptionError("These toy norms are not of this report's heads.")
    return res


TOY = JoinSpec(
    name="toy",
    call="rep.join('toy')",
    result=lambda: ToyNorms,
    run=_run,
    options=(
        OptionSpec("power", 2, "the norm's power", "count", "P", types="int", check=lambda x, n: check_int(x, n, 1)),
    ),
    model="weights",
    why="the toy reads its weights",
    fits=_fits,
    page=lambda rep, res: {
        "id": "toy",
        "title": "Toy: each head's output norm",
        "note": f"||O_h||_F ** {res.summary['power']}",
        "tables": [("Heads by norm", res.table.sort_values("toy_norm", ascending=False).reset_index())],
        "headline": f"Toy: the largest norm is {res.summary['max']:.6g}.",
    },
    record=lambda res: {"summary": dict(res.summary)},
    columns=lambda res: res.table[["toy_norm"]],
    cli=JoinFlag(
        "--toy-flag",
        "also compute the toy norms of every head",
        compute=lambda rep, model, value, joined, args: rep.join("toy", model),
        progress="tl-idempotence: computing the toy norms...",
        text=lambda res: f"toy: the largest norm is {res.summary['max']:.6g}",
    ),
    display=lambda res: f"<div><b>ToyNorms</b> of {res.summary['n_heads']} heads (power {res.summary['power']})</div>",
    display_kind="toy",
)

# ------------------------------------------------------------------------------------------------------ the tests


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(joins, "JOINS", joins.JOINS)  # the registry as it was, after the test
    monkeypatch.setitem(DISPLAYS, "toy", TOY.display)  # (and the display registry: the same function, removed after)
    joins.register_join(TOY)  # the one registration line
    return TOY


@pytest.fixture(scope="module")
def tiny_dir(tiny_ckpt):
    return tiny_ckpt  # 2 layers of 6 heads (helpers.llama_like)


@pytest.fixture(scope="module")
def rep(tiny_dir):
    return tli.idempotence_report(tiny_dir, threshold=0.0, progress=False)  # every head closed: all in the JSON


def _norms(tiny_dir, power):
    want = {}
    for lh in tli.head_source(tiny_dir):
        for h in range(lh.O.shape[0]):
            want[f"L{lh.layer}H{h}"] = float(np.linalg.norm(lh.O[h].double().numpy()) ** power)
    return want


def test_the_toy_join_runs_with_its_declared_options(toy, rep, tiny_dir):
    res = rep.join("toy", tiny_dir)  # the declared default power 2
    assert res.summary["power"] == 2
    want = _norms(tiny_dir, 2)
    assert res.table["toy_norm"].to_dict() == pytest.approx(want, rel=1e-12)
    assert rep.join("toy", tiny_dir, power=1).table["toy_norm"].to_dict() == pytest.approx(_norms(tiny_dir, 1))
    with pytest.raises(OptionError, match="power must be >= 1; got 0"):  # the declared validator
        rep.join("toy", tiny_dir, power=0)
    with pytest.raises(UnknownOptionError, match="power"):
        rep.join("toy", tiny_dir, powr=2)
    with pytest.raises(OptionError, match=r"rep.join\('toy'\) needs a TransformerLens model .* weights only"):
        rep.join("toy")  # the declared identity: no model, none alive
    other, _, _ = llama_like(tiny_dir.parent / "other", n_layers=3)
    with pytest.raises(tli.errors.ReportMismatchError):
        rep.join("toy", other)  # the report's one identity check, by content
    with pytest.raises(OptionError, match=r"no join 'toys'; registered: .*'toy'"):
        rep.join("toys")


def test_the_toy_join_is_on_the_page_in_the_exports_and_in_the_notebook(toy, rep, tiny_dir, tmp_path):
    res = rep.join("toy", tiny_dir)
    page = Path(rep.save_html(tmp_path / "r.html", joins={"toy": res})).read_text()
    assert '<h2 id="toy">Toy: each head&#39;s output norm</h2>' in page and "Heads by norm" in page
    assert f"Toy: the largest norm is {res.summary['max']:.6g}." in page  # its headline sentence
    assert '<a href="#toy">' in page  # listed on the first screen
    rec = json.loads(Path(rep.export(tmp_path / "r.json", joins={"toy": res})).read_text())
    assert rec["toy"] == {"summary": {"power": 2, "n_heads": 12, "max": pytest.approx(res.summary["max"])}}
    by_label = {h["label"]: h["toy_norm"] for h in rec["closed_heads"]}
    assert by_label == pytest.approx(res.table["toy_norm"].to_dict(), rel=1e-12) and len(by_label) == 12
    rep.export(tmp_path / "r.csv", joins={"toy": res})
    t = pd.read_csv(tmp_path / "r.csv").set_index("label")
    assert t["toy_norm"].to_dict() == pytest.approx(res.table["toy_norm"].to_dict(), rel=1e-12)
    assert res._repr_html_() == "<div><b>ToyNorms</b> of 12 heads (power 2)</div>"  # its registered display
    with pytest.raises(OptionError, match="not of this report's heads"):  # its fits: another report's refused
        rep.export(tmp_path / "x.json", joins={"toy": ToyNorms(res.table.iloc[:3], res.summary)})
    with pytest.raises(OptionError, match=r"unknown join\(s\) \['toys'\]"):
        rep.save_html(tmp_path / "x.html", joins={"toys": res})
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "x.html").exists()


def test_the_toy_join_is_on_the_command_line(toy, tiny_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    assert "--toy-flag" in capsys.readouterr().out
    argv = ["report", str(tiny_dir), "--threshold", "0", "--toy-flag", "--quiet"]
    assert cli.main([*argv, "--json", "--csv", str(tmp_path / "h.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    want = _norms(tiny_dir, 2)
    assert out["toy"]["summary"]["power"] == 2 and out["toy"]["summary"]["max"] == pytest.approx(max(want.values()))
    assert {h["label"]: h["toy_norm"] for h in out["closed_heads"]} == pytest.approx(want, rel=1e-12)
    assert pd.read_csv(tmp_path / "h.csv").set_index("label")["toy_norm"].to_dict() == pytest.approx(want)
    assert cli.main([*argv, "--out", str(tmp_path / "p.html")]) == 0
    assert f"toy: the largest norm is {max(want.values()):.6g}" in capsys.readouterr().out  # its text
    assert '<h2 id="toy">' in (tmp_path / "p.html").read_text()


def test_without_the_registration_the_toy_is_nowhere(rep, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    assert "--toy-flag" not in capsys.readouterr().out
    with pytest.raises(OptionError, match="no join 'toy'"):
        rep.join("toy")
    assert "toy" not in DISPLAYS


# ------------------------------------------------------------------------------ the built-in joins' declarations


def _signature_defaults(fn) -> dict:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("roles", tli.IdempotenceReport.roles),
        ("mechanism", tli.IdempotenceReport.mechanism),
        ("circuit", tli.IdempotenceReport.circuit),
        ("attention", tli.IdempotenceReport.show_attention),
        ("causal", tli.IdempotenceReport.causal),
    ],
)
def test_each_methods_defaults_are_its_declarations(name, method):
    spec = joins.join_spec(name)
    shown = _signature_defaults(method)
    assert spec.options and {o.name: shown[o.name] for o in spec.options} == spec.defaults()
    for o in spec.options:  # (those that import torch are not checked at declaration)
        assert o.validate(o.default) == o.default


def test_the_page_options_and_the_probes_state_the_declared_defaults():
    from tl_idempotence.report.export import report_output

    attention = joins.join_spec("attention").defaults()
    assert _signature_defaults(tli.IdempotenceReport.save_html)["max_tokens"] == attention["max_tokens"]
    assert _signature_defaults(report_output)["max_tokens"] == attention["max_tokens"]
    mech = joins.join_spec("mechanism").defaults()
    probes = {**_signature_defaults(tli.head_tokens), **_signature_defaults(tli.attended_token_effect)}
    assert {k: probes[k] for k in ("n_tokens", "k", "seq_len", "max_tokens", "batch_size")} == {
        k: mech[k] for k in ("n_tokens", "k", "seq_len", "max_tokens", "batch_size")
    }


def test_the_registry_lists_each_join_once_in_order():
    assert [s.name for s in joins.JOINS] == ["attention", "roles", "mechanism", "circuit", "ablation", "causal"]
    flags = [s.cli.flag for s in joins.JOINS if s.cli is not None]
    assert flags == ["--attention-text", "--roles", "--mechanism", "--causal"]
    for s in joins.JOINS:  # every result type's display: the views' own (report, ablation, mechanism) or generic
        kind = s.result().display_kind if hasattr(s.result(), "display_kind") else "result"
        assert kind == "result" or kind in DISPLAYS, s.name


def _spec(**changes):
    fields = dict(name="t", call="rep.join('t')", result=lambda: object, run=lambda rep: None)
    return JoinSpec(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(name="summary"), "the JSON export already has the key 'summary'"),
        (dict(name="not a name"), "public identifier"),
        (dict(run=None), "run must be a function"),
        (dict(options=(1,)), "options must be a tuple of OptionSpec"),
        (dict(model="exact"), "model must be one of"),
        (dict(page=lambda rep, v: {}), "declares fits"),
        (dict(cli="--t"), "cli must be a JoinFlag"),
        (dict(display=lambda r: ""), "display_kind of its result type"),
    ],
)
def test_a_declaration_that_cannot_run_is_refused(changes, match):
    with pytest.raises(RegistrationError, match=match):
        _spec(**changes)


def test_the_registry_refuses_a_taken_name_flag_or_display(monkeypatch):
    monkeypatch.setattr(joins, "JOINS", joins.JOINS)
    with pytest.raises(RegistrationError, match="its name 'roles' belongs to join 'roles'"):
        joins.register_join(_spec(name="roles"))
    flag = JoinFlag("--roles", "again", compute=lambda *a: None)
    with pytest.raises(RegistrationError, match="its flag --roles belongs to join 'roles'"):
        joins.register_join(_spec(cli=flag))
    with pytest.raises(RegistrationError, match="already draws it"):
        joins.register_join(_spec(display=lambda r: "", display_kind="mechanism"))
    with pytest.raises(RegistrationError, match="takes a JoinSpec"):
        joins.register_join("roles")
    assert [s.name for s in joins.JOINS] == ["attention", "roles", "mechanism", "circuit", "ablation", "causal"]
    with pytest.raises(RegistrationError, match="'--bad flag'"):
        JoinFlag("--bad flag", "x", compute=lambda *a: None)
    with pytest.raises(RegistrationError, match="other than 'result'"):
        register_display("result", lambda r: "")


def test_joins_of_the_wrong_type_are_refused(rep, tmp_path):
    with pytest.raises(OptionTypeError, match="joins must be a mapping"):
        rep.save_html(tmp_path / "x.html", joins=[("roles", None)])
    with pytest.raises(OptionError, match="has no page section or export"):
        rep.export(tmp_path / "x.json", joins={"circuit": object()})
    with pytest.raises(OptionTypeError, match="roles must be the RoleAssociation"):
        rep.export(tmp_path / "x.json", joins={"roles": object()})
