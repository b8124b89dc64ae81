"""Running a job from its command line: parse its arguments dataclass, set up logging, run it, and end with its
summary in a few lines for people (``--json``: the whole summary as JSON, for scripts; the whole record is in the
files the job writes). Bad input exits with status 2 and one line naming the parameter; a refusal by Google Cloud
that would repeat (a permission, no credentials, a TPU slice that did not come up) with 3; a training that diverged
with 4; another failure of an outside service with 1; each in one line, without a traceback. A pipeline component
exits the same way (``job_exit_status``): KFP's executor maps no exception to a status, and Vertex AI shows the
last lines of a task's log. Inside the Vertex AI custom job that the pipeline's launcher created, the outcomes 2, 3
and 4, and an accelerator that did not start (1: a new job may get past it), are written as the job's verdict and
the process exits 0 (``components/lib/verdict.py``): Vertex AI would restart a worker that exits non-zero on the
same VM, and pay for the same outcome again."""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from components.lib import storage, verdict
from components.lib.errors import (
    REDACTED,
    Diverged,
    InvalidParameter,
    Refused,
    ReportedFailure,
    ServiceFailed,
    StartFailed,
    is_secret_parameter,
    redact,
)

Arguments = TypeVar("Arguments")
BAD_INPUT_EXIT = 2  # the exit status of a job refused for its input: the same input fails the same way again
# refused by Google Cloud for good (a storage or API permission, no credentials, a missing resource, a slice that
# did not come up): the same account and settings meet the same refusal again
REFUSED_EXIT = 3
DIVERGED_EXIT = 4  # a training stopped on a non-finite loss: the same data, seed and settings diverge again
# what a new job with the same settings would meet again: the TPU task's launcher does not replace such a job
NOT_RETRIED_EXITS = (BAD_INPUT_EXIT, REFUSED_EXIT, DIVERGED_EXIT)
FINAL_API_CODES = (400, 401, 403, 404)  # what a retry of the same request meets again
log = logging.getLogger("tpu_mlm")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # tf.distribute logs each all-reduce it sets up


def parse_arguments(
    arguments_class: type[Arguments], argv: Sequence[str] | None, description: str, prog: str | None = None
) -> tuple[Arguments, bool]:
    """The job's arguments, and whether ``--json`` asks for the summary as JSON. A flag is taken only as spelt in
    full (argparse's abbreviations would take ``--hf_token`` for ``--hf_token_secret``); what a refusal shows of a
    value never holds a credential (``errors.redact``)."""
    import argparse

    from transformers import HfArgumentParser

    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Defaults shown, and the job's docstring as written: its usage examples keep their lines."""

    class Parser(HfArgumentParser):
        def error(self, message: str) -> Any:  # argparse's own refusals: a wrong type, a bad choice
            super().error(redacted_argparse_error(message))

    parser = Parser(arguments_class, description=description, prog=prog, formatter_class=Formatter, allow_abbrev=False)
    parser.add_argument(
        "--json", action="store_true", help="Print the whole summary as JSON (for scripts), not the lines for people."
    )
    args = list(sys.argv[1:] if argv is None else argv)
    required = [action for action in parser._actions if action.required]
    for action in required:  # a flag mistyped is named first, not as the required one it misses
        action.required = False
    try:
        _, unknown = parser.parse_known_args(args=args)  # before the dataclass's own checks, which a typo would skew
    finally:
        for action in required:
            action.required = True
    if unknown:
        raise unknown_flag(parser, unknown, args, prog or "the job")
    arguments, printing = parser.parse_args_into_dataclasses(args=args)
    return arguments, printing.json


def unknown_flag(parser: Any, unknown: list[str], args: list[str], prog: str) -> InvalidParameter:
    """The refusal of the first argument the parser did not take: a flag it does not have (the nearest it has, or
    --help), or a value no flag takes (after the flag it follows). A credential typed as a flag's value is never
    shown, and never advised into another flag: it belongs in the environment."""
    flag, _, value = unknown[0].partition("=")
    flags = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    if not flag.startswith("-"):  # a value with no flag of its own: the flag before it took its one value
        before = next((arg for arg in reversed(args[: args.index(unknown[0])]) if arg.startswith("--")), "--")
        parameter, value = before.partition("=")[0].lstrip("-"), unknown[0]
        expected = "is a value no flag takes"
        if parameter:
            expected += f"; --{parameter} takes one value (quote one with spaces)"
    else:
        parameter = flag.lstrip("-")
        if not value and len(unknown) > 1 and not unknown[1].startswith("--"):
            value = unknown[1]
        expected = "is not a flag of this job"
        if is_secret_parameter(flag) or redact(value) != value:
            expected += "; a credential is never given on the command line"
            if "--hf_token_secret" not in flags:
                expected += " (this job takes none)"
            else:
                expected += (
                    ": the Hub token is read from HF_TOKEN, or from the Secret Manager secret --hf_token_secret names"
                )
        else:
            near = difflib.get_close_matches(flag, flags, n=1)
            expected += f"; did you mean {near[0]}?" if near else f"; {prog} --help lists them"
    if redact(value) != value:
        expected += " (the token typed here is in your shell's history: revoke it and make another)"
    return InvalidParameter(parameter, value, expected)


def redacted_argparse_error(message: str) -> str:
    """argparse's refusal with no credential in it: a secret flag's quoted values are not shown, nor anything that
    looks like a token."""
    named = re.match(r"argument (\S+): ", message)
    if named and any(is_secret_parameter(flag) for flag in named.group(1).split("/")):
        message = named.group(0) + re.sub(r"'[^']*'", repr(REDACTED), message[named.end() :])
    return redact(message)


def summary_lines(summary: dict[str, Any]) -> str:
    """A job's summary for people: its plain values, one a line; a list or a mapping only counted (what it holds
    is in the files the job wrote, or behind --json)."""
    lines = []
    for key, value in summary.items():
        if key == "arguments":
            continue
        if isinstance(value, dict | list):
            value = f"{len(value):,} {'entries' if isinstance(value, dict) else 'items'}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def google_cloud_refusal(error: BaseException) -> str:
    """One line for what Google Cloud's clients raise at first contact (no credentials, an API not enabled, a
    permission or quota refused), with what to do; "" for any other error."""
    auth = sys.modules.get("google.auth.exceptions")
    if auth is not None and isinstance(error, auth.DefaultCredentialsError):
        return (
            "no Google Cloud credentials on this machine: run gcloud auth application-default login (or set "
            "GOOGLE_APPLICATION_CREDENTIALS)"
        )
    api = sys.modules.get("google.api_core.exceptions")
    if api is not None and isinstance(error, api.GoogleAPICallError):
        message = " ".join(str(error.message or error).split())
        message = re.sub(r"^[A-Z]+ \S+: ", "", message)[:500]  # the REST client's "POST https://…: " before it
        return f"Google Cloud refused the request ({error.code} {type(error).__name__}): {message}"
    return ""


def one_line_failure(error: BaseException) -> tuple[int, str] | None:
    """The exit status and the one line of an error a job reports without a traceback; None for any other."""
    if isinstance(error, InvalidParameter):
        return BAD_INPUT_EXIT, str(error)
    if isinstance(error, Diverged):
        return DIVERGED_EXIT, str(error)
    if isinstance(error, storage.PermissionDenied | Refused):
        return REFUSED_EXIT, str(error)
    if isinstance(error, ReportedFailure):
        return error.status, str(error)
    if isinstance(error, ServiceFailed):
        return 1, str(error)
    api = sys.modules.get("google.api_core.exceptions")
    if api is not None and isinstance(error, api.RetryError):  # no answer, retries included: worth another try later
        cause = f" ({type(error.cause).__name__})" if error.cause is not None else ""
        return 1, (
            f"Google Cloud could not be reached{cause}: {' '.join(str(error.message).split())[:300]}; check the "
            "network, and the endpoint and region given, then run the command again"
        )
    refused = google_cloud_refusal(error)
    if not refused:
        return None
    return (REFUSED_EXIT if getattr(error, "code", 401) in FINAL_API_CODES else 1), refused


def reported_status(error: BaseException) -> int | None:
    """Prints the one line of an error a job reports without a traceback and returns its exit status: 0 for an
    outcome written as the TPU job's verdict (one that would repeat, ``NOT_RETRIED_EXITS``, or a failed start);
    None (and nothing printed) for any other error."""
    failure = one_line_failure(error)
    if failure is None:
        return None
    status, line = failure
    line = redact(line)  # an outside service's message may quote what it was sent
    # what this job would meet again (2, 3, 4), or a start that a new job, not a restart on this VM, may get past
    known = status in NOT_RETRIED_EXITS or isinstance(error, StartFailed)
    as_verdict = known and verdict.record(status, line, getattr(error, "step", None))
    print(f"error: {line}", file=sys.stderr, flush=True)  # last: what Vertex AI shows of a failed task's log
    return 0 if as_verdict else status


@contextlib.contextmanager
def job_exit_status(values: Iterable[Any]) -> Iterator[None]:
    """Ends the process as ``run_job`` does for the errors it reports in one line (``reported_status``): for a
    pipeline component, whose code KFP's executor runs with no mapping of exceptions to exit statuses. ``values``:
    the step's arguments, whose buckets a storage permission error names."""
    try:
        with storage.permission_errors_in_one_line(values):
            yield
    except Exception as error:
        status = reported_status(error)
        if status is None:
            raise
        raise SystemExit(status) from None


def run_job(
    arguments_class: type[Arguments],
    job: Callable[[Arguments], dict[str, Any]],
    argv: Sequence[str] | None = None,
    description: str | None = None,
    print_summary: bool = True,
    for_people: Callable[[dict[str, Any]], str] = summary_lines,
    subcommand: str = "",
) -> int:
    """Parses ``argv`` into ``arguments_class``, runs ``job`` and prints its summary: ``for_people`` of it, or it
    as JSON with ``--json`` (unless the job shows its own). ``subcommand``: the job's name in a module of several
    (``python -m MODULE SUBCOMMAND``). Returns the exit code."""
    setup_logging()
    try:
        # the usage line names the module the job runs as (what its container runs), not "tpu-mlm" or "-c"
        spec = sys.modules[job.__module__].__spec__  # run as python -m X, the module's __name__ is __main__
        prog = f"python -m {spec.name} {subcommand}".strip() if spec else None
        arguments, as_json = parse_arguments(arguments_class, argv, description or job.__doc__ or "", prog)
        with storage.permission_errors_in_one_line(vars(arguments).values()):
            summary = job(arguments)
    except Exception as error:
        status = reported_status(error)
        if status is None:
            raise
        return status
    if print_summary and as_json:
        print(json.dumps(summary, indent=2, default=str))
    elif print_summary:
        text = for_people(summary)
        output = getattr(arguments, "output", "")
        print(text if not output or output in text else f"{text}\noutput: {output}")
    return 0
