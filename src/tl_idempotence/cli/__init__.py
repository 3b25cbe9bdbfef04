"""``tl-idempotence``: the command line, on top of the public API.

Commands::

    tl-idempotence report [MODEL] [--out FILE] [--csv heads.csv] [--json] [--threshold 0.9]
                          [--layers 0,5,10-12] [--nulls N] [--search] [--algebra] [--seed S]
                          [--processing raw|tl] [--cls bridge|hooked] [--attention-text TEXT] [--roles] [--mechanism]
                          [--compute-dtype float64|float32] [--device cpu|cuda|auto] [--resume DIR]
                          [--quiet] [--debug]
    tl-idempotence models                     # the offline model zoo and what is cached
    tl-idempotence fetch NAME [--source PATH] [--force]   # fill / verify / rebuild the cache
    tl-idempotence sweep ITEM... --out DIR [--workers N] [--scheduler ADDRESS] [report options]
    tl-idempotence sweep ITEM... --out DIR --task-index [I]   # one item: a task of a job array
    tl-idempotence sweep ITEM... --out DIR --collect           # read the array's reports back

``MODEL`` is a zoo name (default ``smollm2-135m``; ``zoo:NAME`` to be explicit), a path to a
checkpoint directory or ``.gguf`` file, or a Hugging Face hub id (``owner/name``) TransformerLens can load
(raw weights, ``TransformerBridge.boot_transformers``) when the hub is reachable. Any other name exits 2
naming the nearest zoo models, before any network request; with ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``
set, a hub id that is not in the local Hugging Face cache fails in one line with no hub request.
A zoo model is measured from its cached checkpoint files, streamed layer by layer (no model
object, no transformer_lens import), unless the options need a TransformerLens model
(``--processing tl``, ``--cls hooked``, ``--attention-text``, ``--roles``); the numbers are the same bit for bit.
``--roles`` runs TransformerLens's head detector and the copying score on that model (``rep.roles``) and joins
them with the report: the page gets the section "What the closed heads do", ``--csv`` the role columns,
``--json`` the association table and the closed heads' scores. A checkpoint path gives weights only, so
``--roles`` on one is refused (exit 2) before any work. ``--mechanism`` (``rep.mechanism``, SPEC 12) measures what
the heads do to tokens on that model and whether sign(α) predicts it: the page gets the section "What the closed
heads do to tokens", ``--csv`` its columns, ``--json`` its summary; refused on a checkpoint path likewise.

Outputs: the summary (or ``--json``) on stdout; the report to ``--out`` in the format its extension names (the
output registry, :mod:`tl_idempotence.core.outputs`: ``.html`` page, ``.json``, ``.csv``, ``.parquet``; another
extension exits 2 naming these), or the page to ``report.html`` when no output at all was asked for
(``--json``/``--csv`` alone write no page); every file is written atomically, and one written over an existing one
is named as replaced. A mistyped flag is refused naming the closest ones (``--nul``: did you mean ``--nulls``?).

Exit codes: 0 success; 2 bad arguments (every value is checked before any work starts, including
that the folders of ``--out`` and ``--csv`` exist and that no output is, or links to, a file or folder the run
reads: the checkpoint's files, the zoo cache, the resume folder's parts; ``sweep``: the items' checkpoints and
the sweep folder's files); 1 failure, with a one-line reason on stderr (the
traceback with ``--debug``); 130 interrupted. Progress goes to stderr, the summary (or ``--json``) to
stdout; a closed pipe on stdout (``| head -1``) ends quietly. When data goes to stdout (``--json``, ``--csv
/dev/stdout``, ``--out /dev/stdout``, or an output that is the file or pipe stdout is: ``--csv f.csv > f.csv``),
stdout holds that data alone, once: the summary, the joins' text and what was written go to stderr, and two
outputs to stdout exit 2. ``--help`` imports no torch.
"""

from __future__ import annotations

# A package split by job: args.py (argument types), parser.py (one builder per subcommand), common.py (exit codes,
# checks of outputs), report_command.py, sweep_command.py and zoo_commands.py (the commands); this module runs them
# and names main, console_main, build_parser and parse_layers; __main__.py is ``python -m tl_idempotence.cli``.
import argparse
import gc
import os
import sys
from collections.abc import Sequence

from .args import parse_layers
from .common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Failure, one_line
from .parser import build_parser
from .report_command import cmd_report
from .sweep_command import cmd_sweep
from .zoo_commands import cmd_fetch, cmd_models

__all__ = ["build_parser", "console_main", "main", "parse_layers"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) in this process; returns the exit code.

    The report command freezes the garbage collector while it runs (``gc.freeze``) and unfreezes it on
    return (``gc.unfreeze``), so a caller's process collects as usual afterwards; a caller that has
    frozen objects itself (``gc.get_freeze_count() > 0``) keeps its GC state untouched. The
    ``tl-idempotence`` script is :func:`console_main`.
    """
    if gc.get_freeze_count():  # the caller froze objects itself: leave its GC state alone
        return _run(argv, freeze_gc=False)
    try:
        return _run(argv, freeze_gc=True)
    finally:
        gc.unfreeze()


def console_main() -> int:
    """The ``tl-idempotence`` console script (``sys.exit(console_main())``): :func:`main` in a process that
    ends right after it; returns the exit code.

    Objects made by the imports and the run stay frozen (``gc.freeze``) so that the interpreter's
    collections at exit do not traverse torch's objects again (~0.5 s per run); atexit handlers, file
    and stream flushing and refcount finalization all run as usual.
    """
    code = _run(None, freeze_gc=True)
    gc.freeze()
    return code


def _unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> None:
    """Exit 2 naming the unrecognized arguments and, for a mistyped flag, the closest flags of ``parser``
    (``--nul 3``: did you mean ``--nulls``?). Flags are never matched by prefix (``allow_abbrev=False``)."""
    import difflib

    flags = sorted(o for o in parser._option_string_actions if o.startswith("--") and o != "--help")
    hints = []
    for tok in extras:
        if tok.startswith("-"):
            close = difflib.get_close_matches(tok.split("=", 1)[0], flags, n=2, cutoff=0.6)
            if close:
                hints.append(f"{tok.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
    parser.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _run(argv: Sequence[str] | None, freeze_gc: bool) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)  # exits 2 on bad arguments
    if extras:  # argparse's own message, plus the closest flags of the command that was meant
        _unrecognized(getattr(args, "subparser", parser), extras)
    args.freeze_gc = freeze_gc
    cmd = {"report": cmd_report, "models": cmd_models, "fetch": cmd_fetch, "sweep": cmd_sweep}[args.command]
    try:
        return cmd(args, args.subparser)
    except KeyboardInterrupt:
        print("tl-idempotence: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (| head): the work is done; stop quietly without a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        from ..errors import DeviceError, OptionError, OptionTypeError, UnknownOptionError

        msg = str(e) if isinstance(e, Failure) else one_line(e)
        print(f"tl-idempotence: error: {' '.join(msg.split())}", file=sys.stderr)
        usage = isinstance(e, (OptionError, OptionTypeError, UnknownOptionError, DeviceError))
        return EXIT_USAGE if usage else EXIT_FAILURE
