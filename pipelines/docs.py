"""Write the table of pipeline parameters from the dataclasses they come from (``make docs``).

The table sits between two markers in docs/steps.md; ``tests/test_parameters.py`` fails when it differs from what
this writes, so the docs cannot drift from the code.

    python -m pipelines.docs [docs/steps.md]
"""

import sys
from pathlib import Path

from components.lib.tpu_catalogue import TPU_TYPES
from pipelines.pipeline import pipeline_parameters, target_defaults
from pipelines.run_local import LOCAL_DEFAULTS

DOC = "docs/steps.md"  # the page of the pipeline's parameters, relative to the project root

BEGIN = "<!-- parameters: written by `make docs` from the dataclasses; do not edit by hand -->"
END = "<!-- /parameters -->"


def parameters_markdown() -> str:
    """One row a parameter: its name, its default (the vertex target's and run-local's where they differ) and
    its field's help."""
    vertex = {name: f"`{value!r}`" for name, value in target_defaults("vertex", TPU_TYPES["v3-8"]).items()}
    vertex["replicas"] = "the TPU's (`8` for a v3-8)"
    rows = ["| parameter | default | run-local | meaning |", "|---|---|---|---|"]
    for parameter in pipeline_parameters():
        default = f"`{parameter.default!r}`"
        if parameter.name in vertex:
            default += f"; vertex: {vertex[parameter.name]}"
        local = f"`{LOCAL_DEFAULTS[parameter.name]!r}`" if parameter.name in LOCAL_DEFAULTS else ""
        rows.append(f"| `{parameter.name}` | {default} | {local} | {parameter.help} |")
    return "\n".join(rows)


def with_table(doc: str) -> str:
    """``doc`` with the table between the markers replaced by the current one."""
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{parameters_markdown()}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0] if argv else DOC)
    path.write_text(with_table(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
