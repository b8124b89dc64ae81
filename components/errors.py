"""The error every step raises for bad input, before it spends time or writes anything."""


class InvalidParameter(ValueError):
    """A parameter's value cannot work. The message names the parameter, the value and what would be valid."""

    def __init__(self, parameter: str, value: object, expected: str):
        self.parameter = parameter
        self.value = value
        flag = "--" + parameter.replace("_", "-")
        super().__init__(f"{flag}={value!r}: {expected}")
