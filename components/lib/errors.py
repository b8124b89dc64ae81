"""The errors a step reports in one line: bad input (before it spends time or writes anything), a training whose
loss stopped being finite, and an outside service that kept failing after retries.

What a refusal shows of a value goes through ``redact``: a value of a secret's parameter (a name holding ``token`` or
``secret``) is never shown, nor anything in a message that looks like a Hub token or a Google access token."""

import re

# a parameter whose value may be a credential: hf_token_secret, an unknown --hf_token or --token; not a tokenizer
SECRET_PARAMETER = re.compile(r"(^|_)(token|secret|password|credentials?|api_key)(_|$)")
# what a credential looks like wherever it appears: a Hub token (hf_ and 34 letters and digits; 20 at least here), a
# Google OAuth access token (ya29.), as a user might paste one into the wrong flag or into --parameters' JSON
CREDENTIALS = re.compile(r"\b(hf_)[A-Za-z0-9]{20,}|\b(ya29\.)[\w.-]+")
REDACTED = "\u2026(redacted)"
# a secret's value in JSON (--parameters '{"hf_token_secret": "..."}'), by its key as SECRET_PARAMETER has it
SECRET_IN_JSON = re.compile(
    r"""(["'](?:[A-Za-z0-9]+_)*(?:token|secret|password|credentials?|api_key)(?:_[A-Za-z0-9]+)*["']\s*:\s*(["']))"""
    r"""((?:(?!\2)[^\\]|\\.)+)(\2)""",  # its value, in either quote, up to the closing one, past escaped ones
    re.IGNORECASE,  # HF_TOKEN as hf_token
)


def first_line(error: BaseException) -> str:
    """What an error says, in one line: its message's first line, else its type's name (a message-less error)."""
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


def is_secret_parameter(parameter: str) -> bool:
    """Whether a parameter's (or flag's) values may be credentials, and are never shown."""
    return bool(SECRET_PARAMETER.search(parameter.lower().lstrip("-").replace("-", "_")))


def redact(text: str) -> str:
    """``text`` with whatever looks like a credential shown as its kind alone (``hf_…(redacted)``), and a secret's
    value in JSON not at all."""
    text = SECRET_IN_JSON.sub(lambda match: match.group(1) + REDACTED + match.group(4), text)
    return CREDENTIALS.sub(lambda match: (match.group(1) or match.group(2)) + REDACTED, text)


def shown_value(parameter: str, value: object) -> str:
    """A value as a refusal shows it: its repr; a secret parameter's only as its kind (hf_, ya29.) when not empty."""
    if is_secret_parameter(parameter) and value not in ("", None):
        text = str(value)
        kind = next((prefix for prefix in ("hf_", "ya29.") if text.startswith(prefix)), "")
        return repr(kind + REDACTED)
    return repr(redact(value)) if isinstance(value, str) else redact(repr(value))  # before repr doubles escapes


class InvalidParameter(ValueError):
    """A parameter's value cannot work. The message names the parameter, the value (``shown_value``: never a
    credential) and what would be valid."""

    def __init__(self, parameter: str, value: object, expected: str):
        self.parameter = parameter
        self.value = value
        self.expected = expected
        flag = "--" + redact(parameter).replace("_", "-")  # a token typed where a flag goes, too
        super().__init__(redact(f"{flag}={shown_value(parameter, value)}: {expected}"))


class ServiceFailed(RuntimeError):
    """An outside service (the Hub) kept failing with errors that are usually transient, retries included."""


class Diverged(RuntimeError):
    """The training's loss or gradient norm stopped being finite: the run stopped with no checkpoint or model written
    from those weights. The message names the step, the learning rate and what to try; ``step`` is the step (the
    TPU job's verdict carries it)."""

    def __init__(self, message: str, step: int | None = None):
        self.step = step
        super().__init__(message)


class StartFailed(ServiceFailed):
    """The accelerator did not start, for a reason a new job (another VM) may not meet: inside the TPU job it ends
    the job with its verdict (status 1) rather than a restart on the same VM, and the launcher's next try creates a
    new job within the run's time left."""


class Refused(RuntimeError):
    """What the platform refused or did not provide, as it would again for another job with the same settings (a TPU
    slice whose hosts are not found or do not come up): reported as Google Cloud's refusals are (exit 3)."""


class ReportedFailure(RuntimeError):
    """A failure another process reported: its exit status and its one line (the TPU job's verdict, which the
    pipeline's launcher ends the task with)."""

    def __init__(self, status: int, line: str):
        self.status = status
        super().__init__(line)
