"""What the commands share: the defaults, the exit codes, the one-line failure, the report options of a command
line, and the checks of outputs (their format, and that none is a file or folder the run reads)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

DEFAULT_MODEL = "smollm2-135m"
#: The page ``report`` writes when no output at all is asked for.
DEFAULT_PAGE = "report.html"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def zoo_names() -> list[str]:
    """The zoo's model names (:func:`~tl_idempotence.sources.zoo.known_models`), for help texts and messages."""
    from ..sources import zoo

    return zoo.known_models()


class Failure(Exception):
    """A user-facing failure: one line, exit code 1."""


def one_line(e: BaseException) -> str:
    """``TypeName: message`` on one line (white space folded): the reason printed for a failure (exit 1)."""
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def report_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The report options the command line was given (every one of ``report_options()``, by name)."""
    from ..analyses.report_options import report_options

    return {o.name: getattr(args, o.name) for o in report_options()}


def refuse_over_inputs(
    parser: argparse.ArgumentParser, outputs: Sequence[tuple[str, Any]], inputs: Sequence[tuple[str, Any]]
) -> None:
    """Exit 2, before anything is read or written, when an output is (or links to) a file or folder the run
    reads (:func:`~tl_idempotence.core.files.refuse_outputs_over_inputs`, the API's rule), or lies in a zoo
    model's cache folder (:func:`~tl_idempotence.sources.zoo.cache.cache_folder_of`: ``files/`` is a
    checkpoint folder, and ``fetch --force`` deletes it), whatever model the run reads."""
    from ..core.files import refuse_outputs_over_inputs
    from ..errors import OutputOverInputError
    from ..sources.zoo import cache_folder_of

    try:
        refuse_outputs_over_inputs(outputs, inputs)
    except OutputOverInputError as e:
        parser.error(str(e))
    for flag, path in outputs:
        folder = cache_folder_of(path)
        if folder is not None:
            parser.error(
                f"{flag} {path} is in the zoo cache's folder {folder}, which the library verifies, reads and "
                "deletes (fetch --force): write the output elsewhere"
            )


def check_format(
    parser: argparse.ArgumentParser, path: str, formats: Sequence[str], flag: str, stream_format: str | None = None
) -> str:
    """The registry's format of ``path`` among ``formats`` (a stream without extension: ``stream_format``); exit 2
    naming the known extensions otherwise."""
    from ..core.outputs import output_format
    from ..errors import OptionError

    try:
        return output_format(path, formats, flag=flag, stream_format=stream_format).name
    except OptionError as e:
        parser.error(str(e))
