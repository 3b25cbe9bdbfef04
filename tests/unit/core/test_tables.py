"""The frozen-result base and the typed summary records (core/tables.py): a record's fields read as attributes
(typed) and as a mapping (``summary["key"]``, ``dict(summary)``, JSON, equality with a dict), assignment raises,
an unknown key is refused; a result built on FrozenResult refuses assignment and hands out copies of its table."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import pandas as pd
import pytest

from tl_idempotence.core.frozen import FrozenDict
from tl_idempotence.core.heads import ModelInfo
from tl_idempotence.core.tables import FrozenResult, FrozenSummary
from tl_idempotence.errors import OptionError
from tl_idempotence.probes.ablation.result import AblationSummary
from tl_idempotence.probes.roles import HeadRoles, HeadRolesSummary
from tl_idempotence.report.mechanism import MechanismSummary
from tl_idempotence.report.roles import RoleAssociationSummary


class _Base(FrozenSummary):
    __slots__ = ()
    a: int
    b: dict[str, Any] | None


class _Child(_Base):
    __slots__ = ()
    c: str


class _Made(FrozenResult):
    frozen_name = "a made result is"
    settable = frozenset({"loaded_from"})

    def __init__(self, table: pd.DataFrame) -> None:
        self._freeze(_table=table, summary=_Child({"a": 1}), loaded_from=None)


def test_a_record_is_typed_read_only_and_a_mapping():
    s = _Child({"c": "x", "a": 2, "b": {"k": [1, 2]}})
    assert _Child.fields() == ("a", "b", "c")  # the base's fields first
    assert s.a == 2 and s.c == "x" and s["a"] == 2 and list(s) == ["c", "a", "b"]  # the given order
    assert s == {"a": 2, "b": {"k": [1, 2]}, "c": "x"} and isinstance(s, dict)
    assert json.loads(json.dumps(s)) == s.to_dict() and type(s.to_dict()["b"]) is dict
    assert _Child({"a": 1}).b is None and "b" not in _Child({"a": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.a = 3
    with pytest.raises(TypeError):
        s["a"] = 3
    with pytest.raises(TypeError):
        s["b"]["k"].append(3)  # nested values are frozen too
    with pytest.raises(TypeError):
        s.update(a=1)
    with pytest.raises(AttributeError):
        _ = s.d
    with pytest.raises(OptionError, match=r"\['d'\].*_Child"):
        _Child({"a": 1, "d": 2})
    back = pickle.loads(pickle.dumps(s))
    assert type(back) is _Child and back == s
    assert type(copy.deepcopy(s)) is dict and copy.deepcopy(s) == s  # an editable copy


def test_every_results_summary_declares_the_keys_its_producer_writes():
    assert isinstance(HeadRolesSummary({"n_heads": 3}), FrozenDict)
    for cls, key in (
        (HeadRolesSummary, "layer_fingerprints"),
        (RoleAssociationSummary, "p_floor"),
        (MechanismSummary, "n_agree"),
        (AblationSummary, "controls_warning"),
    ):
        assert key in cls.fields()


def test_a_frozen_result_refuses_assignment_and_hands_out_copies():
    r = _Made(pd.DataFrame({"x": [1.0, 2.0]}))
    t = r.table
    t.loc[0, "x"] = 99.0
    assert r.table.loc[0, "x"] == 1.0 and r.heads.equals(r.table)
    with pytest.raises(dataclasses.FrozenInstanceError, match="a made result is immutable"):
        r.summary = {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        del r.summary
    r.loaded_from = "here"  # the one settable name
    assert r.loaded_from == "here"
    roles = HeadRoles(
        table=pd.DataFrame({"layer": [0], "head": [0], "kv_head": [0]}, index=["L0H0"]),
        summary={"model_name": "m", "n_heads": 1},
        info=ModelInfo(1, 1, 1, 4, 4),
    )
    assert type(roles.summary) is HeadRolesSummary and roles.summary.n_heads == 1 and roles.summary.seed is None
    with pytest.raises(dataclasses.FrozenInstanceError, match="head roles are immutable"):
        roles.info = None


def test_model_info_processing_and_extra_are_read_only_and_round_trip():
    info = ModelInfo(2, 4, 2, 16, 4, "m", "c", processing={"fold_ln": True, "files": ["a"]}, extra={"note": "x"})
    with pytest.raises(TypeError):
        info.processing["fold_ln"] = False
    with pytest.raises(TypeError):
        info.processing["files"].append("b")
    with pytest.raises(TypeError):
        info.extra["note"] = "y"
    assert info.processing == {"fold_ln": True, "files": ["a"]} and isinstance(info.extra, dict)
    back = ModelInfo(**json.loads(json.dumps(dataclasses.asdict(info))))
    assert back == info and hash(back.sizes) == hash(info.sizes)
