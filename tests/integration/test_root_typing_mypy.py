"""A user's script under mypy sees the package's real types through ``import tl_idempotence as tli`` (the root's
``TYPE_CHECKING`` block; tests/unit/test_root_typing.py checks it against the lazy loader): the report, the
model class ``tli.models.load`` gives, head tokens, the errors, and a misspelled name is an error, not ``Any``.

mypy runs in this process (``mypy.api.run``) in strict mode over the script, with the package's own source first
on its path (this checkout's, not an installed copy) and its modules silenced (``follow_imports = silent``: their
types are read, their own errors are the project's mypy run's concern). It reads torch, pandas and
transformer_lens: ~45 s with an empty cache on a loaded 2-core machine, seconds once pytest's cache holds it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import tl_idempotence

mypy_api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")  # CI=1: a failure, not a skip

SCRIPT = """
import tl_idempotence as tli

model = tli.models.load("smollm2-135m", progress=False)
reveal_type(model)
rep = tli.idempotence_report(model, nulls=8)
reveal_type(rep)
reveal_type(tli.compare({"a": rep, "b": rep}))
reveal_type(tli.head_tokens(model))
reveal_type(tli.models.load("smollm2-135m", cls="hooked", device="cpu"))
reveal_type(tli.load_report("folder"))
reveal_type(tli.errors.OptionError)
tli.idempotense_report(model)
tli.idempotence_report(model, threshold="high")
"""


def _mypy_cache(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """pytest's cache folder when the cache plugin is on (a second run takes seconds), else a fresh one."""
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("tli-mypy") if cache is not None else tmp_path / "mypy_cache"


def test_a_users_script_sees_the_real_types_through_the_package_root(request, tmp_path):
    src = Path(tl_idempotence.__file__).resolve().parents[1]
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPT).lstrip(), encoding="utf-8")
    config = tmp_path / "mypy.ini"
    cache = _mypy_cache(request, tmp_path)
    config.write_text(
        f"[mypy]\nstrict = True\nfollow_imports = silent\nmypy_path = {src}\ncache_dir = {cache}\n", encoding="utf-8"
    )
    stdout, stderr, _ = mypy_api.run(["--config-file", str(config), "--no-error-summary", str(script)])
    lines = [re.sub(r"^.*user_script\.py:", "", line) for line in stdout.splitlines()]
    revealed = {
        int(n): t
        for n, t in (re.match(r"(\d+): note: Revealed type is \"(.*)\"$", x).groups() for x in lines if "Revealed" in x)
    }  # type: ignore[union-attr]
    assert revealed == {
        4: "transformer_lens.model_bridge.bridge.TransformerBridge",
        6: "tl_idempotence.report.result.IdempotenceReport",
        7: "tl_idempotence.studies.compare.Comparison",
        8: "tl_idempotence.probes.head_tokens.HeadTokens",
        9: "transformer_lens.HookedTransformer.HookedTransformer",
        10: "tl_idempotence.report.result.IdempotenceReport",
        11: "def (*args: object) -> tl_idempotence.errors.OptionError",
    }, stdout + stderr
    errors = [x for x in lines if ": error:" in x]
    assert len(errors) == 2, stdout + stderr
    assert errors[0].startswith('12: error: Module has no attribute "idempotense_report"'), errors
    assert errors[1].startswith('13: error: Argument "threshold" to "idempotence_report" has incompatible type'), errors
