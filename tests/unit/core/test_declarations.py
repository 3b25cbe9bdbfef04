"""A result class declares its summary keys, immutability message, display and summary type as class keywords
(core.results.Result, core.tables.ImmutableResult / FrozenResult): the ClassVars read as a class body would set
them, a keyword left out keeps the base's, and an unknown keyword is refused."""

from __future__ import annotations

import dataclasses

import pytest

from tl_idempotence.core.summaries import FrozenSummary
from tl_idempotence.core.tables import FrozenResult, ImmutableResult
from tl_idempotence.probes.causal import CausalClosure
from tl_idempotence.probes.head_tokens import HeadTokens
from tl_idempotence.probes.token_effect import AttendedTokenEffect
from tl_idempotence.report.result import IdempotenceReport


class _Summary(FrozenSummary):
    __slots__ = ()
    n: int


class _Declared(ImmutableResult, repr_keys="n  m\tk", display_kind="ablation", frozen=("a thing is", "redo it")):
    @property
    def summary(self) -> dict[str, object]:
        return {"n": 1, "k": 2.5, "m": "x", "z": 3}


class _Inherits(_Declared):
    pass


class _Typed(FrozenResult, repr_keys=("n",), summary_type=_Summary):
    pass


def test_keywords_set_the_class_vars() -> None:
    assert _Declared.repr_keys == ("n", "m", "k")
    assert (_Declared.display_kind, _Declared.frozen_name, _Declared.frozen_hint) == (
        "ablation",
        "a thing is",
        "redo it",
    )
    assert repr(_Declared()) == "_Declared(n=1, m='x', k=2.5)"
    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"^cannot assign to 'n': a thing is immutable \(redo it\)\.$"
    ):
        _Declared().n = 2
    assert (_Typed.repr_keys, _Typed.summary_type, _Typed.frozen_name) == (("n",), _Summary, "this result is")


def test_left_out_keywords_inherit() -> None:
    assert "repr_keys" not in _Inherits.__dict__ and "frozen_name" not in _Inherits.__dict__
    assert (_Inherits.repr_keys, _Inherits.frozen_hint, _Inherits.display_kind) == (
        ("n", "m", "k"),
        "redo it",
        "ablation",
    )


def test_unknown_keyword_is_refused() -> None:
    with pytest.raises(TypeError):

        class _Typo(ImmutableResult, frozn=("a", "b")):  # type: ignore[call-arg]
            pass


def test_library_declarations() -> None:
    assert IdempotenceReport.display_kind == "report" and "n_mismatch_closed" not in IdempotenceReport.repr_keys
    assert HeadTokens.repr_keys == ("model_name", "n_heads", "n_tokens", "k", "median_self_rank")
    # a token probe's name in a refusal is its store's name
    assert [c.probe_name for c in (HeadTokens, AttendedTokenEffect, CausalClosure)] == [
        "head_tokens",
        "attended_token_effect",
        "causal_closure",
    ]


def test_a_store_spec_states_its_record_once():
    """A StoreSpec's record is ``<name>.json`` unless it says otherwise, and ``format`` is its first format; every
    stored type's constants read their StoreSpec (issue 45)."""
    from tl_idempotence.core.stored import STORED, StoreSpec
    from tl_idempotence.probes import causal, roles
    from tl_idempotence.probes.ablation import store as ablation_store
    from tl_idempotence.report import roles as role_association  # noqa: F401 (its type in STORED)

    spec = StoreSpec(name="probe_x", formats=("x/2", "x/1"))
    assert (spec.record, spec.format, spec.free_fields) == ("probe_x.json", "x/2", ())
    assert repr(spec) == "StoreSpec(name='probe_x', record='probe_x.json', formats=('x/2', 'x/1'), free_fields=())"
    assert StoreSpec("roles_x", "roles.json", ("r/1",)).record == "roles.json"  # an exception states its own
    with pytest.raises(ValueError, match=r"a StoreSpec needs a name, a \.json record and its formats"):
        StoreSpec(name="probe_x")
    with pytest.raises(ValueError, match="a StoreSpec needs"):
        StoreSpec(name="not a name", formats=("x/1",))
    assert (causal.CAUSAL_RECORD, causal.CAUSAL_FORMAT) == ("causal_closure.json", "tli-causal-closure-1")
    assert (roles.ROLES_RECORD, roles.HEAD_ROLES_FORMAT) == ("roles.json", "tl_idempotence.head_roles/1")
    assert ablation_store.ABLATION_RECORD == "ablation.json"
    assert STORED["ablation"].store is ablation_store.ABLATION_STORE
    assert {n: c.store.record for n, c in STORED.items() if c.store.record != f"{n}.json"} == {
        "head_roles": "roles.json",
        "role_association": "roles.json",
    }


@pytest.mark.parametrize(
    ("base", "keywords", "named"),
    [
        (ImmutableResult, {"frozen": ("only one",)}, "frozen"),
        (ImmutableResult, {"frozen": "ab"}, "frozen"),  # a str of two characters is not (name, hint)
        (ImmutableResult, {"frozen": ("a", "")}, "frozen"),
        (ImmutableResult, {"repr_keys": 5}, "repr_keys"),
        (ImmutableResult, {"repr_keys": ["n", "k"]}, "repr_keys"),  # a list, not the declared tuple
        (ImmutableResult, {"repr_keys": ("n", 5)}, "repr_keys"),
        (ImmutableResult, {"display_kind": 5}, "display_kind"),
        (ImmutableResult, {"display_kind": ""}, "display_kind"),
        (FrozenResult, {"summary_type": 5}, "summary_type"),
        (FrozenResult, {"summary_type": dict}, "summary_type"),
    ],
)
def test_a_bad_class_keyword_is_refused_at_the_class_statement(base, keywords, named) -> None:
    from tl_idempotence.errors import RegistrationError

    with pytest.raises(RegistrationError, match=rf"^class Bad: {named} must be"):
        type("Bad", (base,), {}, **keywords)


def test_a_token_probe_names_itself_by_its_own_store_unless_its_body_says() -> None:
    from tl_idempotence.probes.token_records import TokenResult

    assert type("Sub", (HeadTokens,), {"probe_name": "zz"}).probe_name == "zz"  # the class body wins
    assert type("Sub2", (HeadTokens,), {}).probe_name == "head_tokens"  # inherited
    assert not hasattr(type("NoStore", (TokenResult,), {}), "probe_name")  # no store: nothing to name it by


def test_a_store_spec_record_of_another_type_is_refused() -> None:
    from tl_idempotence.core.stored import StoreSpec

    for bad in (None, 5):
        with pytest.raises(ValueError, match="name and record are str"):
            StoreSpec(name="x", record=bad, formats=("f/1",))  # type: ignore[arg-type]
