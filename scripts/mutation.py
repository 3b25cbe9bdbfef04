"""Mutation testing of the code that decides numbers and integrity (issue 30), with mutmut.

Each *target* names the functions that decide a number or an integrity check (mutmut's mutant-name globs)
and the fast tests that must catch a wrong one. The script copies the committed tree (``git archive HEAD``)
into a scratch folder, adds a ``[tool.mutmut]`` table there (never to the repository's pyproject.toml),
runs ``mutmut run`` on the target's mutants, and writes ``benchmarks/mutation/<target>.json`` and a
Markdown report: killed / survived / timeout counts, the score with equivalent mutants left out, and the
diff of every survivor. A survivor is either killed by a new test, or written into
``benchmarks/mutation/equivalent.json`` (mutant name -> reason) with the reason it cannot change behaviour.

    python scripts/mutation.py --list
    python scripts/mutation.py resume_key kv_map --max-children 2
    python scripts/mutation.py --all               # every target (hours on a 2-core machine)
    python scripts/mutation.py --by-hand           # the hand-written mutants (HAND_MUTANTS), their kill ratio

mutmut's operator mutants (a flipped comparison, a changed constant) do not write the bugs a person writes: a
query head given its kv head's row, a count compared instead of the elements, a tolerance instead of equality, a
chunk boundary off by one. ``--by-hand`` applies each of :data:`HAND_MUTANTS` (a file, an exact text, its
replacement) to a copy of the committed tree, runs the mutant's tests there and reports killed / survived in
``benchmarks/mutation/hand_written.md`` and ``.json``, beside mutmut's scores in the index.

Not part of any pytest tier: CI runs it as its own stage after the tests (``.ci/run``: the targets in
``TLI_CI_MUTATION``, default ``kv_map``; ``all`` runs every target).
Needs ``pip install -e ".[mutation]"`` (mutmut). The tests' shape checks (jaxtyping's import hook,
tests/shapecheck.py) are switched off inside the run, ``TLI_SHAPECHECK=off`` (mutmut imports the package before
pytest starts, which that hook refuses); the tests run as written.
Exit status: 0 when every target's score (equivalents excluded) is at least ``--min-score`` (default 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "mutation"
EQUIVALENT = OUT / "equivalent.json"


@dataclass(frozen=True)
class Target:
    """Functions that decide a number or an integrity check, and the tests that must catch a wrong one."""

    name: str
    source: str  # the module file under src/
    mutants: tuple[str, ...]  # mutmut mutant-name globs (module.x_function*, module.xǁClassǁmethod*)
    tests: tuple[str, ...]  # pytest selection (files or node ids; tests/unit first, then the tests moved to
    # tests/integration for time that the target's files held before the tiers were folders)
    why: str
    #: node ids left out of the run: tests that need what the run switches off (jaxtyping's shape hook), or
    #: that cannot hold under mutmut by construction (each deselect says why where it is declared)
    deselect: tuple[str, ...] = ()
    #: more module files the ``mutants`` globs reach (a target's functions in two modules)
    more_sources: tuple[str, ...] = ()
    #: a pytest ``-m`` expression (None: every selected test); fresh-process and real-model tests stay out
    marker: str | None = None


#: the quick tier's marker expression (README): no fresh processes, no real models
QUICK = "not slow and not integration"

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "kv_map",
            "src/tl_idempotence/core/heads.py",
            ("tl_idempotence.core.heads.x_kv_layout*",),
            (
                "tests/unit/core/test_kv_layout.py",
                "tests/unit/sources/test_checkpoint.py",
                "tests/integration/sources/test_checkpoint_real.py",
            ),
            "which kv head each query head reads (GQA/MQA): a wrong map changes every GQA head's T",
        ),
        Target(
            "closure",
            "src/tl_idempotence/maths/closure.py",
            (
                "tl_idempotence.maths.closure.x_closure_from_grams*",
                "tl_idempotence.maths.closure.x_layer_grams*",
            ),
            (
                "tests/unit/core/test_closure.py",
                "tests/unit/core/test_scale_properties.py",
                "tests/unit/core/test_closure_exact.py",
                "tests/integration/core/test_closure_gram_rank_large.py",
            ),
            "α and P from the Gram products (SPEC section 2)",
            deselect=("tests/unit/core/test_closure.py::test_shape_annotations_are_checked_while_the_tests_run",),
        ),
        Target(
            "resume_key",
            "src/tl_idempotence/report/parts.py",
            ("tl_idempotence.report.parts.xǁResumeDirǁload*", "tl_idempotence.core.files.x_record_digest*"),
            ("tests/unit/report/test_resume.py", "tests/unit/report/test_resume_integrity.py"),
            "a resumed layer is taken only if its weight fingerprint, options and digest match",
            # mutmut calls ResumeDir.load through its trampoline, a frame of mutmut.mutation.trampoline between
            # the user's line and the package: warn_at_caller (core/kwargs.py, not mutated here) rightly stops
            # there, so the warning names trampoline.py; the test holds in every pytest tier, never under mutmut
            deselect=(
                "tests/unit/report/test_resume_integrity.py::test_a_stale_part_warning_points_at_the_users_line",
            ),
            more_sources=("src/tl_idempotence/core/files.py",),
        ),
        Target(
            "store_digest",
            "src/tl_idempotence/core/records.py",
            ("tl_idempotence.core.files.x_record_digest*", "tl_idempotence.core.records.x_read_listed_tables*"),
            ("tests/unit/report/test_store_record.py",),  # its fastest killing tests (test_store.py: SmolLM2, minutes)
            "a saved record's digest, and its tables read only if they match their sha256s",
            more_sources=("src/tl_idempotence/core/files.py",),
            marker=QUICK,
        ),
        Target(  # split from store_digest: 203 mutants, ~10 s each on the shared machine (over half an hour)
            "store_read",
            "src/tl_idempotence/report/store.py",
            ("tl_idempotence.report.store.x_read_record*", "tl_idempotence.report.store.x__check_tables_fit_info*"),
            ("tests/unit/report/test_store_record.py",),
            "a saved report is loaded only if its tables fit the sizes its record states and its summary its tables",
            marker=QUICK,
        ),
        Target(
            "scramble_summary",
            "src/tl_idempotence/analyses/scramble.py",
            (
                "tl_idempotence.analyses.scramble.x__summarize_draws*",
                "tl_idempotence.analyses.threshold.xǁFractionPerHeadǁfractions*",
            ),
            # its fastest killing tests (test_controls.py: minutes); the threshold rules' exact tests for the fractions
            ("tests/unit/analyses/test_scramble_summary.py", "tests/unit/analyses/test_threshold_rules.py"),
            "the scramble's per-head p-values and closed fractions (SPEC section 4b)",
            more_sources=("src/tl_idempotence/analyses/threshold.py",),
        ),
        Target(
            "threshold_rules",
            "src/tl_idempotence/analyses/threshold.py",
            (
                "tl_idempotence.analyses.threshold.x_closed_flags*",
                "tl_idempotence.analyses.threshold.x__frame*",
                "tl_idempotence.analyses.threshold.x__put*",
                "tl_idempotence.analyses.threshold.xǁFlagǁ*",
                "tl_idempotence.analyses.threshold.xǁCountPerLayerǁ*",
                "tl_idempotence.analyses.threshold.xǁFractionPerHeadǁapply*",
                "tl_idempotence.analyses.threshold.xǁFunctionRuleǁ*",
                "tl_idempotence.analyses.threshold.x_derive_at_threshold*",
            ),
            ("tests/unit/analyses/test_threshold_rules.py",),
            "which heads are closed and every count of closed heads, pairs and layers, at run time and in "
            "with_threshold (one code path: the threshold rules); FractionPerHead.fractions is scramble_summary's",
        ),
        Target(
            "sweep_identity",
            "src/tl_idempotence/report/identity.py",
            ("tl_idempotence.report.identity.x*",),
            ("tests/unit/report/test_identity_exact.py",),  # its fastest killing tests (test_identity.py: real files)
            "whether a saved or finished report is of the checkpoint, weights, options and source it is taken for",
            marker=QUICK,
        ),
        Target(
            "name_resolver",
            "src/tl_idempotence/sources/names.py",
            ("tl_idempotence.sources.names.x*",),
            ("tests/unit/sources/test_names.py", "tests/unit/sources/test_names_exact.py"),
            "what a string or path names (zoo model, checkpoint, unknown) and a checkpoint's label",
            marker=QUICK,
        ),
        Target(
            "ablation_stats",
            "src/tl_idempotence/probes/ablation/stats.py",
            (
                "tl_idempotence.probes.ablation.stats.x_rank_p_value*",
                "tl_idempotence.probes.ablation.stats.x_percentile_interval*",
                "tl_idempotence.probes.ablation.stats.x_bootstrap_intervals*",
            ),
            (
                "tests/unit/probes/test_ablation.py::test_bootstrap_intervals_on_exact_constructions",
                "tests/unit/probes/test_ablation.py::test_percentile_interval_uses_the_2_5_and_97_5_percent_quantiles",
                "tests/unit/probes/test_ablation.py::test_percentile_interval_covers_95_percent_of_a_known_distribution",
                "tests/unit/probes/test_ablation.py::test_bootstrap_interval_covers_the_true_delta",
                "tests/unit/probes/test_ablation.py::test_rank_p_value",
                "tests/unit/probes/test_ablation_statistics.py",
            ),
            "the ablation's rank p-value, its floor and the bootstrap's percentile intervals (their level)",
            marker=QUICK,
        ),
        Target(  # split from roles_stats (439 mutants): the circuit's p-values
            "roles_circuit",
            "src/tl_idempotence/report/roles.py",
            ("tl_idempotence.report.roles.x_circuit_overlap*",),
            ("tests/unit/report/test_roles_statistics.py",),  # its fastest killing tests (no report is built)
            "a circuit's overlap with the closed set: hypergeometric and layer-matched p",
            marker=QUICK,
        ),
        Target(  # split from roles_stats: the association table (304 mutants)
            "roles_assoc",
            "src/tl_idempotence/report/roles.py",
            (  # the Spearman test is core/stats.py's, shared with rep.mechanism
                "tl_idempotence.core.stats.x_spearman_permutation*",
                "tl_idempotence.report.roles.x_role_association*",
            ),
            (
                "tests/unit/report/test_roles_statistics.py",
                "tests/unit/report/test_roles_statistics_mutants.py",
                "tests/unit/core/test_stats.py",
            ),
            "head roles vs closure: Spearman permutation p, Mann-Whitney, BH across roles, sign agreement",
            more_sources=("src/tl_idempotence/core/stats.py",),
            marker=QUICK,
        ),
        Target(
            "q_values",
            "src/tl_idempotence/analyses/scramble.py",
            ("tl_idempotence.analyses.scramble.x_bh_q_values*", "tl_idempotence.report.report.x_add_q_values*"),
            (  # its fastest killing tests (test_q_values.py's report, save and page tests: minutes)
                "tests/unit/report/test_q_values.py::test_bh_matches_definition_on_a_fixed_array",
                "tests/unit/report/test_q_values.py::test_nan_p_values_are_outside_the_family",
                "tests/unit/report/test_q_values_exact.py",
            ),
            "the BH q-values of rep.heads (the family: every head with a finite scramble p-value)",
            more_sources=("src/tl_idempotence/report/report.py",),
            marker=QUICK,
        ),
        Target(  # the algebra's maths has 1,159 mutants: these 159 decide the pairs' P and the threshold's
            # re-derivation (left out: the range angles, 235, the table rows and concat)
            "algebra",
            "src/tl_idempotence/analyses/algebra_maths.py",
            (
                "tl_idempotence.analyses.algebra_maths.x__row*",
                "tl_idempotence.analyses.algebra_maths.x__offdiagonal_nilpotent*",
                "tl_idempotence.analyses.algebra_maths.x__pair_scalars*",
                "tl_idempotence.analyses.algebra_maths.x__offdiagonal_pair*",
                "tl_idempotence.analyses.algebra_maths.xǁSharedValueAlgebraǁat_threshold*",
            ),
            ("tests/unit/analyses/test_algebra.py", "tests/unit/analyses/test_algebra_exact.py"),
            "the shared-value algebra (SPEC section 7): α_ij and P_ij of every pair and their T_iT_j ≈ 0 decision, "
            "and the closed flags, group counts and closed range pairs re-derived at another threshold "
            "(narrowed from the module's 1,159 mutants: the range angles, 235, and the table rows are left out)",
        ),
        Target(  # split from algebra: the principal angles between the ranges of a group's heads (276 mutants)
            "algebra_angles",
            "src/tl_idempotence/analyses/algebra_maths.py",
            (
                "tl_idempotence.analyses.algebra_maths.x__range_angles*",
                "tl_idempotence.analyses.algebra_maths.x__closed_rows*",
            ),
            ("tests/unit/analyses/test_algebra.py", "tests/unit/analyses/test_algebra_exact.py"),
            "the shared-value algebra's principal angles between the ranges of every pair of heads of a kv group "
            "(SPEC section 7) and the rows of them whose two heads are closed",
        ),
    )
}


@dataclass(frozen=True)
class HandMutant:
    """A bug written by hand: ``old`` (exactly once in ``file``) replaced by ``new``; ``tests`` must fail on it."""

    name: str
    file: str  # the module file, from the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # pytest selection run on the mutated copy (unit tier files or node ids)
    why: str  # the bug, in words
    #: the reason it is not run yet (its code is on another branch); None: run
    pending: str | None = None


_ROLES = "src/tl_idempotence/probes/roles.py"
_ROLES_TESTS = ("tests/unit/probes/test_roles_gqa_mixup.py", "tests/unit/probes/test_roles.py")
_STORE_TESTS = ("tests/unit/report/test_store_record.py",)
_ABL_TESTS = ("tests/unit/probes/test_ablation_gqa.py", "tests/unit/probes/test_ablation.py")

#: Hand-written mutants (issue 37): head mix-ups, counts for elements, tolerances for equality, chunk boundaries.
HAND_MUTANTS: tuple[HandMutant, ...] = (
    HandMutant(
        "roles_row_kv_head",
        _ROLES,
        "table.insert(3 + i, role, scores[role][idx, H])",
        'table.insert(3 + i, role, scores[role][idx, table["kv_head"].to_numpy()])',
        _ROLES_TESTS,
        "head_roles takes each query head's attention scores from row kv_head instead of head (GQA)",
    ),
    HandMutant(
        "roles_pattern_of_kv_head",
        _ROLES,
        "ph = pat[b, h].double().cpu()",
        'ph = pat[b, h // (n_heads // int(getattr(model.cfg, "n_key_value_heads", None) or n_heads))].double().cpu()',
        _ROLES_TESTS,
        "role_scores scores the pattern of the query head's kv head index instead of its own",
    ),
    HandMutant(
        "roles_chunk_overlap",
        _ROLES,
        "M += W_U[:, s : s + VOCAB_CHUNK].double() @ W_E[s : s + VOCAB_CHUNK].double()",
        "M += W_U[:, s : s + VOCAB_CHUNK + 1].double() @ W_E[s : s + VOCAB_CHUNK + 1].double()",
        _ROLES_TESTS,
        "W_U W_E accumulated over vocabulary chunks that overlap by one row",
    ),
    HandMutant(
        "roles_chunk_short",
        _ROLES,
        "M += W_U[:, s : s + VOCAB_CHUNK].double() @ W_E[s : s + VOCAB_CHUNK].double()",
        "M += W_U[:, s : s + VOCAB_CHUNK - 1].double() @ W_E[s : s + VOCAB_CHUNK - 1].double()",
        _ROLES_TESTS,
        "W_U W_E accumulated over vocabulary chunks that skip the last row of each chunk",
    ),
    HandMutant(
        "roles_chunk_stop",
        _ROLES,
        "for s in range(0, W_E.shape[0], VOCAB_CHUNK):",
        "for s in range(0, W_E.shape[0] - 1, VOCAB_CHUNK):",
        _ROLES_TESTS,
        "the chunk loop stops one row early (the vocabulary's last row is lost when it starts a chunk)",
    ),
    HandMutant(
        "roles_v_interleaved",
        _ROLES,
        "V = lh.V.double()[lh.kv_head_of.to(lh.V.device)]",
        "V = lh.V.double()[torch.arange(len(lh.kv_head_of), device=lh.V.device) % len(lh.V)]",
        _ROLES_TESTS,
        "the copying score expands W_V by an interleaved map (another kv head's W_V for most query heads)",
    ),
    HandMutant(
        "roles_kv_column_interleaved",
        _ROLES,
        '"kv_head": int(lh.kv_head_of[h]),',
        '"kv_head": h % len(lh.V),',
        _ROLES_TESTS,
        "the roles table's kv_head column from an interleaved map instead of the model's",
    ),
    HandMutant(
        "roles_mean_over_last_pass",
        _ROLES,
        "return {r: v / tokens.shape[0] for r, v in out.items()}",
        "return {r: v / part.shape[0] for r, v in out.items()}",
        _ROLES_TESTS,
        "the attention scores averaged over the last forward pass's sequences instead of all of them (a count)",
    ),
    HandMutant(
        "kv_map_interleaved",
        "src/tl_idempotence/core/heads.py",
        "return torch.arange(n_heads) // (n_heads // n_kv_heads)",
        "return torch.arange(n_heads) % n_kv_heads",
        ("tests/unit/core/test_kv_layout.py", "tests/unit/sources/test_checkpoint.py"),
        "the GQA map interleaved (h % n_kv) instead of grouped (h // group), as repeat_kv does",
    ),
    HandMutant(
        "ablation_kv_column_is_head",
        "src/tl_idempotence/probes/ablation/tables.py",
        '"kv_head": [int(kv_of[h]) for _, h in pairs],',
        '"kv_head": [int(h) for _, h in pairs],',
        _ABL_TESTS,
        "the ablation's kv_head column holds the query head (head for kv_head)",
    ),
    HandMutant(
        "ablation_mha_map",
        "src/tl_idempotence/probes/ablation/entry.py",
        "kv_layout(n_heads, src.info.n_kv_heads)",
        "kv_layout(n_heads, n_heads)",
        _ABL_TESTS,
        "the ablation's kv map of an MHA model on a GQA model (n_heads for n_kv_heads)",
    ),
    HandMutant(
        "ablation_next_head",
        "src/tl_idempotence/probes/ablation/passes.py",
        "m = mask.to(z.device)[:, None, :, None]",
        "m = mask.to(z.device).roll(1, -1)[:, None, :, None]",
        _ABL_TESTS,
        "hook_z ablates the next query head instead of the head in the set",
    ),
    HandMutant(
        "store_closed_by_count",
        "src/tl_idempotence/report/store.py",
        "if not (want == got).all():",
        "if want.sum() != got.sum():",
        _STORE_TESTS,
        "load_report compares the number of closed heads with P >= threshold, not each head's flag",
    ),
    HandMutant(
        "store_summary_tolerance",
        "src/tl_idempotence/report/store.py",
        "return None if same and a == b else (where, a, b)",
        "return None if same and (a == b or abs(a - b) <= 1e-6 * abs(b)) else (where, a, b)",
        _STORE_TESTS,
        "a stored summary number compared with a relative tolerance of 1e-6 instead of exactly",
    ),
    HandMutant(
        "store_kv_range_off_by_one",
        "src/tl_idempotence/report/store.py",
        "K.max() >= info.n_kv_heads",
        "K.max() > info.n_kv_heads",
        _STORE_TESTS,
        "a stored kv_head equal to n_kv_heads (one past the last kv head) accepted",
    ),
    HandMutant(
        "store_q_values_not_bh",
        "src/tl_idempotence/report/store.py",
        "bad = ~((want_q == q) | (np.isnan(want_q) & np.isnan(q)))",
        "bad = ~((np.sort(want_q) == np.sort(q)) | (np.isnan(np.sort(want_q)) & np.isnan(np.sort(q))))",
        _STORE_TESTS,
        "stored q-values checked as a set (sorted), not head by head against BH of the stored p-values",
    ),
    HandMutant(
        "store_kv_head_not_map",
        "src/tl_idempotence/report/store.py",
        "if not (want_kv == K).all():",
        "if not (np.sort(want_kv) == np.sort(K)).all():",
        _STORE_TESTS,
        "a stored kv_head checked by the counts of each kv head, not against the kv map head by head",
    ),
    HandMutant(
        "roles_store_kv_head",
        "src/tl_idempotence/probes/roles.py",
        "        bad = want != K\n",
        "        bad = np.sort(want) != np.sort(K)\n",
        ("tests/unit/report/test_roles_record.py",),
        "load_roles checks a stored kv_head by the counts of each kv head, not against the kv map head by head",
    ),
)


def run_hand_mutants(names: list[str], keep: bool, timeout: float) -> dict:
    """Apply each hand-written mutant (``names``; empty: all; a pending one is reported, not run) to a copy of the
    committed tree, run its tests there (``PYTHONPATH`` = the copy's ``src``), and report killed (the tests
    failed) or survived.

    A mutant whose ``old`` text is not exactly once in its file stops the run (the code moved: edit the mutant).
    The tests are first run on the unmutated copy: a failure there stops the run (a mutant would count as killed).
    """
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    chosen = [m for m in HAND_MUTANTS if not names or m.name in names]  # a pending one is listed, never run
    unknown = set(names) - {m.name for m in HAND_MUTANTS}
    if unknown:
        raise SystemExit(f"unknown hand-written mutant(s) {sorted(unknown)}; see --list-by-hand")
    work = Path(tempfile.mkdtemp(prefix="tli-mutation-by-hand-"))
    env = {**os.environ, "PYTHONPATH": str(work / "src"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    results = []
    t_all = time.perf_counter()
    try:
        scratch_copy(work)
        for m in chosen:
            if m.pending is None and (work / m.file).read_text(encoding="utf-8").count(m.old) != 1:
                raise SystemExit(f"{m.name}: its text is not exactly once in {m.file} (the code moved): {m.old!r}")
        tests = sorted({t for m in chosen if m.pending is None for t in m.tests})
        clean = subprocess.run([*base, *tests], cwd=work, env=env, capture_output=True, text=True)
        if clean.returncode != 0:
            raise SystemExit(f"the tests fail on the unmutated tree:\n{clean.stdout[-3000:]}\n{clean.stderr[-2000:]}")
        for m in chosen:
            if m.pending is not None:
                results.append(
                    {"name": m.name, "file": m.file, "why": m.why, "status": "pending", "pending": m.pending}
                )
                continue
            path = work / m.file
            original = path.read_text(encoding="utf-8")
            path.write_text(original.replace(m.old, m.new), encoding="utf-8")
            t0 = time.perf_counter()
            try:
                run = subprocess.run(
                    [*base, *m.tests], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
                )
                # pytest: 1 = tests failed (killed), 0 = passed (survived); 2..5 = interrupted, usage, no tests
                status = {0: "survived", 1: "killed"}.get(run.returncode, f"error (pytest exit {run.returncode})")
                failed = [ln.split(" ")[1] for ln in run.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
            except subprocess.TimeoutExpired:
                status, failed = "timeout", []
            finally:
                path.write_text(original, encoding="utf-8")
            results.append(
                {
                    "name": m.name,
                    "file": m.file,
                    "why": m.why,
                    "old": m.old,
                    "new": m.new,
                    "tests": list(m.tests),
                    "status": status,
                    "killed_by": failed[:3],
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(f"{m.name}: {status} ({results[-1]['seconds']} s) {' '.join(failed[:1])}", flush=True)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    killed = sum(r["status"] == "killed" for r in results)
    run_n = sum(r["status"] in ("killed", "survived") for r in results)
    return {
        "head": head.stdout.strip(),
        "killed": killed,
        "survived": sum(r["status"] == "survived" for r in results),
        "pending": sum(r["status"] == "pending" for r in results),
        "other": sum(r["status"] not in ("killed", "survived", "pending") for r in results),
        "score": killed / run_n if run_n else None,
        "seconds": round(time.perf_counter() - t_all, 1),
        "mutants": results,
    }


def write_hand_report(r: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hand_written.json").write_text(json.dumps(r, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    score = "n/a" if r["score"] is None else f"{100 * r['score']:.1f} %"
    lines = [
        f"# Mutation testing: hand-written mutants (at {r['head']})",
        "",
        "Written by `scripts/mutation.py --by-hand`: each mutant of `HAND_MUTANTS` (a file, an exact text, its",
        "replacement) applied alone to a copy of the committed tree, its tests run there (`pytest -x`).",
        "",
        f"- killed {r['killed']}; survived {r['survived']}; pending {r['pending']}; other {r['other']}",
        f"- kill ratio (killed / (killed + survived)): **{score}**; {r['seconds']} s",
        "",
        "| mutant | file | the bug | status | killed by |",
        "|---|---|---|---|---|",
    ]
    for m in r["mutants"]:
        by = ", ".join(f"`{t}`" for t in m.get("killed_by", [])) or m.get("pending") or ""
        lines.append(f"| `{m['name']}` | `{m['file']}` | {m['why']} | {m['status']} | {by} |")
    lines.append("")
    (OUT / "hand_written.md").write_text("\n".join(lines), encoding="utf-8")


#: mutmut's status names, as ``mutmut results --all true`` prints them.
KILLED = {"killed"}
SURVIVED = {"survived"}
OTHER = {"timeout", "suspicious", "no tests", "skipped", "not checked", "segfault", "check was interrupted by user"}


def load_equivalent() -> dict[str, str]:
    """Mutant name -> the reason it is equivalent (cannot change behaviour), from equivalent.json."""
    if not EQUIVALENT.exists():
        return {}
    data = json.loads(EQUIVALENT.read_text(encoding="utf-8"))
    return {str(k): str(v) for k, v in data.items()}


def scratch_copy(dest: Path) -> None:
    """The committed tree (HEAD) in ``dest``: mutmut rewrites files, never in the user's checkout."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def mutmut_table(t: Target) -> str:
    pytest_args = ["-p", "no:randomly", "-o", "addopts=-ra --import-mode=importlib", "-x", "-q"]
    for node in t.deselect:
        pytest_args += ["--deselect", node]
    if t.marker is not None:
        pytest_args += ["-m", t.marker]
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src/"]\n'
        f"only_mutate = {json.dumps([t.source, *t.more_sources])}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(list(t.tests))}\n"
        f"pytest_add_cli_args = {json.dumps(pytest_args)}\n"
        # torch is not fork-safe once its thread pools run: fork each mutant from a server that only imported
        'process_isolation = "forkserver"\n'
        'forkserver_warmup = "collect"\n'
    )


def run_target(t: Target, max_children: int, keep: bool) -> dict:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    work = Path(tempfile.mkdtemp(prefix=f"tli-mutation-{t.name}-"))
    try:
        scratch_copy(work)
        with open(work / "pyproject.toml", "a", encoding="utf-8") as f:
            f.write(mutmut_table(t))
        mutmut = [sys.executable, "-m", "mutmut"]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # mutmut puts mutants/src first
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # one thread per mutant: no pool to inherit
        env["TLI_SHAPECHECK"] = "off"  # mutmut imports the package before pytest: tests/shapecheck.py
        t0 = time.perf_counter()
        run = subprocess.run(
            [*mutmut, "run", "--max-children", str(max_children), *t.mutants],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - t0
        if run.returncode != 0:
            raise SystemExit(
                f"mutmut run failed for {t.name} (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            )
        res = subprocess.run([*mutmut, "results", "--all", "true"], cwd=work, env=env, capture_output=True, text=True)
        status: dict[str, str] = {}
        for line in res.stdout.splitlines():
            m = re.match(r"\s*(\S+): (.+)$", line)
            if m and any(_matches(m.group(1), g) for g in t.mutants):
                status[m.group(1)] = m.group(2).strip()
        survivors = sorted(k for k, v in status.items() if v in SURVIVED)
        diffs = {}
        for k in survivors:
            show = subprocess.run([*mutmut, "show", k], cwd=work, env=env, capture_output=True, text=True)
            diffs[k] = show.stdout.strip()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    equivalent = load_equivalent()
    eq = sorted(k for k in survivors if k in equivalent)
    killed = sum(v in KILLED for v in status.values())
    counted = killed + len(survivors) - len(eq)  # killed + survived, equivalents left out
    return {
        "target": t.name,
        "why": t.why,
        "source": t.source,
        "mutants": list(t.mutants),
        "tests": list(t.tests),
        "deselected": list(t.deselect),
        "marker": t.marker,
        "n_mutants": len(status),
        "killed": killed,
        "survived": len(survivors) - len(eq),
        "equivalent": len(eq),
        "other": {s: sum(v == s for v in status.values()) for s in sorted(set(status.values()) - KILLED - SURVIVED)},
        "score": (killed / counted) if counted else None,
        "seconds": round(seconds, 1),
        "survivors": {k: {"diff": diffs[k], "equivalent": equivalent.get(k)} for k in survivors},
        "head": head.stdout.strip(),  # the commit mutated (git archive HEAD at the start)
    }


def rescore(name: str) -> dict:
    """A target's last report with the survivors classified again by equivalent.json (mutant names are numbered
    within their function: after an edit of the function, rerun instead)."""
    r = json.loads((OUT / f"{name}.json").read_text(encoding="utf-8"))
    equivalent = load_equivalent()
    for k, s in r["survivors"].items():
        s["equivalent"] = equivalent.get(k)
    r["equivalent"] = sum(s["equivalent"] is not None for s in r["survivors"].values())
    r["survived"] = len(r["survivors"]) - r["equivalent"]
    r["score"] = r["killed"] / (r["killed"] + r["survived"]) if r["killed"] + r["survived"] else None
    return r


def _matches(name: str, glob: str) -> bool:
    return re.fullmatch(re.escape(glob).replace(r"\*", ".*"), name) is not None


def write_report(r: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{r['target']}.json").write_text(json.dumps(r, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    score = "n/a" if r["score"] is None else f"{100 * r['score']:.1f} %"
    lines = [
        f"# Mutation testing: `{r['target']}` (at {r['head']})",
        "",
        f"{r['why']}. Source `{r['source']}`, mutants `{'`, `'.join(r['mutants'])}`, tests "
        f"`{'`, `'.join(r['tests'])}`.",
        "",
        f"- mutants: {r['n_mutants']}; killed {r['killed']}; survived {r['survived']}; equivalent "
        f"{r['equivalent']}; other {r['other'] or 0}",
        f"- score (killed / (killed + survived), equivalents excluded): **{score}**; {r['seconds']} s",
        "",
    ]
    for k, s in r["survivors"].items():
        lines += [f"## {k}" + (" (equivalent)" if s["equivalent"] else ""), ""]
        if s["equivalent"]:
            lines += [f"Equivalent: {s['equivalent']}", ""]
        lines += ["```diff", s["diff"], "```", ""]
    (OUT / f"{r['target']}.md").write_text("\n".join(lines), encoding="utf-8")


def _hand_index_lines() -> list[str]:
    f = OUT / "hand_written.json"
    if not f.exists():
        return []
    r = json.loads(f.read_text(encoding="utf-8"))
    score = "n/a" if r["score"] is None else f"{100 * r['score']:.1f} %"
    return [
        "Hand-written mutants (`--by-hand`: head mix-ups, counts for elements, tolerances, chunk boundaries; see",
        f"[hand_written.md](hand_written.md)): **{score}** ({r['killed']} killed, {r['survived']} survived, "
        f"{r['pending']} pending) at {r['head']}.",
        "",
    ]


def write_index() -> None:
    """``benchmarks/mutation/README.md``: one line per target with a report (its score, counts, time and commit)."""
    rows = []
    for name in TARGETS:
        f = OUT / f"{name}.json"
        if not f.exists():
            rows.append(f"| `{name}` | not run to the end (by_hand.md) | | | | | |")
            continue
        r = json.loads(f.read_text(encoding="utf-8"))
        score = "n/a" if r["score"] is None else f"{100 * r['score']:.1f} %"
        rows.append(
            f"| [`{name}`]({name}.md) | **{score}** | {r['killed']} | {r['survived']} | {r['equivalent']} | "
            f"{r['n_mutants']} | {r['seconds']} s at {r['head']} |"
        )
    text = [
        "# Mutation testing: kill rates per target",
        "",
        "Written by `scripts/mutation.py` after each run (`--rescore` after editing `equivalent.json`). Score =",
        "killed / (killed + survived), equivalent mutants (each with its reason in `equivalent.json`) left out;",
        "each target's report lists every survivor's diff and verdict. Times: one mutant at a time",
        "(`--max-children 1`) on the project's shared 2-core machine, so they vary with its load.",
        "",
        "| target | score | killed | survived | equivalent | mutants | time |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *_hand_index_lines(),
    ]
    (OUT / "README.md").write_text("\n".join(text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"targets to run (of {', '.join(TARGETS)})")
    ap.add_argument("--all", action="store_true", help="run every target")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 1, help="parallel mutants")
    ap.add_argument("--min-score", type=float, default=0.9, help="the score every target must reach (default 0.9)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (to `mutmut browse` it)")
    ap.add_argument(
        "--rescore",
        action="store_true",
        help="rewrite the named targets' reports from their JSON with the current equivalent.json (no run)",
    )
    ap.add_argument(
        "--by-hand",
        nargs="*",
        metavar="MUTANT",
        default=None,
        help="run the hand-written mutants (all that are not pending, or those named) instead of mutmut",
    )
    ap.add_argument("--list-by-hand", action="store_true", help="list the hand-written mutants and exit")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per hand-written mutant (default 1200)")
    a = ap.parse_args(argv)
    if a.list_by_hand:
        for m in HAND_MUTANTS:
            print(f"{m.name:28} {m.file}: {m.why}" + (f" [pending: {m.pending}]" if m.pending else ""))
        return 0
    if a.by_hand is not None:
        r = run_hand_mutants(a.by_hand, a.keep, a.timeout)
        if not a.by_hand:  # the whole campaign: its report and the index
            write_hand_report(r)
            write_index()
        score = r["score"]
        print(
            f"by hand: {r['killed']}/{r['killed'] + r['survived']} killed "
            f"({'n/a' if score is None else f'{100 * score:.1f} %'}), {r['pending']} pending, {r['other']} other, "
            f"{r['seconds']} s"
        )
        return 0 if score is not None and score >= a.min_score and not r["other"] else 1
    if a.list:
        for t in TARGETS.values():
            print(f"{t.name:18} {t.source}: {t.why}")
        return 0
    names = list(TARGETS) if a.all else a.targets
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        ap.error(f"unknown target(s) {unknown}; choose from {list(TARGETS)}" if unknown else "name a target or --all")
    ok = True
    for n in names:
        r = rescore(n) if a.rescore else run_target(TARGETS[n], a.max_children, a.keep)
        write_report(r)
        score = r["score"]
        print(
            f"{n}: {r['killed']}/{r['killed'] + r['survived']} killed "
            f"({'n/a' if score is None else f'{100 * score:.1f} %'}), {r['equivalent']} equivalent, {r['seconds']} s"
        )
        ok &= score is not None and score >= a.min_score
        write_index()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
