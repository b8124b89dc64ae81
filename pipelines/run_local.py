"""Run the whole pipeline on this machine under ``kfp.local``, then show what it made.

The default is a first run in minutes on 2 cores: the embedded corpus, a 1,000-piece tokenizer, samples of 32
tokens and the ``mini`` model (``LOCAL_DEFAULTS``), every step a subprocess in this environment
(``SubprocessRunner``, no Docker). With ``--docker`` each step runs in the project's CPU image through
``DockerRunner`` instead. Every pipeline
parameter is a flag here (``--help`` lists them), with defaults for a small CPU run.

It prints one line per step as the step finishes (its name, status, seconds and one figure), and each step's
full log goes to a file under the run's folder (``--verbose`` streams everything instead). A failing step ends the
run with the step's one line (its ``error: ...``; the end of its log where it printed none, a crash) and exits with
the step's exit status, as the step run on its own would. At the end it prints where each artifact is, the
evaluation metrics and a fill-mask example.

    python -m pipelines.run_local [--corpus FILES] [--model_config tiny] [--docker] [--verbose]
"""

import contextlib
import datetime
import json
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, TextIO

from components.lib import storage
from components.lib.errors import InvalidParameter, ReportedFailure
from components.lib.hub import check_repo_id, hub_token
from components.lib.job_runner import run_job
from components.lib.recipe import RECIPE_VALUE
from components.lib.results import (
    BASE_MODEL,
    METRICS_FILE,
    PROBE_MODELS,
    baselines_line,
    fill_mask_line,
    read_downstream,
    shown_score,
    standard_error,
)
from pipelines.pipeline import DEFAULT_CPU_IMAGE, build_pipeline, check_values, pipeline_parameters
from pipelines.run_folders import PIPELINE_NAME, local_run_recorded
from pipelines.submit import check_parts

# The folder of each artifact inside a run, by task and output name, in the order they are made.
ARTIFACTS = {
    "tokenizer": "tokenizer-step/tokenizer",
    "train shards": "merge-shards-step/shards",
    "validation shards": "merge-shards-step-2/shards",
    "model": "train-step/model",
    "evaluation": "evaluate-step/evaluation",
    "evaluation report": "evaluate-step/report",
    "downstream probe": "downstream-step/downstream_results",
    "run report": "report-step/report",
}
# What a push from inside a step's container needs from this environment.
HUB_ENVIRONMENT = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")
# The ones that move to --output_root when it is set (the reports are KFP's, they stay with the run).
DATA_ARTIFACTS = ("tokenizer", "train shards", "validation shards", "model", "evaluation", "downstream probe")
# A small CPU run's settings, where they differ from the pipeline's defaults (which are a TPU run's): a first run
# of a few minutes here that shows the recipe learning, its validation perplexity about half the unigram
# baseline's (0.48 to 0.69 of it measured: README, Quick start). Short samples and a small vocabulary give
# context that a small model learns to use within minutes; at 128 tokens and 5,000 pieces it only learns the
# pieces' frequencies.
LOCAL_DEFAULTS = {
    "vocab_size": 1_000,
    "max_length": 32,
    "model_config": "mini",
    "per_replica_batch_size": 64,
    "gradient_accumulation_steps": 1,  # 0 would be a TPU's accumulation where one is found
    "max_steps": 700,
    "learning_rate": 2e-3,  # higher for a small model from scratch (SMALL_MODEL_KNOBS)
    "warmup_fraction": 0.1,
    "log_every_steps": 50,
    # the built-in word-order task, on a few hundred labelled windows at a small model's rate: the first run shows
    # the probe's verdict and its baselines in about 40 s. make run's model has no signal on it at any rate of a
    # grid, nor at 100 fine-tuning steps (docs/benchmarks.md), so the first run does not pay for the grid's search
    # (the pipeline's default) and fine-tunes for 60 steps (7.5 epochs of its samples)
    "downstream_max_train_samples": 256,
    "downstream_max_steps": 60,
    "downstream_learning_rates": "1e-3",
    "downstream_seeds": "1,2,3",
}
# make run's knobs for a small model from scratch: a run continuing a model (init_from) left at them takes its
# recipe's (dapt-2020's) instead, as the pipeline does
SMALL_MODEL_KNOBS = ("learning_rate", "warmup_fraction")
# The figure a step's line shows: (its output metadata's key, how to show it), by task name without suffix.
STEP_FIGURES = {
    "tokenizer-step": ("vocab_size", "{:,.0f} pieces"),
    "shards-step": ("num_records", "{:,.0f} samples"),
    "merge-shards-step": ("num_records", "{:,.0f} samples"),
    "train-step": ("last_loss", "loss {:.4f}"),
    "evaluate-step": ("perplexity", "perplexity {:,.1f}"),
    "downstream-step": ("gain", "gain {:+.3f}"),
}


@dataclass(kw_only=True)
class LocalRunOptions:
    """How the pipeline runs here; the pipeline's parameters are added as fields below."""

    pipeline_root: str = field(default="runs", metadata={"help": "Local folder for the runs (kfp.local's own)."})
    docker: bool = field(default=False, metadata={"help": "Run each step in the CPU image with DockerRunner."})
    image: str = field(default=DEFAULT_CPU_IMAGE, metadata={"help": "Image for --docker (local name:tag)."})
    verbose: bool = field(default=False, metadata={"help": "Stream every step's log here instead of one line."})

    def __post_init__(self) -> None:
        if self.hub_repo_id:
            check_repo_id("hub_repo_id", self.hub_repo_id)
            hub_token("hub_repo_id", self.hub_repo_id)  # before any step runs, not at the end
        if "://" in self.pipeline_root:
            raise InvalidParameter(
                "pipeline_root", self.pipeline_root, "kfp.local needs a local folder; put gs:// in --output_root"
            )
        if self.output_root:
            storage.check_uri("output_root", self.output_root)
        # what submit checks before it creates a run: every step's checks, the model config, the corpus's parts
        check_values(self.pipeline_values())
        check_parts(self.pipeline_values())

    def pipeline_values(self) -> dict[str, Any]:
        values = {parameter.name: getattr(self, parameter.name) for parameter in PARAMETERS}
        if values["init_from"]:
            values |= {knob: float(RECIPE_VALUE) for knob in SMALL_MODEL_KNOBS if values[knob] == LOCAL_DEFAULTS[knob]}
        if self.docker and values["accelerator"] == "auto":
            values["accelerator"] = "cpu"  # the CPU image has no accelerator runtime to probe
        return values


PARAMETERS = pipeline_parameters(LOCAL_DEFAULTS)
RunLocalArguments = make_dataclass(
    "RunLocalArguments",
    [
        (parameter.name, parameter.type, field(default=parameter.default, metadata=parameter.metadata))
        for parameter in PARAMETERS
    ],
    bases=(LocalRunOptions,),
    kw_only=True,
)
RunLocalArguments.__module__ = __name__
RunLocalArguments.__doc__ = "The local run's options and every pipeline parameter (pipelines.pipeline)."


class StepLines:
    """Stands in for ``sys.stdout`` while kfp.local runs: each task's lines go to ``<run>/logs/<task>.log``, and
    one line per finished task goes to ``out``. It follows kfp.local's own markers ("Executing task", "finished
    with status", the outputs it lists, a horizontal rule). kfp.local makes the run's folder only once its first
    task has run, so a task's lines wait in memory until the folder is there."""

    START = re.compile(r"Executing task '([\w-]+)'")
    FINISH = re.compile(r"Task '([\w-]+)' finished with status (\w+)")
    ANSI = re.compile(r"\x1b\[[0-9;]*m")

    def __init__(self, run_dir: Callable[[], Path | None], labels: dict[str, str], out: TextIO) -> None:
        self.run_dir, self.labels, self.out = run_dir, labels, out
        self.pending = ""
        self.task = ""
        self.lines: list[str] = []
        self.log: TextIO | None = None
        self.log_path: Path | None = None
        self.started = self.seconds = 0.0
        self.status = ""
        self.failed: FailedStep | None = None  # the first task that failed, once its end is read

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._line(self.ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        if self.log is not None:
            self.log.flush()

    def _line(self, line: str) -> None:
        if start := self.START.search(line):
            self.task, self.lines, self.status, self.started = start.group(1), [], "", time.perf_counter()
            self._open_log()
        if not self.task:
            return  # kfp.local's lines about the whole run
        if self.status and line.startswith("---"):
            self._end()
            return
        if finish := self.FINISH.search(line):
            self.status, self.seconds = finish.group(2), time.perf_counter() - self.started
        self.lines.append(line)
        if self.log is not None:
            self.log.write(line + "\n")

    def _open_log(self) -> None:
        folder = self.run_dir()
        if folder is None:
            return
        (folder / "logs").mkdir(exist_ok=True)
        self.log_path = folder / "logs" / f"{self.task}.log"
        self.log = self.log_path.open("w")
        self.log.writelines(line + "\n" for line in self.lines)

    def _end(self) -> None:
        if self.log is None:
            self._open_log()
        key, form = STEP_FIGURES.get(re.sub(r"-\d+$", "", self.task), ("", ""))
        found = re.search(rf"'{key}': ([-0-9.e+]+)", " ".join(self.lines)) if key else None
        figure = form.format(float(found.group(1))) if found else ""
        label = self.labels.get(self.task, self.task)
        print(f"{label:<23} {self.status:<8} {self.seconds:6.1f} s  {figure:<18} {self.log_path}", file=self.out)
        if self.status == "FAILURE" and self.failed is None:
            self.failed = FailedStep(label, [line.strip() for line in self.lines], self.log_path)
        self.close()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        self.task, self.log = "", None


# the end of a failed step's log shown when it printed no one line (a crash): its traceback's last frames
CRASH_LINES = 20


@dataclass
class FailedStep:
    """A task that failed: its display name, its log's lines (stripped of kfp.local's indent) and the log's file."""

    label: str
    lines: list[str]
    log_path: Path | None

    def failure(self, status: int) -> ReportedFailure:
        """What ends the run: the step's exit status and its one line, the last ``error: ...`` it printed (what
        ``components.lib.job_runner`` prints); for a step that printed none, its log's end goes to stderr first."""
        reported = [line.removeprefix("error: ") for line in self.lines if line.startswith("error: ")]
        if reported:
            return ReportedFailure(status, reported[-1])
        ending = [line for line in self.lines if not line.startswith(("Task '", "---"))][-CRASH_LINES:]
        print("\n".join(ending), file=sys.stderr)
        return ReportedFailure(status, f"{self.label} failed (exit status {status}); its whole log: {self.log_path}")


@contextlib.contextmanager
def step_exit_statuses() -> Iterator[list[int]]:
    """The exit statuses of the steps' processes, in the order they end, while the pipeline runs under kfp.local:
    it reports a task only as SUCCESS or FAILURE, so its calls that run a step (SubprocessRunner's and
    DockerRunner's) are wrapped to keep the status. A signal's death is 128 + the signal, as a shell reports it."""
    from kfp.local import docker_task_handler, subprocess_task_handler

    statuses: list[int] = []
    wrapped = ((subprocess_task_handler, "run_local_subprocess"), (docker_task_handler, "run_docker_container"))
    originals = [getattr(module, name) for module, name in wrapped]

    def recording(run: Callable[..., int]) -> Callable[..., int]:
        def run_and_record(*args: Any, **kwargs: Any) -> int:
            status = run(*args, **kwargs)
            statuses.append(status if status >= 0 else 128 - status)
            return status

        return run_and_record

    for (module, name), original in zip(wrapped, originals, strict=True):
        setattr(module, name, recording(original))
    try:
        yield statuses
    finally:
        for (module, name), original in zip(wrapped, originals, strict=True):
            setattr(module, name, original)


def new_run_folder(root: Path, before: set[Path], started_at: datetime.datetime) -> Path | None:
    """The folder kfp.local made for the run started at ``started_at`` under ``root``, once it did: of the folders
    not there ``before``, the one named nearest that start (another run-local under the same root makes its own)."""
    new = set(root.glob(f"{PIPELINE_NAME}-*")) - before
    return min(new, key=lambda folder: abs(folder_start(folder) - started_at)) if new else None


def folder_start(folder: Path) -> datetime.datetime:
    """When the kfp.local run of ``folder`` started, as its name says (``NAME-%Y-%m-%d-%H-%M-%S-%f``)."""
    try:
        return datetime.datetime.strptime(folder.name[len(PIPELINE_NAME) + 1 :], "%Y-%m-%d-%H-%M-%S-%f")
    except ValueError:
        return datetime.datetime.min  # not kfp.local's name: last of all


def run_local(arguments: LocalRunOptions) -> dict[str, Any]:
    """Runs the pipeline under kfp.local and returns the artifacts' folders and the evaluation metrics."""
    from kfp import local

    root = Path(arguments.pipeline_root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if arguments.docker:
        # host networking: steps may read a Hub dataset or gs://, and engines without a bridge network work too.
        # The Hub settings go into the containers' environment (never into a command line or a parameter).
        environment = {name: os.environ[name] for name in HUB_ENVIRONMENT if name in os.environ}
        runner = local.DockerRunner(network_mode="host", environment=environment)
    else:
        runner = local.SubprocessRunner(use_venv=False)  # the steps inherit this process's environment
    local.init(runner=runner, pipeline_root=str(root))
    pipeline = build_pipeline("local", cpu_image=arguments.image)
    before = set(root.glob(f"{PIPELINE_NAME}-*"))
    started_at = datetime.datetime.now()  # kfp.local names the run's folder by its local start time
    found: list[Path] = []

    def run_dir() -> Path | None:
        if not found:  # chosen once: a later look could find another run-local's folder too
            found.extend(filter(None, [new_run_folder(root, before, started_at)]))
        return found[0] if found else None

    values = arguments.pipeline_values()
    started = time.perf_counter()
    with local_run_recorded(run_dir, values):
        if arguments.verbose:
            with step_exit_statuses() as statuses:
                try:
                    pipeline(**values)
                except RuntimeError:  # kfp.local's "Pipeline ... finished with status FAILURE"
                    if not any(statuses):
                        raise
                    status = next(status for status in statuses if status)
                    raise ReportedFailure(status, f"a step failed (exit status {status}); its log is above") from None
        else:
            run_quietly(pipeline, values, run_dir)
    folder = run_dir()
    assert folder is not None, "kfp.local made no run folder"
    artifacts = {name: str(folder / relative) for name, relative in ARTIFACTS.items()}
    for name in DATA_ARTIFACTS:
        artifacts[name] = storage.relocate(artifacts[name], values["output_root"])
    metrics = json.loads(storage.read_text(storage.join(artifacts["evaluation"], METRICS_FILE)))
    summary = {
        "run": str(folder),
        "seconds": round(time.perf_counter() - started, 1),
        "artifacts": artifacts,
        "metrics": {
            key: metrics[key]
            for key in (
                "loss",
                "loss_standard_error",
                "perplexity",
                "unigram_perplexity",
                "masked_accuracy",
                "masked_tokens",
            )
        },
        "fill_mask": metrics["fill_mask"][:1],
        "downstream": read_downstream(artifacts["downstream probe"]),
    }
    print_summary(summary)
    return summary


def display_names(pipeline: Any) -> dict[str, str]:
    """Each task's display name (``set_display_name``), by task name, from the pipeline's spec."""
    spec = pipeline.pipeline_spec
    dags = [spec.root.dag, *(component.dag for component in spec.components.values())]
    return {name: task.task_info.name for dag in dags for name, task in dag.tasks.items()}


def run_quietly(
    pipeline: Any, values: dict[str, Any], run_dir: Callable[[], Path | None], labels: dict[str, str] | None = None
) -> None:
    """Runs the pipeline with one line per step on stderr. A failing step ends it with the step's exit status and
    its one line (``FailedStep.failure``), not kfp.local's traceback."""
    lines = StepLines(run_dir, display_names(pipeline) if labels is None else labels, sys.stderr)
    root_logger = logging.getLogger()
    level = root_logger.level
    try:
        with contextlib.redirect_stdout(lines), warnings.catch_warnings(), step_exit_statuses() as statuses:
            # kfp.local's notes that display names and the image do not apply to a local subprocess, and its
            # bookkeeping between tasks (it sets its own level while a task runs)
            warnings.filterwarnings("ignore", module=r"kfp\.local")
            root_logger.setLevel(logging.WARNING)
            pipeline(**values)
    except RuntimeError:  # kfp.local's "Pipeline ... finished with status FAILURE", after the task's end was read
        if lines.failed is None:
            raise
        status = next((status for status in statuses if status), 1)
        raise lines.failed.failure(status) from None
    finally:
        root_logger.setLevel(level)
        lines.close()


def print_summary(summary: dict[str, Any]) -> None:
    lines = [f"\nPipeline run finished in {summary['seconds']} s: {summary['run']}", "", "Artifacts:"]
    lines += [f"  {name:<18} {path}" for name, path in summary["artifacts"].items()]
    metrics = summary["metrics"]
    lines += [
        "",
        "Evaluation (validation shards):",
        f"  loss {metrics['loss']:.4f}{standard_error(metrics)}   perplexity {metrics['perplexity']:.1f}"
        + unigram_note(metrics),
        f"  masked-token accuracy {metrics['masked_accuracy']:.2%} on {metrics['masked_tokens']:,} masked tokens",
    ]
    for example in summary["fill_mask"]:
        lines += ["", f"Fill-mask: {example['sentence']}", f"  {fill_mask_line(example['predictions'])}"]
    probe = summary["downstream"]
    if probe and probe.get("failed"):
        lines += ["", f"Downstream probe failed: {probe['failed']}"]
    elif probe:
        seeds = len(probe["arguments"]["seeds"].split(","))
        lines += ["", f"Downstream probe (fine-tuned from the model and from random weights, {seeds} seed(s)):"]
        for task in probe["tasks"]:
            lines += [
                f"  {task['task']}: {task['metric']} {shown_score(task[PROBE_MODELS[0]])} pre-trained, "
                f"{shown_score(task[PROBE_MODELS[1]])} random init ({task['gain']:+.3f}), "
                + (
                    f"{shown_score(task[BASE_MODEL])} the base as it was ({task['adaptation_gain']:+.3f}), "
                    if BASE_MODEL in task
                    else ""
                )
                + f"on {task['validation_samples']:,} {task['validation_split']} samples",
                f"    trivial baselines: {baselines_line(task)}",
            ]
    print("\n".join(lines) + "\n", file=sys.stderr)


def unigram_note(metrics: dict[str, Any]) -> str:
    if metrics.get("unigram_perplexity") is None:
        return ""
    return f" (predicting each masked token by its frequency: {metrics['unigram_perplexity']:.1f})"


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(RunLocalArguments, run_local, argv, description=__doc__, print_summary=False)


if __name__ == "__main__":
    sys.exit(main())
