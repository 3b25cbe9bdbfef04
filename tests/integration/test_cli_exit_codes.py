"""The CLI's exit codes, table-driven: usage errors, files that lie, the device and the report flags.

0 success; 2 bad arguments — every value is checked before any work starts; 1 failure with a one-line
reason and no traceback. Each case runs the real command in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import llama_like

# integration tier: every case starts the CLI in a fresh process
pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "tl_idempotence.cli"]


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_ckpt):
    import shutil

    d = tmp_path_factory.mktemp("broken") / "tiny"
    shutil.copytree(tiny_ckpt, d)
    shard = sorted(d.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    return d


def run(args, cwd=None, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


USAGE = [  # (argv, a fragment the message must contain): exit 2, before any work
    ([], "COMMAND"),
    (["report", "--nul", "3"], "unrecognized arguments: --nul (--nul: did you mean --nulls"),  # no prefix matching
    (["report", "--thresold", "0.5"], "(--thresold: did you mean --threshold?)"),
    (["sweep", "a", "--out", "o", "--worker", "2"], "did you mean --workers or --worker-timeout?"),
    (["report", "--json", "--attention-text", "hi"], "--attention-text adds attention views to the HTML page"),
    (["report", "--seed", "-1"], "--seed: must be >= 0"),
    (["report", "--seed", "1.5"], "--seed: not an integer"),
    (["report", "--threshold", "1.5"], "must be in [0, 1]"),
    (["report", "--threshold", "nan"], "must be in [0, 1]"),
    (["report", "--threshold", "x"], "not a number"),
    (["report", "--nulls", "-1"], "--nulls: must be >= 0"),
    (["report", "--nulls", "1.7"], "--nulls: not an integer"),
    (["report", "--layers", ""], "empty item"),
    (["report", "--layers", "3-1"], "bad layer range"),
    (["report", "--layers", "a"], "not a layer index"),
    (["report", "--layers", "1,1"], "given twice"),
    (["report", "--layers", "0-1000000000"], "layer indices are at most 65535"),  # never expanded
    (["report", "--layers", "0-200000"], "layer indices are at most 65535"),
    (["report", "--layers", "70000"], "layer indices are at most 65535"),
    (["report", "--csv", "x.html", "--out", "./x.html"], "name the same file"),
    (["report", "--out", "/nonexistent-tli/x.html"], "--out: the folder /nonexistent-tli does not exist"),
    (["report", "--csv", "/nonexistent-tli/x.csv"], "--csv: the folder /nonexistent-tli does not exist"),
    (["report", "--out", "/tmp"], "is a folder"),
    (["report", "--compute-dtype", "int64"], "invalid choice"),
    (["report", "--processing", "folded"], "invalid choice"),
    (["report", "--device", "cuda"], "CUDA is not available"),
    (["report", "--device", "banana"], "not a device name"),
    (["report", "zoo:nope"], "Unknown zoo model 'nope'"),
    (["report", "./no-such-folder"], "no such file or folder"),
    (["report", "/no/such/file.gguf"], "no such file or folder"),
    (["fetch", "nope"], "unknown zoo model 'nope'"),
    (["fetch", "smollm2-135m", "--source", "/nonexistent-tli.whl"], "no such file or folder"),
    (["sweep"], "ITEM"),
    (["sweep", "a"], "--out"),
    # empty strings are never the current folder
    (["report", "--out", ""], "--out: must not be empty"),
    (["report", "--csv", " "], "--csv: must not be empty"),
    (["report", "--resume", ""], "--resume: must not be empty"),
    (["report", "--resume", "/nonexistent-tli/parts"], "--resume: the folder /nonexistent-tli does not exist"),
    (["report", ""], "MODEL: must not be empty"),
    (["sweep", "smollm2-135m", "--out", ""], "--out: must not be empty"),
    (["sweep", "", "--out", "x"], "ITEM: must not be empty"),
    (["sweep", "smollm2-135m", "--out", "/nonexistent-tli/sw"], "--out: the folder /nonexistent-tli does not exist"),
    (["fetch", "smollm2-135m", "--source", ""], "--source: must not be empty"),
]


@pytest.mark.parametrize("argv,fragment", USAGE, ids=[" ".join(a) or "<none>" for a, _ in USAGE])
def test_bad_arguments_exit_2_before_any_work(argv, fragment, tmp_path):
    if "CUDA is not available" in fragment:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    proc = run(argv, cwd=tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert fragment in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "report.html").exists()
    assert not list(tmp_path.iterdir())  # nothing written, not even resume parts in the current folder


def test_path_only_flags_and_runtime_option_errors_exit_2(tiny_ckpt, tmp_path):
    for argv, fragment in [
        ([str(tiny_ckpt), "--processing", "tl"], "apply to zoo models"),
        ([str(tiny_ckpt), "--cls", "hooked"], "apply to zoo models"),
        ([str(tiny_ckpt), "--attention-text", "hello"], "needs a model TransformerLens can run"),
        ([str(tiny_ckpt), "--attention-text", "  "], "must not be empty"),
        ([str(tiny_ckpt), "--layers", "7"], "Unknown layer index [7]"),  # checked against the model's layers
    ]:
        proc = run(["report", *argv, "--out", str(tmp_path / "r.html"), "--quiet"])
        assert proc.returncode == 2, (argv, proc.stderr)
        assert fragment in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "r.html").exists()


def test_a_layer_range_error_is_one_short_line(tiny_ckpt, tmp_path):
    """``--layers 0-65535`` on a 2-layer model: the unknown indices are summarized (was a 448 KB line)."""
    proc = run(["report", str(tiny_ckpt), "--layers", "0-65535", "--json", "--quiet"], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Unknown layer index [2..65535] (65,534 indices): this model's attention layers are 0..1" in proc.stderr
    assert len(proc.stderr) < 300, len(proc.stderr)
    proc = run(["report", str(tiny_ckpt), "--layers", "1,3,5,7,9,11,13,15,17", "--json", "--quiet"], cwd=tmp_path)
    assert proc.returncode == 2 and "Unknown layer index [3, 5, 7, 9, 11, 13, ...] (8 indices)" in proc.stderr


def sha256s(d: Path) -> dict[str, str]:
    import hashlib

    files = sorted(p for p in d.rglob("*") if p.is_file())
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_an_output_never_replaces_an_input(tmp_path):
    """An output over an input would destroy it (``report CK --out CK/model.safetensors`` would write the page over
    the weights it measured, ``--csv CK/config.json`` the CSV over the config). Every output over a file the run
    reads (by its path, a symbolic link or a hard link; the checkpoint's files, a resume folder's parts) exits 2
    before anything is read, naming both; the checkpoint's files stay byte-identical."""
    ck, _, _ = llama_like(tmp_path / "CK", n_layers=2)
    shard = sorted(ck.glob("*.safetensors"))[0]
    (tmp_path / "to_shard").symlink_to(shard)
    (tmp_path / "to_config").symlink_to(ck / "config.json")
    os.link(ck / "model.safetensors.index.json", tmp_path / "index_link.json")
    parts = tmp_path / "parts"
    assert run(["report", str(ck), "--resume", str(parts), "--json", "--quiet"]).returncode == 0
    before, parts_before = sha256s(ck), sha256s(parts)
    for argv, says in [
        (["--out", str(shard)], f"--out {shard} is a file of the checkpoint {ck}"),
        (["--csv", str(ck / "config.json")], f"--csv {ck / 'config.json'} is a file of the checkpoint {ck}"),
        (["--out", "to_shard"], f"--out to_shard is a symbolic link to {shard}, a file of the checkpoint {ck}"),
        (["--csv", "to_config", "--json"], f"is a symbolic link to {ck / 'config.json'}"),
        (["--out", "index_link.json"], f"is the same file (a hard link) as {ck / 'model.safetensors.index.json'}"),
        (["--resume", str(ck)], f"--resume {ck} is the checkpoint {ck}"),
        (["--resume", str(parts), "--csv", str(parts / "manifest.json")], f"a file of the resume folder {parts}"),
        (["--out", str(ck)], "is a folder"),  # argparse's own check comes first
    ]:
        proc = run(["report", str(ck), *argv, "--quiet"], cwd=tmp_path)
        assert proc.returncode == 2, (argv, proc.returncode, proc.stderr)
        assert says in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert sha256s(ck) == before and sha256s(parts) == parts_before
    assert not (tmp_path / "report.html").exists()
    # refused before anything is read: a checkpoint whose shard is truncated (reading it exits 1) still exits 2
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ck.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / shard.name).write_bytes(shard.read_bytes()[:-100])
    proc = run(["report", str(bad), "--csv", str(bad / "config.json"), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 2 and f"a file of the checkpoint {bad}" in proc.stderr, proc.stderr
    assert (bad / "config.json").read_bytes() == (ck / "config.json").read_bytes()
    # a new file beside the checkpoint replaces nothing
    proc = run(["report", str(ck), "--out", str(ck / "report.html"), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {k: v for k, v in sha256s(ck).items() if k != "report.html"} == before


def test_sweep_outputs_never_replace_an_items_files(tmp_path):
    """``sweep --out`` into an item's checkpoint, ``--html`` over an item's file or the sweep's own plan: exit 2."""
    ck, _, _ = llama_like(tmp_path / "CK", n_layers=2)
    before = sha256s(ck)
    out = tmp_path / "out"
    for argv, says in [
        (["--out", str(ck)], f"--out {ck} is the checkpoint {ck}"),
        (["--out", str(out), "--html", str(ck / "config.json")], f"a file of the checkpoint {ck}"),
    ]:
        proc = run(["sweep", str(ck), *argv, "--quiet"], cwd=tmp_path)
        assert proc.returncode == 2 and says in proc.stderr, (argv, proc.stderr)
    assert sha256s(ck) == before and not out.exists()
    assert run(["sweep", str(ck), "--out", str(out), "--task-index", "0", "--quiet"]).returncode == 0
    plan = (out / "sweep.json").read_bytes()
    proc = run(["sweep", str(ck), "--out", str(out), "--collect", "--html", str(out / "sweep.json")], cwd=tmp_path)
    assert proc.returncode == 2 and f"a file of the sweep folder {out}" in proc.stderr, proc.stderr
    assert (out / "sweep.json").read_bytes() == plan
    proc = run(["sweep", str(ck), "--out", str(tmp_path / "nowhere"), "--collect"], cwd=tmp_path)
    assert proc.returncode == 2 and "is not a folder: no sweep to read there" in proc.stderr, proc.stderr


def test_local_folder_named_like_a_zoo_model_is_not_silently_replaced(tmp_path):
    (tmp_path / "minilm-l6").mkdir()
    proc = run(["report", "minilm-l6", "--out", "r.html"], cwd=tmp_path)
    assert proc.returncode == 2 and "both a zoo model name and an existing path" in proc.stderr
    assert "./minilm-l6" in proc.stderr and "zoo:minilm-l6" in proc.stderr


def test_failures_exit_1_with_one_line(broken, tmp_path):
    proc = run(["report", str(broken), "--out", str(tmp_path / "r.html"), "--quiet"])
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tl-idempotence: error:"), proc.stderr
    assert "model-00001-of-00003.safetensors" in lines[0] or ".safetensors" in lines[0]
    proc = run(["report", "some-org/some-model", "--out", str(tmp_path / "r.html")])
    assert proc.returncode == 1 and "HF_HUB_OFFLINE is set" in proc.stderr and "Traceback" not in proc.stderr


def test_success_layers_csv_and_json(tiny_ckpt, tmp_path):
    out, csv = tmp_path / "r.html", tmp_path / "h.csv"
    proc = run(["report", str(tiny_ckpt), "--out", str(out), "--csv", str(csv), "--layers", "1", "--json", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["summary"]["n_heads"] == 6 and data["summary"]["options"]["layers"] == [1]
    assert isinstance(data["closed_heads"], list)
    assert out.stat().st_size > 100_000  # plotly.js and the tables are inlined
    import pandas as pd

    h = pd.read_csv(csv)
    assert list(h["label"]) == [f"L1H{i}" for i in range(6)] and (h["layer"] == 1).all()


def test_closed_stdout_pipe_is_quiet(tiny_ckpt, tmp_path):
    """`tl-idempotence report ... | head -1` must not print a BrokenPipeError."""
    cmd = " ".join([*CLI, "report", str(tiny_ckpt), "--out", str(tmp_path / "r.html"), "--quiet"]) + " | head -1"
    proc = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert len(proc.stdout.splitlines()) == 1
    assert "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "r.html").is_file()


def test_help_and_argument_errors_import_no_torch():
    code = (
        "import sys; from tl_idempotence.cli import main\n"
        "for argv in (['--help'], ['report', '--nul', '1'], ['report', '--seed', '-1']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print('torch' in sys.modules, 'pandas' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip().splitlines()[-1] == "False False", proc.stdout + proc.stderr


def test_report_job_imports_only_what_it_uses(tiny_ckpt, tmp_path):
    """The main job's path (a checkpoint report and its page) never imports sympy, transformer_lens or
    transformers: torch.broadcast_shapes' first call imports sympy (~0.5 s), so core uses numpy's rule."""
    code = (
        "import sys; from tl_idempotence.cli import main\n"
        f"main(['report', {str(tiny_ckpt)!r}, '--out', {str(tmp_path / 'r.html')!r}, '--quiet'])\n"
        "print(sorted(m for m in ('sympy', 'transformer_lens', 'transformers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


def test_console_script_freezes_the_gc_and_main_does_not(tiny_ckpt, tmp_path):
    """The console script keeps torch's ~10^5 objects frozen (gc.freeze) so the interpreter's exit
    collections skip them (~0.5 s a run); main() called in a caller's process unfreezes on return."""
    from importlib.metadata import entry_points

    (ep,) = entry_points(group="console_scripts", name="tl-idempotence")
    assert ep.value == "tl_idempotence.cli:console_main"
    argv = ["report", str(tiny_ckpt), "--out", str(tmp_path / "r.html"), "--quiet"]
    code = (
        "import gc, sys; from tl_idempotence.cli import console_main, main\n"
        f"rc = main({argv!r}); after_main = gc.get_freeze_count()\n"
        f"sys.argv = ['tl-idempotence', *{argv!r}]\n"
        "rc2 = console_main(); print(rc, after_main, rc2, gc.get_freeze_count() > 100_000)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 0 0 True", proc.stdout + proc.stderr
    # a caller that froze objects itself keeps them frozen (not unfrozen by main), on success and on a
    # usage error; the count only drops by frozen objects that refcounting freed meanwhile
    code = (
        "import gc; from tl_idempotence.cli import main\n"
        "gc.freeze(); n = gc.get_freeze_count()\n"
        f"rc = main({argv!r}); kept = gc.get_freeze_count() > n // 2\n"
        "try:\n    main(['report', '--seed', '-1'])\nexcept SystemExit as e:\n    rc2 = e.code\n"
        "print(rc, kept, rc2, gc.get_freeze_count() > n // 2, n > 1000)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip().splitlines()[-1] == "0 True 2 True True", proc.stdout + proc.stderr


def test_models_lists_the_zoo():
    proc = run(["models"])
    assert proc.returncode == 0 and "smollm2-135m" in proc.stdout and "minilm-l6" in proc.stdout
    assert "verifies the cached files" in proc.stdout


def test_out_folder_check_happens_before_reading_the_model(tmp_path):
    """A bad --out fails in well under the time a report takes (no model is read)."""
    proc = run(["report", "smollm2-135m", "--out", str(tmp_path / "missing" / "r.html")])
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert Path(tmp_path / "missing").exists() is False


def test_huge_layer_range_is_refused_before_anything_is_allocated(tmp_path):
    """0.2 expanded the range and de-duplicated it quadratically (OOM-killed after ~30 s)."""
    # the expansion never finished: a hang or an OOM kill shows as TimeoutExpired or a signal's return code
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [*CLI, "report", "--layers", "0-1000000000"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert proc.returncode == 2 and "at most 65535" in proc.stderr


def test_version_prints_the_package_version():
    from importlib.metadata import version

    proc = run(["--version"])
    assert proc.returncode == 0 and proc.stdout.strip() == f"tl-idempotence {version('tl_idempotence')}"


def test_the_cli_writes_only_what_was_asked_and_no_machine_path(tiny_ckpt, tmp_path):
    """--json in an empty folder: JSON on stdout, no page beside it; no absolute path (of the checkpoint, the
    cache or the home folder) in the JSON or the page; a page written over an existing file says so."""
    work = tmp_path / "work"
    work.mkdir()
    proc = run(["report", str(tiny_ckpt), "--json", "--quiet"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert list(work.iterdir()) == []  # no report.html
    data = json.loads(proc.stdout)
    for secret in (str(tiny_ckpt), str(tmp_path), os.path.expanduser("~")):
        assert secret not in proc.stdout, secret
    assert data["summary"]["processing"]["path"] == tiny_ckpt.name
    proc = run(["report", str(tiny_ckpt), "--csv", "h.csv", "--quiet"], cwd=work)
    assert proc.returncode == 0 and sorted(p.name for p in work.iterdir()) == ["h.csv"]
    proc = run(["report", str(tiny_ckpt), "--quiet"], cwd=work)  # nothing asked: the page, as always
    assert proc.returncode == 0 and (work / "report.html").exists()
    assert "wrote report.html" in proc.stdout and "replaced" not in proc.stdout
    page = (work / "report.html").read_text(encoding="utf-8")
    for secret in (str(tiny_ckpt), str(tmp_path), os.path.expanduser("~") + "/"):
        assert secret not in page, secret
    proc = run(["report", str(tiny_ckpt), "--quiet", "--json", "--out", "report.html"], cwd=work)
    assert proc.returncode == 0 and "replaced the file that was there" in proc.stderr
    json.loads(proc.stdout)  # stdout stays the JSON alone


def test_an_output_into_a_zoo_models_cache_folder_exits_2(tmp_path):
    """``report minilm-l6 --out <cache>/minilm-l6/files/r.html`` is refused, though it writes a new file beside the
    checkpoint: ``files/`` is the zoo's own checkpoint folder (a ``.json`` there is read with it) and ``fetch
    --force`` deletes it. Every CLI output into a zoo model's cache folder (whatever model the run reads, through a
    symbolic link too) exits 2 with one error line naming the folder, before anything is read or written."""
    cache = tmp_path / "cache"
    files = cache / "minilm-l6" / "files"
    files.mkdir(parents=True)
    (files / "config.json").write_text("{}")  # not a loadable model: reading it would exit 1, not 2
    (tmp_path / "link").symlink_to(files)
    ck, _, _ = llama_like(tmp_path / "CK", n_layers=2)
    env = {"TL_IDEMPOTENCE_CACHE": str(cache)}
    for argv, flag, path, folder in [
        (["report", "minilm-l6", "--out"], "--out", files / "r.html", files),
        (["report", "minilm-l6", "--json", "--csv"], "--csv", files / "t.csv", files),
        (["report", str(ck), "--out"], "--out", files / "model.safetensors.index.json", files),
        (["report", str(ck), "--out"], "--out", tmp_path / "link" / "r.html", files),
        (["report", str(ck), "--json", "--resume"], "--resume", cache / "minilm-l6" / "parts", cache / "minilm-l6"),
        (["sweep", str(ck), "--out"], "--out", cache / "minilm-l6" / "attention", cache / "minilm-l6"),
    ]:
        proc = run([*argv, str(path), "--quiet"], cwd=tmp_path, env_extra=env)
        assert proc.returncode == 2, (argv, proc.returncode, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert errors == [
            f"{proc.stderr.splitlines()[-1].split(': error: ')[0]}: error: {flag} {path} is in the zoo cache's folder "
            f"{folder}, which the library verifies, reads and deletes (fetch --force): write the output elsewhere"
        ], proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert sorted(p.name for p in cache.rglob("*")) == ["config.json", "files", "minilm-l6"]
    # the cache folder itself holds no model: an output there (not in a zoo model's folder) is allowed
    proc = run(["report", str(ck), "--out", str(cache / "r.html"), "--quiet"], cwd=tmp_path, env_extra=env)
    assert proc.returncode == 0 and (cache / "r.html").is_file(), proc.stderr
