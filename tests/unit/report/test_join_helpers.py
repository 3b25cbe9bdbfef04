"""The helpers the join declarations share (report.join_spec): the seeded CLI call a JoinSpec fills in, the hooks
that read the report's heads and threshold, and the heads a join is asked for."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from tl_idempotence.errors import OptionError, OptionTypeError, RegistrationError
from tl_idempotence.report import join_defaults
from tl_idempotence.report.join_spec import (
    JoinFlag,
    JoinSpec,
    fits_heads,
    page_at_threshold,
    report_heads,
)
from tl_idempotence.report.joins import JOINS


class _Rep:
    """A report stand-in that records the join method's call."""

    heads = pd.DataFrame({"layer": [0, 0, 1, 1]}, index=["L0H0", "L0H1", "L1H0", "L1H1"])
    info = SimpleNamespace(n_heads=2)
    threshold = 0.8

    def toy(self, **kw):
        return ("toy", kw)


def _spec(call="rep.toy", compute=None):
    return JoinSpec(
        name="toy", call=call, result=lambda: object, run=lambda rep: None, cli=JoinFlag("--toy", "x", compute)
    )


def test_a_flag_without_compute_gets_the_plain_seeded_call_of_its_join():
    flag = _spec().cli
    args = SimpleNamespace(seed=7)
    assert flag.takes_progress
    assert flag.run(_Rep(), "m", True, {}, args, progress=False) == ("toy", dict(model="m", seed=7, progress=False))
    given = _spec(compute=lambda rep, model, value, joined, args: "own").cli
    assert given.run(_Rep(), "m", True, {}, args, progress=False) == "own"


def test_the_built_in_seeded_flags_call_their_join():
    for name in ("roles", "causal"):
        (spec,) = [s for s in JOINS if s.name == name]
        rep = SimpleNamespace(**{name: lambda **kw: kw})
        got = spec.cli.run(rep, "m", True, {}, SimpleNamespace(seed=3), progress=False)
        assert got == dict(model="m", seed=3, progress=False)


def test_a_join_without_call_is_the_reports_method_of_its_name():
    plain = JoinSpec(name="toy", result=lambda: object, run=lambda rep: None, cli=JoinFlag("--toy", "x"))
    assert plain.call == "rep.toy"
    assert plain.cli.run(_Rep(), "m", True, {}, SimpleNamespace(seed=1), progress=False)[0] == "toy"
    assert _spec(call="rep.join('toy')", compute=lambda *a: None).call == "rep.join('toy')"
    calls = {s.name: s.call for s in JOINS}
    assert calls == {
        "attention": "rep.show_attention",
        "roles": "rep.roles",
        "mechanism": "rep.mechanism",
        "circuit": "rep.circuit",
        "ablation": "rep.ablation",
        "causal": "rep.causal",
    }
    with pytest.raises(RegistrationError, match="call must be how users call it"):
        _spec(call="")
    with pytest.raises(TypeError):
        JoinSpec("toy", "rep.toy", lambda: object, lambda rep: None)  # keywords only


def test_a_flag_without_compute_needs_a_join_method():
    with pytest.raises(RegistrationError, match=r"its flag --toy needs compute: \"rep.join\('t'\)\" is no method"):
        _spec(call="rep.join('t')")
    with pytest.raises(RegistrationError, match="flag --toy: compute is None"):
        JoinFlag("--toy", "x").run(_Rep(), None, True, {}, None, progress=False)


def test_the_hooks_read_the_reports_heads_and_threshold():
    rep = _Rep()
    assert fits_heads(lambda h, t, v: (list(h.index), t, v))(rep, "r") == (["L0H0", "L0H1", "L1H0", "L1H1"], 0.8, "r")
    assert page_at_threshold(lambda v, t: {"v": v, "t": t})(rep, "r") == {"v": "r", "t": 0.8}


def test_report_heads_are_labels_of_measured_heads_in_order():
    rep = _Rep()
    assert report_heads(rep, None) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert report_heads(rep, [(1, 0), (0, 1), (1, 0)]) == ["L0H1", "L1H0"]
    assert report_heads(rep, ["L1H1"]) == ["L1H1"]
    rep.heads = rep.heads.drop(index="L1H1")  # a head of a measured layer the table lacks
    with pytest.raises(OptionError, match=r"Heads \['L1H1'\] are not heads this report measured."):
        report_heads(rep, [(1, 1), (0, 0)])


def test_the_window_options_state_the_probes_limits():
    from tl_idempotence.probes.tokens import MAX_SEQ_LEN

    assert join_defaults.MAX_SEQ_LEN == MAX_SEQ_LEN  # the declared maximum is the probe's
    causal, mechanism = (next(s for s in JOINS if s.name == n) for n in ("causal", "mechanism"))
    assert (causal.option("seq_len").default, mechanism.option("seq_len").default) == (128, None)
    for spec in (causal, mechanism):
        seq_len, batch = spec.option("seq_len"), spec.option("batch_size")
        assert (seq_len.validate(MAX_SEQ_LEN), batch.validate(1 << 20), batch.default) == (MAX_SEQ_LEN, 1 << 20, 8)
        for option, bad in ((seq_len, 1), (seq_len, MAX_SEQ_LEN + 1), (batch, 0), (batch, (1 << 20) + 1)):
            with pytest.raises(OptionError, match=option.name):
                option.validate(bad)
    assert mechanism.option("seq_len").validate(None) is None
    with pytest.raises(OptionTypeError, match="seq_len"):
        causal.option("seq_len").validate(None)
