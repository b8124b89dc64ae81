"""Deletes what a pipeline run left in storage, by the run's name (its Vertex AI pipeline job id, as submit prints
it): its steps' artifacts, its checkpoints and its TensorBoard logs. Without --yes it is a dry run that deletes
nothing: each folder, what it is, its objects and bytes, kept or to delete, the totals, what the deleted part costs a
month, and the command that deletes it.

    tpu-mlm clean tpu-mlm-20260101-120000 --pipeline_root gs://MY_BUCKET/root
    tpu-mlm clean tpu-mlm-20260101-120000 --pipeline_root gs://MY_BUCKET/root --yes
    tpu-mlm clean tpu-mlm-20260101-120000 --pipeline_root gs://MY_BUCKET/root \\
        --output_root gs://MY_BUCKET/runs --keep model --yes
    tpu-mlm clean tpu-mlm-pretraining-2026-12-04-00-00-21-732449 --pipeline_root runs --keep ''   (a run-local run)

(``python -m pipelines.clean RUN ...`` alike.) The run's folders are found by listing, with object permissions only
(list, get, delete: the README's roles/storage.objectUser on the bucket):

* PIPELINE_ROOT/PROJECT_NUMBER/RUN/TASK/...: the steps' artifacts on Vertex AI (PIPELINE_ROOT/RUN/TASK/... under
  kfp.local), and OUTPUT_ROOT/RUN/TASK/... where the run's output_root parameter moved them;
* ROOT/checkpoints/RUN and ROOT/tensorboard/RUN, ROOT being the output_root, else the pipeline root.

By default the model, the reports and the TensorBoard logs are kept: the model is what the run paid for (its folder
holds its tokenizer), the reports and logs are small and say what it learnt and cost. The checkpoints and the data
(tokenizer and shards), the bulk of it, go; --keep '' deletes it all. A fixed checkpoint_dir is not the run's own
(other runs may resume from it): name it with --checkpoint_dir to be reminded of it. Clean a run that has ended
(tpu-mlm status RUN): a step still running would find its files gone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib import attempts, storage
from components.lib.errors import InvalidParameter
from components.lib.job_runner import run_job
from pipelines.run_folders import (
    CHECKPOINTS,
    TENSORBOARD,
    checkpoint_folder,
    run_as_flag,
    run_name,
    tensorboard_folder,
)

DATA, MODEL, REPORTS = "data", "model", "reports"
KEEPABLE = (MODEL, REPORTS, TENSORBOARD, CHECKPOINTS, DATA)  # in the order --keep is printed
DEFAULT_KEEP = f"{MODEL},{REPORTS},{TENSORBOARD}"
OTHER = "other"  # the pipeline's own records (a loop's plan, the push's result, run-local's logs): go with the run
# each task of the pipeline by what its folder holds (its name without KFP's "-2" for a second use of a component
# and Vertex AI's "_EXECUTIONID"); a folder of no task here is OTHER
TASK_KINDS = {
    "tokenizer-step": DATA,
    "shards-step": DATA,
    "merge-shards-step": DATA,
    "train-step": MODEL,
    "preflight-step": REPORTS,
    "evaluate-step": REPORTS,
    "downstream-step": REPORTS,
    "report-step": REPORTS,
    "part-indices": OTHER,
    "push-step": OTHER,
    "for-loop": OTHER,
    "condition": OTHER,
}
TASK_SUFFIXES = re.compile(r"(-\d+)?(_\d+)?$")
LOOP_ITERATION = re.compile(r"for-loop-\d+-iteration-\d+")  # kfp.local's folder of one loop iteration's tasks
RESOURCE_NAME = re.compile(r"projects/[^/]+/locations/[^/]+/pipelineJobs/[^/]+")
# Cloud Storage's Standard class in a region (us-central1): $0.000027397 a GiB-hour on
# https://cloud.google.com/storage/pricing (as transcribed on 2026-09-20 in api-evangelist/gcp-cloud-storage,
# plans/gcp-cloud-storage-plans-pricing.yml), 730 hours a month: $0.020 a GiB-month. Multi-regions cost more.
STANDARD_PRICE_PER_GIB_MONTH = 0.020
GIB = 2**30
CACHING_WARNING = (
    "warning: Vertex AI caches the tokenizer and shards steps: a later run with the same inputs gets this run's data "
    "instead of writing its own, and would read deleted files; submit later runs with --enable_caching false, or keep "
    "data."
)


def clean_run_name(run: str) -> str:
    """The run's name, refused in one line where it could name more than the run's own folders: a path ("a/b" is
    not cut to "b" as a resource name is), or the folder beside the runs that holds every run's checkpoints or
    TensorBoard logs."""
    if "/" in run and not RESOURCE_NAME.fullmatch(run.strip()):
        raise InvalidParameter(
            "run", run, "must be a run's name or resource name (projects/P/locations/R/pipelineJobs/NAME), not a path"
        )
    name = run_name(run)
    if name in (CHECKPOINTS, TENSORBOARD):
        raise InvalidParameter("run", run, f"is the folder of every run's {name}, not a run")
    return name


@dataclass(kw_only=True)
class CleanArguments:
    run: str = field(
        metadata={"help": "The run's name as submit prints it, or its resource name; also taken as the first word."}
    )
    pipeline_root: str = field(
        metadata={"help": "The pipeline root the run had (submit's --pipeline_root; run-local's, runs by default)."}
    )
    output_root: str = field(default="", metadata={"help": "The run's output_root parameter, if it had one."})
    keep: str = field(
        default=DEFAULT_KEEP,
        metadata={
            "help": "What to keep, a comma list of model, reports, tensorboard, checkpoints and data (tokenizer and "
            "shards); '': nothing."
        },
    )
    checkpoint_dir: str = field(
        default="",
        metadata={"help": "The run's fixed checkpoint_dir parameter, if it had one: never deleted, named in a hint."},
    )
    price_per_gb_month: float = field(
        default=STANDARD_PRICE_PER_GIB_MONTH,
        metadata={
            "help": "Storage price, $ a GiB-month (default: Standard class in us-central1; multi-regions cost more)."
        },
    )
    yes: bool = field(default=False, metadata={"help": "Delete. Without it: a dry run that deletes nothing."})

    def __post_init__(self) -> None:
        self.run = clean_run_name(self.run)
        storage.check_uri("pipeline_root", self.pipeline_root)
        for name in ("output_root", "checkpoint_dir"):
            if getattr(self, name):
                storage.check_uri(name, getattr(self, name))
        kept = {part.strip() for part in self.keep.split(",") if part.strip()}
        if kept - set(KEEPABLE):
            raise InvalidParameter("keep", self.keep, f"must be a comma list of {', '.join(KEEPABLE)}, or ''")
        self.keep = ",".join(kind for kind in KEEPABLE if kind in kept)  # one spelling, for the command it prints
        if self.price_per_gb_month < 0:
            raise InvalidParameter("price_per_gb_month", self.price_per_gb_month, "must be 0 or above")

    def roots(self) -> list[str]:
        return list(dict.fromkeys(root for root in (self.pipeline_root, self.output_root) if root))


@dataclass
class RunFolder:
    """A folder of the run, deleted or kept whole: a task's, the run's checkpoints or TensorBoard logs, or the files
    of a run folder itself (``uri`` is then ``run_folder``)."""

    uri: str
    what: str
    kind: str
    files: list[tuple[str, int]]
    keep: bool
    run_folder: str = ""  # ROOT/RUN or PIPELINE_ROOT/PROJECT_NUMBER/RUN holding the task; "" for checkpoints, logs

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files)


def task_runs(arguments: CleanArguments) -> list[str]:
    """The folders that hold the run's tasks: PIPELINE_ROOT/PROJECT_NUMBER/RUN (Vertex AI, any project number) and
    ROOT/RUN (kfp.local, output_root). A glob, not a listing of the root: TensorFlow lists a folder after asking
    whether it is one, which for a bucket's root is a bucket request (see ``storage.is_bucket``)."""
    vertex = [
        folder
        for folder in storage.glob(storage.join(arguments.pipeline_root, "*", arguments.run))
        if storage.basename(storage.dirname(folder)).isdigit()
    ]
    return list(dict.fromkeys([*vertex, *(storage.join(root, arguments.run) for root in arguments.roots())]))


def task_folder(relative: str) -> str:
    """The task folder, in its run folder, of a file at ``relative`` there: its first part, its first two in a
    kfp.local loop iteration's folder; "" for a file of the run folder itself."""
    parts = relative.split("/")[:-1]
    return "/".join(parts[: 2 if parts and LOOP_ITERATION.fullmatch(parts[0]) else 1])


def task_kind(task: str) -> str:
    return TASK_KINDS.get(TASK_SUFFIXES.sub("", storage.basename(task)), OTHER) if task else OTHER


def run_folders(arguments: CleanArguments) -> list[RunFolder]:
    """Every folder of the run that holds a file, with its files, and whether ``--keep`` keeps it."""
    kept = set(arguments.keep.split(","))
    found = []
    for run_folder in task_runs(arguments):
        tasks: dict[str, list[tuple[str, int]]] = {}
        for path, size in storage.files_under(run_folder):
            relative = path[len(run_folder) :].replace(os.sep, "/").lstrip("/")
            tasks.setdefault(task_folder(relative), []).append((path, size))
        for task, files in tasks.items():
            kind = task_kind(task)
            uri = storage.join(run_folder, task) if task else run_folder
            what = f"{TASK_SUFFIXES.sub('', storage.basename(task))}: {kind}" if task else f"run folder's files: {kind}"
            found.append(RunFolder(uri, what, kind, files, kind in kept, run_folder))
    for root in arguments.roots():
        for kind, folder in ((CHECKPOINTS, checkpoint_folder), (TENSORBOARD, tensorboard_folder)):
            uri = folder(root, arguments.run)
            files = storage.files_under(uri)
            if files:
                found.append(RunFolder(uri, kind, kind, files, kind in kept))
    return sorted(found, key=lambda folder: folder.uri)


def delete(doomed: list[RunFolder], kept: list[RunFolder]) -> None:
    """Deletes the objects of the ``doomed`` folders, then the folders, children first; a run folder only when it
    holds nothing kept."""
    for folder in doomed:
        for path, _ in folder.files:
            storage.remove(path)
    holding_kept = {folder.run_folder for folder in kept}
    emptied = {folder.uri for folder in doomed} | {folder.run_folder for folder in doomed}
    for uri in sorted(emptied - holding_kept - {""}, reverse=True):
        storage.remove_folder(uri)


def delete_command(arguments: CleanArguments) -> str:
    words = ["tpu-mlm", "clean", arguments.run, "--pipeline_root", arguments.pipeline_root]
    if arguments.output_root:
        words += ["--output_root", arguments.output_root]
    return shlex.join([*words, "--keep", arguments.keep, "--yes"])


def clean(arguments: CleanArguments) -> dict[str, Any]:
    """Finds the run's folders and, with --yes, deletes those --keep does not keep; returns what it found and did."""
    folders = run_folders(arguments)
    doomed = [folder for folder in folders if not folder.keep]
    kept = [folder for folder in folders if folder.keep]
    for folder in doomed:
        if folder.kind == CHECKPOINTS:
            refuse_while_training(folder.uri)
    if arguments.yes:
        delete(doomed, kept)
    keeping, deleting = ("kept", "deleted") if arguments.yes else ("keep", "delete")
    delete_bytes = sum(folder.bytes for folder in doomed)
    summary: dict[str, Any] = {
        "run": arguments.run,
        "dry_run": not arguments.yes,
        "roots": arguments.roots(),
        "folders": [
            {
                "folder": folder.uri,
                "what": folder.what,
                "objects": len(folder.files),
                "bytes": folder.bytes,
                "action": keeping if folder.keep else deleting,
            }
            for folder in folders
        ],
        "delete_objects": sum(len(folder.files) for folder in doomed),
        "delete_bytes": delete_bytes,
        "keep_objects": sum(len(folder.files) for folder in kept),
        "keep_bytes": sum(folder.bytes for folder in kept),
        "price_per_gb_month": arguments.price_per_gb_month,
        "monthly_cost": delete_bytes / GIB * arguments.price_per_gb_month,
        "warnings": [CACHING_WARNING] if any(folder.kind == DATA for folder in doomed) else [],
    }
    if doomed and not arguments.yes:
        summary["command"] = delete_command(arguments)
    if arguments.checkpoint_dir and arguments.checkpoint_dir not in {folder.uri for folder in folders}:
        summary["hint"] = (
            f"the run's checkpoint_dir {arguments.checkpoint_dir} is not deleted (other runs may resume from it); "
            f"when none will: gcloud storage rm -r {arguments.checkpoint_dir}"
        )
    return summary


def refuse_while_training(folder: str) -> None:
    """Refuses to delete a checkpoint folder a training is still running in: this run's, or one resumed from it
    (submit --resume trains in the checkpoints of the run it resumes), by the attempt its attempts.json records."""
    record = storage.join(folder, attempts.FILE)
    if storage.exists(record):
        tries = json.loads(storage.read_text(record))
        if tries and tries[-1]["outcome"] == "running":
            raise InvalidParameter(
                "run",
                storage.basename(folder),
                f"a training is running in {folder} (started {tries[-1]['started']}; this run or one resumed from it): "
                "clean it once that run has ended (tpu-mlm status), or --keep checkpoints",
            )


def readable_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows in columns: text left, figures (the third and fourth column) right."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if column in (2, 3) else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def summary_for_people(summary: dict[str, Any]) -> str:
    run, folders = summary["run"], summary["folders"]
    if not folders:
        return f"run {run}: no folder of it under {' or '.join(summary['roots'])}: nothing to delete (check the name)"
    rows = [("folder", "what", "objects", "bytes", "action")]
    rows += [(f["folder"], f["what"], f"{f['objects']:,}", f"{f['bytes']:,}", f["action"]) for f in folders]
    deleted = "to delete" if summary["dry_run"] else "deleted"
    rows.append((deleted, "", f"{summary['delete_objects']:,}", f"{summary['delete_bytes']:,}", ""))
    rows.append(("kept", "", f"{summary['keep_objects']:,}", f"{summary['keep_bytes']:,}", ""))
    if not summary["delete_objects"]:
        heading = f"run {run}: nothing left to delete"
    elif summary["dry_run"]:
        heading = f"run {run}: dry run, nothing deleted"
    else:
        heading = f"run {run}: deleted {summary['delete_objects']:,} objects"
    lines = [heading, "", *table(rows), ""]
    if summary["delete_objects"]:
        price = summary["price_per_gb_month"]
        source = "Standard, us-central1" if price == STANDARD_PRICE_PER_GIB_MONTH else "--price_per_gb_month"
        saved = "a month to save" if summary["dry_run"] else "a month saved"
        lines.append(
            f"{readable_size(summary['delete_bytes'])} {deleted}: ${summary['monthly_cost']:,.2f} {saved} at "
            f"${price:.3f} a GiB-month ({source})"
        )
    lines += summary["warnings"]
    if "hint" in summary:
        lines.append(summary["hint"])
    if "command" in summary:
        lines.append(f"to delete them: {summary['command']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(CleanArguments, clean, run_as_flag(argv), description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
