"""The skips of the docs' python blocks (``<!-- skip: next "why" -->``) under the one rule of every skip
(tests/ci_skips.py ``CI_ALLOWED_SKIPS``): each reason is one CI accepts, the reasons only a doc block may give are
refused for a pytest test, and a block skipped as "a signature, not a call" is checked here against the code
(parameter names, order, kinds and defaults; the return type shown). The CI=1 failure of a skip whose reason is
not allowed is replayed in a fresh pytest process by tests/integration/test_ci_skips.py."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from ci_skips import CI_ALLOWED_SKIPS, ci_allows_skip
from doc_blocks import DOC_FILES, ROOT

_SKIP = re.compile(r'^<!--\s*skip:\s*next\s+"([^"]*)"\s*-->\s*$')
SIGNATURE = "a signature, not a call"


def doc_skips(text: str) -> list[tuple[int, str, str]]:
    """``(line, reason, the python block below)`` for each skip comment of a markdown page."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _SKIP.match(line)
        if m is None:
            continue
        body = []
        if i + 1 < len(lines) and lines[i + 1].startswith("```python"):
            j = i + 2
            while j < len(lines) and lines[j].rstrip() != "```":
                body.append(lines[j])
                j += 1
        out.append((i + 1, m.group(1), "\n".join(body)))
    return out


def all_doc_skips() -> list[tuple[str, int, str, str]]:
    return [
        (str(Path(path).relative_to(ROOT)), line, reason, body)
        for path in sorted(DOC_FILES)
        for line, reason, body in doc_skips(Path(path).read_text(encoding="utf-8"))
    ]


def test_every_skipped_doc_block_gives_a_reason_ci_accepts():
    skips = all_doc_skips()
    assert len(skips) == 7  # tests/unit/test_doc_blocks.py says which blocks, per page
    refused = [
        f"{name}:{line}: {reason}" for name, line, reason, _ in skips if not ci_allows_skip(reason, doc_block=True)
    ]
    assert not refused, refused


def test_the_reasons_only_a_doc_block_may_give_are_refused_for_a_test():
    docs_only = [e.fragment for e in CI_ALLOWED_SKIPS if e.docs_only]
    assert docs_only == ["needs the Hugging Face hub", "needs a cluster", "long-running", SIGNATURE]
    for fragment in docs_only:
        assert ci_allows_skip(f"{fragment}: why", doc_block=True)
        assert not ci_allows_skip(f"{fragment}: why")  # a pytest test that takes minutes is marked slow
    assert ci_allows_skip("needs CUDA", doc_block=True) and ci_allows_skip("needs CUDA")
    assert not ci_allows_skip("downloads gpt2 from the hub", doc_block=True)  # a reason, but not an allowed one
    assert not ci_allows_skip("", doc_block=True)


# ------------------------------------------------------------------ the signature blocks, checked against the code
def _call_spans(code: str) -> list[tuple[str, str, str | None]]:
    """``(name, the text between the parentheses, the return type shown or None)`` of each ``tli.NAME(...)``."""
    out = []
    for m in re.finditer(r"\btli\.(\w+)\(", code):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        ret = re.match(r"\s*->\s*(\w+)", code[i:])
        out.append((m.group(1), code[m.end() : i - 1], ret.group(1) if ret else None))
    return out


_NONE = object()


def shown(params: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """A shown parameter list: the positional parameters ``(name, default)`` in order, the keyword-only ones."""
    args = ast.parse(f"def f({params}): pass").body[0].args  # type: ignore[attr-defined]
    positional = [a.arg for a in args.args]
    defaults = [_NONE] * (len(positional) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
    keyword = {
        a.arg: _NONE if d is None else ast.literal_eval(d)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    }
    return list(zip(positional, defaults, strict=True)), keyword


def actual(fn: Any) -> tuple[list[tuple[str, Any]], dict[str, Any], str]:
    """The same of a function, with the report options (``**options``) as the keyword-only parameters they are."""
    from tl_idempotence.analyses.report_options import report_options

    sig = inspect.signature(fn)
    P = inspect.Parameter
    positional = [
        (p.name, _NONE if p.default is P.empty else p.default)
        for p in sig.parameters.values()
        if p.kind is P.POSITIONAL_OR_KEYWORD
    ]
    keyword = {
        p.name: _NONE if p.default is P.empty else p.default
        for p in sig.parameters.values()
        if p.kind is P.KEYWORD_ONLY
    }
    for p in sig.parameters.values():
        if p.kind is P.VAR_KEYWORD:
            assert "ReportOptionsArgs" in str(p.annotation), f"{fn.__name__}: **{p.name} is not the report options"
            keyword.update({o.name: o.default for o in report_options()})
    return positional, keyword, str(sig.return_annotation)


def _same(a: Any, b: Any) -> bool:
    """Equal defaults, a bool never standing for a number (``nulls=False`` is not ``nulls=0``)."""
    return a is b or (a == b and isinstance(a, bool) == isinstance(b, bool))


def signature_differences(code: str) -> list[str]:
    """How the ``tli.NAME(...)`` signatures shown in a block differ from the functions (empty: none)."""
    import tl_idempotence as tli

    bad = []
    calls = _call_spans("\n".join(line.split("#", 1)[0] for line in code.splitlines()))
    if not calls:
        return ["no tli.NAME(...) signature in the block"]
    for name, params, ret in calls:
        (pos, kw), (real_pos, real_kw, real_ret) = shown(params), actual(getattr(tli, name))
        if [n for n, _ in pos] != [n for n, _ in real_pos]:
            bad.append(f"tli.{name}: positional {[n for n, _ in pos]}, the code's {[n for n, _ in real_pos]}")
        if set(kw) != set(real_kw):
            bad.append(f"tli.{name}: keyword-only {sorted(kw)}, the code's {sorted(real_kw)}")
        real = dict(real_pos) | real_kw
        for n, d in [*pos, *kw.items()]:
            if n in real and not _same(d, real[n]):
                bad.append(
                    f"tli.{name}: {n}={'(none)' if d is _NONE else repr(d)}, the code's default "
                    f"{'(none)' if real[n] is _NONE else repr(real[n])}"
                )
        if ret is not None and ret != real_ret:
            bad.append(f"tli.{name}: -> {ret}, the code's -> {real_ret}")
    return bad


def signature_blocks() -> list[tuple[str, int, str]]:
    return [(name, line, body) for name, line, reason, body in all_doc_skips() if SIGNATURE in reason]


def test_the_signatures_the_docs_show_are_the_code_s():
    blocks = signature_blocks()
    assert {name for name, _, _ in blocks} == {"docs/api.md", "docs/sweeps.md"}
    found = {f"{name}:{line}": signature_differences(body) for name, line, body in blocks}
    assert found == {k: [] for k in found}


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("tli.load_sweep(out, items=1) -> SweepResult", ["tli.load_sweep: items=1, the code's default None"]),
        ("tli.load_sweep(out) -> SweepResult", ["tli.load_sweep: positional ['out'], the code's ['out', 'items']"]),
        ("tli.load_sweep(out, items=None) -> Trajectory", ["tli.load_sweep: -> Trajectory, the code's -> SweepResult"]),
        (
            "rep = tli.idempotence_report(model, *, threshold=0.9, nulls=False, seed=0, search=False, algebra=False,\n"
            "    layers=None, compute_dtype='float64', device='cpu', progress=True, resume=None, architecture=None,\n"
            "    prefix=None)  # a bool shown for a count",
            ["tli.idempotence_report: nulls=False, the code's default 0"],
        ),
        (
            "tli.idempotence_report(model, threshold=0.9)",
            [
                "tli.idempotence_report: positional ['model', 'threshold'], the code's ['model']",
                "tli.idempotence_report: keyword-only [], the code's ['algebra', 'architecture', 'compute_dtype', "
                "'device', 'layers', 'nulls', 'prefix', 'progress', 'resume', 'search', 'seed', 'threshold']",
            ],
        ),
        ("no call here", ["no tli.NAME(...) signature in the block"]),
    ],
)
def test_a_signature_that_is_not_the_code_s_is_named(code, says):
    assert signature_differences(code) == says
