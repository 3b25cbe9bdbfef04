"""The command line shows a join's progress bars (``--roles``, ``--mechanism`` once it takes ``progress``) on
stderr, and none with ``--quiet``: :meth:`JoinFlag.run` passes ``progress`` to a ``compute`` that takes it, and a
join whose method shows bars declares a ``compute`` that passes them on (so a join given ``progress=`` in Python is
never silent on the command line)."""

from __future__ import annotations

import inspect

import pytest

import tl_idempotence as tli
from tl_idempotence import cli
from tl_idempotence.report import joins
from tl_idempotence.report.join_spec import JoinFlag, JoinSpec

pytestmark = pytest.mark.bridge  # checkpoint files only

SEEN: list[dict] = []


def _compute(rep, model, value, joined, args, progress=True):
    SEEN.append({"progress": progress, "seed": args.seed})
    return None


def _spec(compute) -> JoinSpec:
    flag = JoinFlag("--bar-toy", "a toy that records the progress it was given", compute=compute,
                    progress="tl-idempotence: the toy...")  # fmt: skip
    return JoinSpec(name="bar_toy", call="rep.join('bar_toy')", result=lambda: object, run=lambda rep: None, cli=flag)


@pytest.fixture
def register(monkeypatch):
    monkeypatch.setattr(joins, "JOINS", joins.JOINS)  # the registry as it was, after the test

    def add(compute) -> None:
        joins.register_join(_spec(compute))

    SEEN.clear()
    return add


def test_the_cli_passes_progress_to_a_join_that_takes_it(register, tiny_ckpt, capsys):
    register(_compute)
    assert cli.main(["report", str(tiny_ckpt), "--bar-toy", "--json", "--seed", "3"]) == 0
    assert "tl-idempotence: the toy..." in capsys.readouterr().err
    assert cli.main(["report", str(tiny_ckpt), "--bar-toy", "--json", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert SEEN == [{"progress": True, "seed": 3}, {"progress": False, "seed": 0}]


def test_a_compute_without_progress_is_called_without_it(register, tiny_ckpt, capsys):
    register(lambda rep, model, value, joined, args: SEEN.append({"seed": args.seed}))
    assert cli.main(["report", str(tiny_ckpt), "--bar-toy", "--json", "--quiet"]) == 0
    assert SEEN == [{"seed": 0}]
    flag = _spec(lambda rep, model, value, joined, args, **kw: None).cli
    assert flag is not None and flag.takes_progress  # **kwargs takes it too


def _takes_progress(fn) -> bool:
    return "progress" in inspect.signature(fn).parameters


@pytest.mark.parametrize("spec", [s for s in joins.JOINS if s.cli is not None], ids=lambda s: s.name)
def test_a_join_that_shows_bars_shows_them_on_the_command_line(spec):
    method = getattr(tli.IdempotenceReport, spec.name, None)
    shows_bars = _takes_progress(spec.run) or (method is not None and _takes_progress(method))
    assert spec.cli.takes_progress == shows_bars, (
        f"{spec.call} takes progress={shows_bars}, its --{spec.cli.dest} compute {spec.cli.takes_progress}: give "
        "JoinFlag.compute a progress keyword and pass it on"
    )
    if spec.name == "roles":  # the one on main today (rep.mechanism's is coming)
        assert shows_bars
