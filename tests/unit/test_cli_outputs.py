"""The CLI's outputs go through the output registry: ``--out`` writes the format its extension names,
``--csv`` writes CSV, ``--json`` prints the JSON export (NaN as null); another extension exits 2 naming the known
ones, before any model is read."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import tl_idempotence as tli
from helpers import llama_like
from tl_idempotence import cli

pytestmark = pytest.mark.bridge  # checkpoint files only


def _exit(argv) -> int:
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    return int(ei.value.code)


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--out", "r.txt"], "--out r.txt has the extension '.txt': can be written as .html or .htm (page), .json"),
        (["--out", "report"], "--out report has no extension"),
        (["--csv", "heads.json"], "--csv heads.json has the extension '.json': can be written as .csv (CSV table);"),
        (["smollm2-135m", "--out", "r.json", "--attention-text", "hi"], "--out r.json is not a page (.html)"),
        (["sweep", "--out", "sw", "--html", "cmp.txt"], "--html cmp.txt has the extension '.txt': can be written as"),
    ],
)
def test_an_unknown_extension_exits_2_before_the_model_is_read(argv, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = str(tmp_path / "no-checkpoint-here")  # reading it would exit 2 with another message, later
    (tmp_path / "no-checkpoint-here").mkdir()
    if argv[0] == "sweep":  # the sweep's page: refused before any item runs
        cmd = ["sweep", missing, *argv[1:]]
    else:  # a zoo model for the attention view (never loaded here), else a folder that is no checkpoint
        cmd = ["report", *([] if argv[0] == "smollm2-135m" else [missing]), *argv]
    assert _exit([*cmd, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-checkpoint-here"]  # no page, no sweep folder


def test_out_csv_and_json_write_what_the_api_writes(tmp_path, monkeypatch, capsys):
    ck, _, _ = llama_like(tmp_path / "CK", n_layers=2)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", str(ck), "--out", "r.parquet", "--csv", "h.csv", "--json", "--quiet"]) == 0
    printed = capsys.readouterr().out
    rep = tli.idempotence_report(str(ck), progress=False)
    pd.testing.assert_frame_equal(pd.read_parquet("r.parquet"), rep.heads.reset_index(names="label"), check_exact=True)
    assert Path("h.csv").read_bytes() == rep.heads.to_csv(index=True, index_label="label").encode()
    assert json.loads(printed) == json.loads(Path(rep.export(tmp_path / "r.json")).read_text())
    assert cli.main(["report", str(ck), "--out", "r2.json", "--quiet"]) == 0
    assert Path("r2.json").read_text() == Path("r.json").read_text()


@pytest.mark.parametrize("flag,name", [("--out", "x.html"), ("--csv", "x.csv"), ("--json", "x.json")])
def test_a_path_ending_in_a_separator_is_refused_by_the_cli_as_by_the_api(flag, name, tmp_path, capsys):
    """``--out x.html/`` once wrote ``x.html`` and exited 0 while ``rep.save_html("x.html/")`` refused it: both now
    ask the one rule (core.outputs.file_path_problem) and refuse it, before any model is read."""
    from tl_idempotence.core.outputs import file_path_problem

    target = str(tmp_path / name) + "/"
    problem = file_path_problem(target)
    assert problem is not None and "ending in a separator" in problem
    if flag != "--json":  # --json prints to stdout: no file argument
        assert _exit(["report", str(tmp_path / "no-model"), flag, target]) == 2
        assert problem in capsys.readouterr().err
    rep = tli.idempotence_report(str(llama_like(tmp_path / "CK", n_layers=1)[0]), progress=False)
    with pytest.raises(tli.errors.OptionError, match="ending in a separator"):
        rep.export(target)
    assert not (tmp_path / name).exists()
