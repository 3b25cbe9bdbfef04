"""core.lazy.Lazy: a module's attribute named by strings, imported on first use."""

from __future__ import annotations

import pytest

from tl_idempotence.core.lazy import Lazy
from tl_idempotence.errors import OptionTypeError


def test_a_lazy_reference_loads_and_calls_its_attribute():
    ref = Lazy("tl_idempotence.core.selection", "head_labels")
    from tl_idempotence.core.selection import head_labels

    assert ref.load() is head_labels
    assert list(ref([10, 0], [8, 3])) == ["L10H8", "L0H3"]
    assert repr(ref) == "Lazy('tl_idempotence.core.selection:head_labels')"


def test_a_lazy_reference_fails_on_use_naming_what_is_missing():
    with pytest.raises(ModuleNotFoundError, match=r"tl_idempotence\.no_such_module"):
        Lazy("tl_idempotence.no_such_module", "X").load()
    with pytest.raises(AttributeError, match="no_such_name"):
        Lazy("tl_idempotence.core.selection", "no_such_name")()


@pytest.mark.parametrize(("module", "name"), [("", "X"), ("tl_idempotence", None), (3, "X")])
def test_a_lazy_reference_of_no_name_is_refused(module, name):
    with pytest.raises(OptionTypeError, match=r"a lazy reference's (module|name) must be a non-empty str"):
        Lazy(module, name)
