"""``tl-idempotence report --roles``: head roles computed on the model the report measured and joined with it.

The zoo route (on the trained lineage) is in tests/integration/test_cli_roles_zoo.py. A checkpoint path has no
model to run: ``--roles`` on it exits 2 before any work, saying why; a report measured from weights only refuses
``rep.roles()`` naming what it was measured from.
"""

from __future__ import annotations

import pytest

import tl_idempotence as tli
from tl_idempotence import cli
from tl_idempotence.errors import OptionError, UnsupportedModelError
from tl_idempotence.testing import tiny_hf_dir

pytestmark = pytest.mark.bridge


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_hf_dir(tmp_path_factory.mktemp("cli_roles") / "tiny", n_layers=2, seed=3)  # 18 heads, 3 kv heads


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    return ei.value.code


def test_roles_on_a_checkpoint_path_exits_2_saying_why(tiny_dir, tmp_path, capsys):
    assert _exit_code(["report", str(tiny_dir), "--roles", "--out", str(tmp_path / "r.html")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "--roles runs TransformerLens's head detector on the model, and a checkpoint path is read as weights only"
        in err
    )
    assert not (tmp_path / "r.html").exists()


def test_roles_flag_in_help(capsys):
    assert _exit_code(["report", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--roles" in out and "seeded by --seed" in out


def test_a_report_from_weights_only_refuses_roles_naming_its_source(tiny_dir):
    rep = tli.idempotence_report(tiny_dir, progress=False)  # a checkpoint path: weights only
    with pytest.raises(OptionError, match=r"needs a TransformerLens model to run .* gives weights only"):
        rep.roles()
    from tl_idempotence.sources.checkpoint import from_path

    with pytest.raises(UnsupportedModelError, match="gives weights only, not a model TransformerLens can run"):
        rep.roles(model=from_path(tiny_dir))  # a bare HeadSource


def test_mechanism_on_a_checkpoint_path_exits_2_saying_why(tiny_dir, tmp_path, capsys):
    assert _exit_code(["report", str(tiny_dir), "--mechanism", "--out", str(tmp_path / "r.html")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--mechanism runs the model on text" in err and "weights only" in err
    assert not (tmp_path / "r.html").exists()
    assert _exit_code(["report", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--mechanism" in out and "sign(α)" in out
