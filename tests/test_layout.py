"""The import rule that keeps the layout readable: steps import the library, never each other; the library
imports no step and no ``pipelines`` module; ``components`` never imports ``pipelines``."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = sorted(path for path in (ROOT / "components").glob("*.py") if path.name != "__init__.py")
LIBRARY = sorted((ROOT / "components" / "lib").glob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module the file at ``path`` (in ``package``) imports, at the top or inside a function, relative
    imports resolved."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = (
                importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if node.level
                else node.module
            )
            modules.add(module)
            modules.update(f"{module}.{alias.name}" for alias in node.names)  # from components import train
    return modules


def forbidden_imports(path: Path, package: str) -> list[str]:
    """What the file imports against the rule: a step, or ``pipelines``."""
    step_names = {step.stem for step in STEPS}
    found = set()
    for module in imported_modules(path, package):
        parts = module.split(".")
        if parts[0] == "pipelines" or (parts[0] == "components" and len(parts) > 1 and parts[1] in step_names):
            found.add(".".join(parts[:2]))
    return sorted(found)


@pytest.mark.parametrize(
    "path", [*STEPS, *LIBRARY, ROOT / "components" / "__init__.py"], ids=lambda path: str(path.relative_to(ROOT))
)
def test_components_import_only_the_library(path):
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    assert forbidden_imports(path, package) == []


def test_the_rule_catches_a_step_importing_a_step_and_the_library_importing_pipelines(tmp_path):
    step = tmp_path / "push.py"
    step.write_text("from components.train import SUMMARY_FILE\n\ndef f():\n    from components import evaluate\n")
    relative = tmp_path / "report.py"
    relative.write_text("from .preflight import check_memory\nfrom .lib import storage\n")
    library = tmp_path / "results.py"
    library.write_text("import pipelines.pipeline\nfrom components.lib import storage\nfrom .. import shards\n")
    assert forbidden_imports(step, "components") == ["components.evaluate", "components.train"]
    assert forbidden_imports(relative, "components") == ["components.preflight"]
    assert forbidden_imports(library, "components.lib") == ["components.shards", "pipelines.pipeline"]


def test_every_step_runs_as_a_module_and_is_listed_by_the_command_line():
    from pipelines.cli import JOBS

    listed = {module for module, _ in JOBS.values() if module.startswith("components.")}
    assert listed == {f"components.{step.stem}" for step in STEPS}
    for step in STEPS:
        assert 'if __name__ == "__main__":' in step.read_text(), step.name


def test_a_run_s_batch_is_counted_in_one_place():
    """The global batch, steps, samples and tokens of a run come from components.lib.run_shape alone: a second
    product of the batch settings elsewhere could count a run differently (the estimate against the train step)."""
    counted = re.compile(
        r"per_replica_batch_size\s*\*|\*\s*(arguments\.)?per_replica_batch_size|^\s*global_batch(_size)?\s*=[^=]"
    )
    places = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("components", "pipelines", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "run_shape.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if counted.search(line.split("#", 1)[0])
    ]
    assert places == []


def test_a_run_s_flops_memory_and_hours_are_derived_in_one_place():
    """The model FLOPs, one replica's memory and the hours at an assumed MFU come from run_shape alone: the
    estimate, preflight, submit and the smoke test all read a RunShape."""
    derived = re.compile(r"\b(training_memory|training_flops_per_token)\(|/\s*3600\b.*\bmfu\b|\bmfu\b.*/\s*3600\b")
    places = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("components", "pipelines", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if path.name not in ("run_shape.py", "memory_model.py", "modeling.py")  # run_shape, and where it calls
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if derived.search(line.split("#", 1)[0])
    ]
    assert places == []


def test_the_readme_s_layout_names_every_module():
    """The README's Layout section is the map a newcomer reads first: a module it does not name is one they
    will not find."""
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") : readme.index("\n## ", readme.index("## Layout") + 1)]
    unnamed = [
        str(path.relative_to(ROOT))
        for folder in ("components", "pipelines", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "__init__.py" and f"`{path.stem}`" not in layout and f"`{path.name}`" not in layout
    ]
    assert unnamed == []
