"""The errors a step reports in one line: bad input (before it spends time or writes anything), a training whose
loss stopped being finite, and an outside service that kept failing after retries."""


def first_line(error: BaseException) -> str:
    """What an error says, in one line: its message's first line, else its type's name (a message-less error)."""
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


class InvalidParameter(ValueError):
    """A parameter's value cannot work. The message names the parameter, the value and what would be valid."""

    def __init__(self, parameter: str, value: object, expected: str):
        self.parameter = parameter
        self.value = value
        self.expected = expected
        flag = "--" + parameter.replace("_", "-")
        super().__init__(f"{flag}={value!r}: {expected}")


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
