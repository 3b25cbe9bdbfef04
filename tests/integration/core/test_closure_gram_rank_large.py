"""The Cholesky rank certificate at d_model 4096, r 128 (a big synthetic Gram table: tens of seconds): the same
test as the unit tier's smaller shapes, ``test_gram_rank_equals_the_eigenvalue_rule`` of
tests/unit/core/test_closure.py, run here on the large shape (loaded from that file, so there is one copy)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "unit" / "core" / "test_closure.py"


def _unit_module():
    spec = importlib.util.spec_from_file_location("unit_test_closure", UNIT)
    assert spec is not None and spec.loader is not None, UNIT
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gram_rank_equals_the_eigenvalue_rule_at_4096_by_128():
    _unit_module().test_gram_rank_equals_the_eigenvalue_rule(4096, 128)
