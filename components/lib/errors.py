"""The errors a step reports in one line: bad input (before it spends time or writes anything), and an
outside service that kept failing after retries."""


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
