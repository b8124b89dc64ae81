"""The import rule that keeps the layout readable: steps import the library, never each other; the library
imports no step and no ``pipelines`` module; ``components`` never imports ``pipelines``."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = sorted(path for path in (ROOT / "components").glob("*.py") if path.name != "__init__.py")
LIBRARY = sorted((ROOT / "components" / "lib").glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            if node.module == "components":  # from components import tokenizer
                modules.update(f"components.{alias.name}" for alias in node.names)
    return modules


def forbidden_imports(path: Path) -> list[str]:
    step_names = {step.stem for step in STEPS}
    found = []
    for module in sorted(imported_modules(path)):
        parts = module.split(".")
        if parts[0] == "pipelines" or (parts[0] == "components" and len(parts) > 1 and parts[1] in step_names):
            found.append(module)
    return found


@pytest.mark.parametrize("path", STEPS + LIBRARY, ids=lambda path: str(path.relative_to(ROOT)))
def test_components_import_only_the_library(path):
    assert forbidden_imports(path) == []


def test_the_rule_catches_a_step_importing_a_step_and_the_library_importing_pipelines(tmp_path):
    step = tmp_path / "push.py"
    step.write_text("from components.train import SUMMARY_FILE\n\ndef f():\n    from components import evaluate\n")
    library = tmp_path / "results.py"
    library.write_text("import pipelines.pipeline\nfrom components.lib import storage\n")
    assert forbidden_imports(step) == ["components.evaluate", "components.train"]
    assert forbidden_imports(library) == ["pipelines.pipeline"]


def test_every_step_runs_as_a_module_and_is_listed_by_the_command_line():
    from pipelines.cli import JOBS

    listed = {module for module, _ in JOBS.values() if module.startswith("components.")}
    assert listed == {f"components.{step.stem}" for step in STEPS}
    for step in STEPS:
        assert 'if __name__ == "__main__":' in step.read_text(), step.name
