"""The CLI's outputs go through the output registry: ``--out`` writes the format its extension names,
``--csv`` writes CSV, ``--json`` prints the JSON export (NaN as null); another extension exits 2 naming the known
ones, before any model is read."""

from __future__ import annotations

import json
import os
import sys
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


@pytest.fixture(scope="module")
def ck1(tmp_path_factory):
    return str(llama_like(tmp_path_factory.mktemp("stdout") / "CK", n_layers=1)[0])


def test_data_on_stdout_is_the_data_alone(ck1, tmp_path, monkeypatch, capfd):
    """``--csv /dev/stdout``: file descriptor 1 gets the heads table alone, the summary and what was written go to
    stderr; ``--json --out /dev/stdout`` writes the one JSON export once; two outputs to stdout exit 2."""
    monkeypatch.chdir(tmp_path)
    rep = tli.idempotence_report(ck1, progress=False)
    assert cli.main(["report", ck1, "--csv", "/dev/stdout", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert out == rep.heads.to_csv(index=True, index_label="label")
    assert rep.headline in err and err.rstrip().endswith("tl-idempotence: wrote /dev/stdout"), err
    assert cli.main(["report", ck1, "--json", "--out", "/dev/stdout", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out) == json.loads(Path(rep.export(tmp_path / "r.json")).read_text())
    assert err == "tl-idempotence: wrote /dev/stdout\n"
    assert cli.main(["report", ck1, "--csv", "h.csv", "--quiet"]) == 0  # no data on stdout: the summary there
    out, err = capfd.readouterr()
    assert rep.headline in out and out.rstrip().endswith("wrote h.csv") and err == ""
    for argv in (["--json", "--csv", "/dev/stdout"], ["--out", "/dev/stdout", "--csv", "/dev/fd/1"]):
        assert _exit(["report", ck1, *argv, "--quiet"]) == 2
        out, err = capfd.readouterr()
        assert out == "" and "both write to standard output, where their data would mix" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.csv", "r.json"]


def test_an_output_that_is_the_file_stdout_is_redirected_to(ck1, tmp_path, capfd):
    """``--csv f.csv > f.csv``: the same file by device and inode, so stdout is data; f.csv is the table alone."""
    f = tmp_path / "f.csv"
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # what a shell's > does
    os.dup2(fd, 1)
    os.close(fd)
    try:
        code = cli.main(["report", ck1, "--csv", str(f), "--quiet"])
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    _, err = capfd.readouterr()
    assert code == 0 and "heads are closed" in err and "tl-idempotence: wrote" in err, err
    table = pd.read_csv(f)
    assert list(table.columns[:3]) == ["label", "layer", "head"] and len(table) == 6
    assert f.read_text() == tli.idempotence_report(ck1, progress=False).heads.to_csv(index_label="label")


def test_a_library_that_prints_while_the_run_goes_on_prints_to_stderr(ck1, monkeypatch, capfd):
    """TransformerLens's loaders print ("Loaded pretrained model ..."): with data on stdout, to stderr."""
    import tl_idempotence.report.report as report_module

    real = report_module.idempotence_report

    def chatty(*a, **kw):
        print("Loaded pretrained model tiny into HookedTransformer")
        return real(*a, **kw)

    monkeypatch.setattr(report_module, "idempotence_report", chatty)
    assert cli.main(["report", ck1, "--csv", "/dev/stdout", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert out.startswith("label,layer,head,") and "Loaded" not in out and "Loaded pretrained model" in err
    assert cli.main(["report", ck1, "--csv", "/dev/null", "--quiet"]) == 0  # stdout not data: left alone
    assert "Loaded pretrained model" in capfd.readouterr().out
