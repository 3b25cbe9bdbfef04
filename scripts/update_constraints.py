"""Regenerate the lock files CI and the README install with, and the architecture table derived from them.

The main CI stage and the README's commands install with ``-c constraints.txt`` (transformer-lens 3.9.x:
HookedTransformer and TransformerBridge), CI's second stage with ``-c constraints-tl4.txt`` (transformer-lens
4.x: TransformerBridge only), so a fresh clone tests exactly the versions that were tested when the files were
written; CI's third stage installs unpinned and reports drift (scripts/derive_architectures.py --drift).

For each lock this script makes a fresh venv in a temporary folder, installs ``torch==2.13.0`` (the CPU wheel),
the transformer-lens series of that lock, the given ``--pin`` requirements and ``-e ".[test,mutation]"``, and
writes ``pip freeze`` (the editable package itself left out, local version labels such as ``+cpu`` dropped).
Then it re-derives ``src/tl_idempotence/data/architectures_derived.json`` in the transformer-lens 3.9 venv
(the table records the versions it was derived with; the main stage's tests compare them with the install).

    python scripts/update_constraints.py                              # the newest releases the ranges admit
    python scripts/update_constraints.py --pin transformers==5.24.0   # hold a library back
    python scripts/update_constraints.py --only tl3                   # one lock file

Then run the tests against the new files (CONTRIBUTING.md, "Updating the pinned versions") and commit the
lock files and the table together. Takes ~5 min and ~3 GB of temporary disk per lock.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: lock name -> (the file, the transformer-lens requirement it is made with)
LOCKS: dict[str, tuple[Path, str]] = {
    "tl3": (ROOT / "constraints.txt", "transformer-lens==3.9.*"),
    "tl4": (ROOT / "constraints-tl4.txt", "transformer-lens>=4,<5"),
}
TORCH = "torch==2.13.0"  # the CPU wheel on local disk; any other torch request downloads a CUDA build


def _run(cmd: list[str]) -> str:
    print("$", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, cwd=ROOT).stdout


def freeze_lines(freeze: str) -> list[str]:
    """``pip freeze`` output as sorted ``name==version`` lines: editable installs, comments and ``@`` URLs left
    out (they are not constraints pip can reuse), local version labels (``2.13.0+cpu``) dropped."""
    out = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ")) or " @ " in line or "==" not in line:
            continue
        name, ver = line.split("==", 1)
        out.append(f"{name}=={ver.split('+', 1)[0]}")
    return sorted(out, key=str.lower)


def make_lock(name: str, pins: list[str], derive: bool) -> None:
    path, tl_req = LOCKS[name]
    with tempfile.TemporaryDirectory(prefix=f"tli-lock-{name}-") as tmp:
        venv = Path(tmp) / "venv"
        _run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
        _run([*pip, TORCH, tl_req, *pins])
        _run([*pip, "-e", ".[test,mutation]", TORCH, tl_req, *pins])
        freeze = _run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"])
        lines = freeze_lines(freeze)
        py = _run([str(venv / "bin" / "python"), "-c", "import platform; print(platform.python_version())"]).strip()
        header = [
            f"# {path.name}: the versions CI's {'main' if name == 'tl3' else 'transformer-lens 4.x'} stage "
            "installs (pip install -c); written by scripts/update_constraints.py",
            f"# on {time.strftime('%Y-%m-%d')} with Python {py} from: {TORCH} {tl_req} -e .[test,mutation]"
            + (f" {' '.join(pins)}" if pins else ""),
            "# Do not edit by hand: rerun the script (CONTRIBUTING.md, 'Updating the pinned versions').",
        ]
        path.write_text("\n".join(header + lines) + "\n")
        print(f"wrote {path} ({len(lines)} packages)", file=sys.stderr)
        if derive:
            _run([str(venv / "bin" / "python"), "scripts/derive_architectures.py"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pin", action="append", default=[], help="a requirement to hold (e.g. transformers==5.24.0)")
    ap.add_argument("--only", choices=sorted(LOCKS), help="write this lock file alone")
    ap.add_argument("--no-derive", action="store_true", help="do not re-derive the architecture table")
    args = ap.parse_args(argv)
    for pin in args.pin:
        if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+\s*(==|>=|<=|~=|<|>|!=).+", pin):
            ap.error(f"--pin {pin!r} is not a requirement such as transformers==5.24.0")
    for name in [args.only] if args.only else list(LOCKS):
        make_lock(name, args.pin, derive=(name == "tl3" and not args.no_derive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
