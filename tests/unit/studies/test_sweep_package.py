"""The sweep split by job: every public name still imports from ``tl_idempotence.studies.sweep``
as the very object its job's module defines, and the trajectory reaches its cluster runner through
``studies.cluster``, never through the sweep."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import tl_idempotence as tli
import tl_idempotence.studies.sweep as sweep_pkg

# name -> the module that defines it (what tl_idempotence.studies.sweep exported before the split, and still does)
DEFINED_IN = {
    "ARRAY_INDEX_VARIABLES": "arrays",
    "array_task_index": "arrays",
    "run_sweep_item": "arrays",
    "sweep": "driver",
    "ITEMS_DIR": "plan",
    "LOCK_NAME": "plan",
    "RECORD_NAME": "plan",
    "RESERVED_NAMES": "plan",
    "SWEEP_ITEM_KINDS": "plan",
    "SweepPlan": "plan",
    "item_dirname": "plan",
    "item_origin": "plan",
    "read_sweep_plan": "plan",
    "SweepResult": "results",
    "load_sweep": "results",
    "TASK_COLUMNS": "task",
    "SweepTask": "task",
    "run_sweep_task": "task",
    "saved_report_matches": "task",
    "DEFAULT_RETRIES": "..cluster",
    "cache_name": "..cluster",
    "check_cluster_trajectory": "..cluster",
    "run_trajectory_on_cluster": "..cluster",
}


def test_every_public_name_is_its_defining_modules_object():
    assert sorted(sweep_pkg.__all__) == sorted(DEFINED_IN)
    for name, where in DEFINED_IN.items():
        full = (
            where.replace("..", "tl_idempotence.studies.")
            if where.startswith("..")
            else f"{sweep_pkg.__name__}.{where}"
        )
        mod = importlib.import_module(full)
        assert getattr(sweep_pkg, name) is getattr(mod, name), name
    assert (tli.sweep, tli.load_sweep, tli.SweepResult) == (
        sweep_pkg.sweep,
        sweep_pkg.load_sweep,
        sweep_pkg.SweepResult,
    )
    assert sweep_pkg.DEFAULT_RETRIES == 2 and sweep_pkg.RECORD_NAME == "sweep.json"
    assert sweep_pkg.TASK_COLUMNS == [
        "label",
        "dir",
        "status",
        "reason",
        "device",
        "seconds",
        "host",
        "pid",
        "attempts",
    ]


def test_the_trajectory_does_not_import_the_sweep():
    from tl_idempotence.studies import trajectory

    tree = ast.parse(Path(trajectory.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "cluster" in imported and not any("sweep" in m for m in imported), imported
    assert trajectory.run_trajectory_on_cluster is sweep_pkg.run_trajectory_on_cluster
    assert trajectory.run_trajectory_on_cluster.__module__ == "tl_idempotence.studies.cluster"
