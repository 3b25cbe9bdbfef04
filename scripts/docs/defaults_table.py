"""Write the draw-count defaults table into docs/api.md from ``tl_idempotence.core.defaults`` (the one table).

``python scripts/docs/defaults_table.py`` rewrites the lines between the ``defaults-table`` markers;
``--check`` exits 1 when docs/api.md differs (``tests/unit/core/test_defaults_table.py`` checks the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"
START = "<!-- defaults-table: generated from tl_idempotence.core.defaults by scripts/docs/defaults_table.py -->"
END = "<!-- /defaults-table -->"


def generated(text: str) -> str:
    """``text`` (docs/api.md) with the table between the markers as :func:`defaults_markdown` writes it."""
    sys.path.insert(0, str(ROOT / "src"))
    from tl_idempotence.core.defaults import defaults_markdown

    head, sep, rest = text.partition(START + "\n")
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{API}: the defaults-table markers are missing")
    return f"{head}{START}\n{defaults_markdown()}{END}{tail}"


def main(argv: list[str]) -> int:
    text = API.read_text(encoding="utf-8")
    new = generated(text)
    if "--check" in argv:
        if new != text:
            print(f"{API} differs from tl_idempotence.core.defaults: run python scripts/docs/defaults_table.py")
            return 1
        return 0
    API.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
