"""Deletes what a finished pipeline run left in storage, by the run's name (its Vertex AI pipeline job id, as submit
prints it; run-local's run folder's name): its checkpoints and its data (tokenizer and shards) by default, its model,
reports and TensorBoard logs when named. Without --yes it is a dry run that deletes nothing: each folder, what it is,
its objects and bytes, kept or to delete, the totals, what the deleted part costs a month, and the command that
deletes it.

    tpu-mlm clean tpu-mlm-20260101-120000 --project my-project --region us-central1
    tpu-mlm clean tpu-mlm-20260101-120000 --project my-project --region us-central1 --yes
    tpu-mlm clean tpu-mlm-20260101-120000 --project my-project --delete all --yes
    tpu-mlm clean tpu-mlm-pretraining-2026-12-04-00-00-21-732449 --pipeline_root runs --delete all   (a run-local run)

(``python -m pipelines.clean RUN ...`` alike.) What is the run's comes from the run's own records, never from a
pattern: on Vertex AI its pipeline job (read through the API: its pipeline, state, pipeline root, output_root and
checkpoint_dir) and its TPU jobs; under kfp.local the record run-local writes in the run's folder. It deletes only
once the run has ended (its pipeline job in a final state and none of its TPU jobs alive; no run-local process of it
running) and no training holds the checkpoints' lease; the checkpoints not while another run resumed from them is
going, the data not while another run of the pipeline that may read it through Vertex AI's cache is going. Nothing
at or under a fixed checkpoint_dir (this run's or any other run's) is deleted, nor checkpoints another run trained in
(their attempts name each run, in any region: going, it refuses; ended, they are kept unless it was a resume of this
run), nor what no task of the pipeline makes (a folder or file of the run's folder: listed as unknown, kept).
Folders are found with object permissions only (list, get, delete: the README's roles/storage.objectUser on the
bucket), and only the objects listed are deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib import lease, storage
from components.lib.attempts import runs_trained_in
from components.lib.errors import InvalidParameter
from components.lib.job_runner import run_job
from pipelines.run_folders import (
    CHECKPOINTS,
    LOCAL_RUN_RECORD,
    RESUMED_FROM_LABEL,
    TENSORBOARD,
    checkpoint_folder,
    local_run_alive,
    read_local_run_record,
    run_as_flag,
    run_label,
    run_name,
    run_root,
    tensorboard_folder,
)

DATA, MODEL, REPORTS = "data", "model", "reports"
DELETABLE = (CHECKPOINTS, DATA, MODEL, REPORTS, TENSORBOARD)  # in the order --delete is printed
DEFAULT_DELETE = f"{CHECKPOINTS},{DATA}"
ALL = "all"
OTHER = "other"  # the pipeline's own records (a loop's plan, the push's result, run-local's logs): go with the data
UNKNOWN = "unknown"  # a folder no task of the pipeline makes: not the run's to delete, listed and kept
# each task of the pipeline by what its folder holds (its name without KFP's "-2" for a second use of a component
# and Vertex AI's "_EXECUTIONID"), and run-local's own folders; a folder of none of them is UNKNOWN
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
LOCAL_FOLDERS = {"logs": OTHER}  # run-local's steps' logs
TASK_SUFFIXES = re.compile(r"(-\d+)?(_\d+)?$")
RESOURCE_NAME = re.compile(r"projects/[^/]+/locations/[^/]+/pipelineJobs/[^/]+")
GLOB_CHARACTERS = re.compile(r"[*?\[\]]")
LOOKUP_SECONDS = 30  # a run of another region that its attempts name, read once: one that does not answer is kept
# Cloud Storage's Standard class in a region (us-central1): $0.000027397 a GiB-hour on
# https://cloud.google.com/storage/pricing (as transcribed on 2026-09-20 in api-evangelist/gcp-cloud-storage,
# plans/gcp-cloud-storage-plans-pricing.yml), 730 hours a month: $0.020 a GiB-month. Multi-regions cost more.
STANDARD_PRICE_PER_GIB_MONTH = 0.020
GIB = 2**30
CACHING_WARNING = (
    "warning: Vertex AI caches the tokenizer and shards steps: a later run with the same inputs gets this run's data "
    "instead of writing its own, and would read deleted files; submit later runs with --enable_caching false."
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


def check_root(parameter: str, root: str) -> str:
    """A root as a path: checked, without a trailing "/" (``t6`` and ``t6/`` are one root), refused when it holds a
    glob's characters (a pattern could reach other roots' runs)."""
    storage.check_uri(parameter, root)
    if GLOB_CHARACTERS.search(root):
        raise InvalidParameter(parameter, root, "must be a path, without '*', '?', '[' or ']'")
    return root if root.rstrip("/").endswith("://") else root.rstrip("/")


@dataclass(kw_only=True)
class CleanArguments:
    run: str = field(
        metadata={"help": "The run's name as submit prints it, or its resource name; also taken as the first word."}
    )
    project: str = field(
        default="", metadata={"help": "A Vertex AI run's Google Cloud project id; none: a run-local run."}
    )
    region: str = field(default="us-central1", metadata={"help": "The Vertex AI region the run is in."})
    api_endpoint: str = field(
        default="", metadata={"help": "Vertex AI's endpoint; default: the region's, REGION-aiplatform.googleapis.com."}
    )
    pipeline_root: str = field(
        default="",
        metadata={"help": "A run-local run's pipeline root (runs by default); a Vertex AI run's is read from it."},
    )
    delete: str = field(
        default=DEFAULT_DELETE,
        metadata={
            "help": "What to delete, a comma list of checkpoints, data (tokenizer and shards), model, reports and "
            "tensorboard, or all; the rest is kept."
        },
    )
    price_per_gb_month: float = field(
        default=STANDARD_PRICE_PER_GIB_MONTH,
        metadata={
            "help": "Storage price, $ a GiB-month (default: Standard class in us-central1; multi-regions cost more)."
        },
    )
    yes: bool = field(default=False, metadata={"help": "Delete. Without it: a dry run that deletes nothing."})

    def __post_init__(self) -> None:
        from pipelines.vertex_jobs import check_endpoint, check_region

        self.run = clean_run_name(self.run)
        if self.project:
            check_region(self.region)
            check_endpoint("api_endpoint", self.api_endpoint)
        if self.pipeline_root:
            self.pipeline_root = check_root("pipeline_root", self.pipeline_root)
        elif not self.project:
            raise InvalidParameter(
                "pipeline_root", "", "a run-local run's pipeline root is needed (or --project for a Vertex AI run)"
            )
        named = {part.strip() for part in self.delete.split(",") if part.strip()}
        if named == {ALL}:
            named = set(DELETABLE)
        if not named or named - set(DELETABLE):
            raise InvalidParameter("delete", self.delete, f"must be a comma list of {', '.join(DELETABLE)}, or all")
        self.delete = ",".join(kind for kind in DELETABLE if kind in named)  # one spelling, for the command printed
        if self.price_per_gb_month < 0:
            raise InvalidParameter("price_per_gb_month", self.price_per_gb_month, "must be 0 or above")


@dataclass
class RunRecord:
    """What the run's own records say: where its tasks' folders are, the root of its checkpoints and TensorBoard
    logs, the checkpoint folders never to delete, and the runs still going that need its checkpoints or data."""

    task_folders: list[str]
    root: str  # the run's output_root, else its pipeline root
    searched: list[str]  # the roots its folders were looked for under
    own_fixed_checkpoint_dir: str = ""  # the run's checkpoint_dir parameter
    resumed_from: str = ""  # the label of the run whose checkpoints it resumed (submit --resume)
    fixed_checkpoint_dirs: list[str] = field(default_factory=list)  # the run's and every other run's of the pipeline
    going_in_fixed: dict[str, str] = field(default_factory=dict)  # a fixed checkpoint_dir: a run going that uses it
    trained_in_by: list[str] = field(default_factory=list)  # runs going that train in this run's checkpoints
    sharing_checkpoints: list[str] = field(default_factory=list)  # other runs that trained in them: they are kept
    caching_runs: list[str] = field(default_factory=list)  # runs going that may read this run's data from the cache


def refuse(run: str, why: str) -> InvalidParameter:
    return InvalidParameter("run", run, why)


def local_record(arguments: CleanArguments) -> RunRecord:
    """A run-local run's records: the record run-local wrote in its folder, refused when there is none (not a run
    of this pipeline's, or one from before records) or its run-local is still running."""
    folder = storage.join(arguments.pipeline_root, arguments.run)
    record = read_local_run_record(folder)
    if record is None:
        raise refuse(
            arguments.run,
            f"{folder} holds no record of a run-local run of this pipeline ({LOCAL_RUN_RECORD}): nothing of it is "
            "deleted; a Vertex AI run is cleaned with --project",
        )
    alive = local_run_alive(record)
    if alive:
        raise refuse(arguments.run, f"{alive}: clean it once it has ended")
    output_root = check_root("output_root", record["output_root"]) if record["output_root"] else ""
    task_folders = [folder, *([storage.join(output_root, arguments.run)] if output_root else [])]
    roots = [arguments.pipeline_root, *([output_root] if output_root else [])]
    found = RunRecord(task_folders, output_root or arguments.pipeline_root, roots, record["checkpoint_dir"])
    others = {}
    for other_record in storage.glob(storage.join(arguments.pipeline_root, "*", LOCAL_RUN_RECORD)):
        name = storage.basename(storage.dirname(other_record))
        if name != arguments.run:
            with contextlib.suppress(InvalidParameter):  # another run's damaged record: that run's to clean
                others[name] = read_local_run_record(storage.dirname(other_record))
    for name, other in others.items():
        if other and other["checkpoint_dir"]:
            found.fixed_checkpoint_dirs.append(other["checkpoint_dir"])
            if local_run_alive(other):
                found.going_in_fixed.setdefault(other["checkpoint_dir"], name)
    for name in runs_trained_in(checkpoint_folder(found.root, arguments.run)):
        if run_name(name) == arguments.run:
            continue
        if others.get(name) and local_run_alive(others[name]):
            found.trained_in_by.append(name)
        else:
            found.sharing_checkpoints.append(name)
    if found.own_fixed_checkpoint_dir:
        found.fixed_checkpoint_dirs.append(found.own_fixed_checkpoint_dir)
    return found


def vertex_record(arguments: CleanArguments) -> RunRecord:
    """A Vertex AI run's records, through the API: refused unless it is this pipeline's (``Run.pipeline_job``), its
    pipeline job has ended and none of its TPU jobs is alive."""
    from pipelines.runs import Run, RunArguments, pipeline_name
    from pipelines.vertex_jobs import PIPELINE_TERMINAL_STATES, TERMINAL_STATES, call, location_path

    where = RunArguments(run=arguments.run, project=arguments.project, region=arguments.region)
    run = Run(where, arguments.api_endpoint)
    job = run.pipeline_job()
    if job.state.name not in PIPELINE_TERMINAL_STATES:
        raise refuse(
            run.name,
            f"is {job.state.name}: a run's data is deleted once it has ended (tpu-mlm status {run.name}; "
            f"tpu-mlm cancel {run.name} ends it)",
        )
    alive = [f"{tpu.name} {tpu.state.name}" for tpu in run.tpu_jobs() if tpu.state.name not in TERMINAL_STATES]
    if alive:
        raise refuse(run.name, f"its TPU job {alive[0]} is still alive: clean it once it has ended")
    parameters = dict(job.runtime_config.parameter_values)
    pipeline_root = check_root("pipeline_root", job.runtime_config.gcs_output_directory)
    if arguments.pipeline_root and arguments.pipeline_root != pipeline_root:
        raise InvalidParameter("pipeline_root", arguments.pipeline_root, f"is not the run's, {pipeline_root}")
    root = run_root(parameters, pipeline_root)
    own_checkpoints = checkpoint_folder(root, run.name)
    record = RunRecord(vertex_task_folders(pipeline_root, run.name), root, [pipeline_root])
    if parameters.get("output_root"):
        output_root = check_root("output_root", parameters["output_root"])
        record.task_folders.append(storage.join(output_root, run.name))
        record.searched.append(output_root)
    record.resumed_from = job.labels.get(RESUMED_FROM_LABEL, "")
    if parameters.get("checkpoint_dir"):
        record.own_fixed_checkpoint_dir = parameters["checkpoint_dir"]
        record.fixed_checkpoint_dirs.append(parameters["checkpoint_dir"])
    request = {"parent": location_path(run.project, run.region), "filter": f'pipeline_name="{pipeline_name(job)}"'}
    for listed in call(run.pipelines.list_pipeline_jobs, request=request):
        if listed.name.rsplit("/", 1)[-1] == run.name:
            continue
        other = call(run.pipelines.get_pipeline_job, name=listed.name)
        other_name, going = other.name.rsplit("/", 1)[-1], other.state.name not in PIPELINE_TERMINAL_STATES
        checkpoint_dir = dict(other.runtime_config.parameter_values).get("checkpoint_dir", "")
        if (
            checkpoint_dir
            and checkpoint_dir == own_checkpoints
            and other.labels.get(RESUMED_FROM_LABEL) == run_label(run.name)
        ):
            if going:
                record.trained_in_by.append(other_name)
        elif checkpoint_dir:
            record.fixed_checkpoint_dirs.append(checkpoint_dir)
            if going:
                record.going_in_fixed.setdefault(checkpoint_dir, other_name)
        if going and reads_cache(other.pipeline_spec):  # Vertex AI's cache is a region's: the listing's
            record.caching_runs.append(other_name)
    trainers_elsewhere(run, arguments.api_endpoint, own_checkpoints, record)
    return record


def trainers_elsewhere(run: Any, api_endpoint: str, checkpoints: str, record: RunRecord) -> None:
    """The runs other than this one that trained in its checkpoints, as the attempts there name them, in any region
    (the listing sees one): going, they refuse the deletion; ended, they keep the checkpoints unless resumed from this
    run (submit --resume: its label), or when they cannot be read."""
    from pipelines.vertex_jobs import PIPELINE_TERMINAL_STATES, check_region, pipeline_client

    for other in runs_trained_in(checkpoints):
        if not RESOURCE_NAME.fullmatch(other):  # a run-local run's, or not written by a run's train step
            record.sharing_checkpoints.append(f"{other!r} (not a Vertex AI run)")
            continue
        _, project, _, region, _, name = other.split("/")
        if (project, region, name) == (run.project, run.region, run.name):  # the launcher names the project by its id
            continue
        if name == run.name:  # the same name in another region or project: its folders are the same folders
            raise refuse(
                run.name,
                f"a run of the same name elsewhere ({other}) trained in {checkpoints}: its folders and this run's "
                "cannot be told apart; delete what is no longer needed by hand",
            )
        if name in record.trained_in_by:
            continue
        try:
            check_region(region)
            client = run.pipelines if region == run.region else pipeline_client(region, api_endpoint)
            job = client.get_pipeline_job(name=other, retry=None, timeout=LOOKUP_SECONDS)  # once: kept if no answer
        except Exception as error:  # unreadable, unreachable, no such region: kept as that run's
            record.sharing_checkpoints.append(f"{name} in {region}, not readable: {type(error).__name__}")
            continue
        if job.state.name not in PIPELINE_TERMINAL_STATES:
            record.trained_in_by.append(f"{name} (in {region})")
        elif job.labels.get(RESUMED_FROM_LABEL) != run_label(run.name):
            record.sharing_checkpoints.append(f"{name} (in {region})")


def vertex_task_folders(pipeline_root: str, run: str) -> list[str]:
    """The folder of the run's tasks under its pipeline root, PIPELINE_ROOT/PROJECT_NUMBER/RUN (the project's
    number, which the API does not give, the one digit folder that holds the run). A glob of one level, not a
    listing of the root: TensorFlow lists a folder after asking whether it is one, which for a bucket's root is a
    bucket request (see ``storage.is_bucket``)."""
    found = [
        folder
        for folder in storage.glob(storage.join(pipeline_root, "*", run))
        if storage.basename(storage.dirname(folder)).isdigit()
    ]
    if len(found) > 1:
        raise refuse(
            run,
            f"runs of that name in several projects' folders ({', '.join(found)}): cannot tell which is this "
            "project's; delete the other's folder by hand (it is no run of this project's), then clean again",
        )
    return found


def reads_cache(pipeline_spec: Any) -> bool:
    """Whether a pipeline job may take a task's outputs from Vertex AI's cache: any task of its spec with caching
    on (submit --enable_caching false turns it off in every task)."""
    spec = dict(pipeline_spec or {})
    dags = [spec.get("root", {}), *dict(spec.get("components", {})).values()]
    return any(
        dict(task.get("cachingOptions", {})).get("enableCache", False)
        for dag in dags
        for task in dict(dict(dag).get("dag", {})).get("tasks", {}).values()
    )


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


def task_folder(relative: str) -> str:
    """The task folder, in its run folder, of a file at ``relative`` there: its first part, its first two in a
    kfp.local loop iteration's folder; "" for a file of the run folder itself."""
    parts = relative.split("/")[:-1]
    return "/".join(parts[: 2 if parts and storage.LOOP_ITERATION.fullmatch(parts[0]) else 1])


def task_kind(task: str) -> str:
    if not task:
        return UNKNOWN
    name = TASK_SUFFIXES.sub("", storage.basename(task))
    return TASK_KINDS.get(name) or LOCAL_FOLDERS.get(name) or UNKNOWN


def same_path(uri: str) -> str:
    """``uri`` as a key that two spellings of one folder share: a bucket's without a trailing "/", this machine's
    resolved (relative, with "..", through links). For comparing only: a link is never followed to delete."""
    return uri.rstrip("/") if storage.is_remote(uri) else os.path.realpath(uri)


def overlaps(folder: str, others: Sequence[str]) -> bool:
    """Whether ``folder`` is one of ``others``, or holds one, or is inside one, however each is written."""
    folder = same_path(folder).rstrip("/") + "/"
    others = [same_path(other).rstrip("/") + "/" for other in others]
    return any(folder.startswith(other) or other.startswith(folder) for other in others)


def run_folders(arguments: CleanArguments, record: RunRecord) -> list[RunFolder]:
    """Every folder of the run that holds a file, with its files, and whether it is kept: not named by --delete,
    unknown, or at, in or around a fixed checkpoint_dir."""
    deleted = set(arguments.delete.split(","))
    if DATA in deleted:
        deleted.add(OTHER)
    found = []
    unique: dict[str, str] = {}  # a root written two ways (runs, ./runs, its absolute path) is listed once
    for folder in record.task_folders:
        unique.setdefault(same_path(folder), folder)
    for run_folder in unique.values():
        tasks: dict[str, list[tuple[str, int]]] = {}
        for path, size in storage.files_under(run_folder):
            relative = path[len(run_folder) :].replace(os.sep, "/").lstrip("/")
            tasks.setdefault(task_folder(relative), []).append((path, size))
        for task, files in tasks.items():
            if not task:  # the run folder's own files: run-local's record is the run's, any other no task's
                records = [file for file in files if storage.basename(file[0]) == LOCAL_RUN_RECORD]
                found.append(RunFolder(run_folder, "the run's record", OTHER, records, False, run_folder))
                files = [file for file in files if file not in records]
            kind = task_kind(task)
            uri = storage.join(run_folder, task) if task else run_folder
            what = f"{TASK_SUFFIXES.sub('', storage.basename(task))}: {kind}" if task else f"run folder's files: {kind}"
            found.append(RunFolder(uri, what, kind, files, kind not in deleted, run_folder))
    for kind, folder in ((CHECKPOINTS, checkpoint_folder), (TENSORBOARD, tensorboard_folder)):
        uri = folder(record.root, arguments.run)
        files = storage.files_under(uri)
        if files:
            found.append(RunFolder(uri, kind, kind, files, kind not in deleted))
    for folder in found:
        if overlaps(folder.uri, record.fixed_checkpoint_dirs):
            folder.what, folder.keep = f"{folder.what} (a fixed checkpoint_dir: never deleted)", True
        elif folder.kind == CHECKPOINTS and record.sharing_checkpoints:
            folder.what, folder.keep = f"{folder.what} (run {record.sharing_checkpoints[0]} trained in them too)", True
    found = [folder for folder in found if folder.files]
    if any(folder.keep for folder in found):  # the run's record goes with the last of the run's files
        for folder in found:
            folder.keep = folder.keep or folder.what == "the run's record"
    return sorted(found, key=lambda folder: folder.uri)


def refuse_what_others_need(arguments: CleanArguments, record: RunRecord, doomed: list[RunFolder]) -> None:
    """Refuses, in one line, deleting checkpoints a training holds or a run resumed from them may still train in,
    or data a run going may read through the cache."""
    for folder in doomed:
        if folder.kind != CHECKPOINTS:
            continue
        held = lease.live_lease(folder.uri)
        if held:
            raise refuse(
                arguments.run,
                f"a training holds {folder.uri} ({lease.describe(held)}): clean it once that training has ended",
            )
        if record.trained_in_by:
            raise refuse(
                arguments.run,
                f"run {record.trained_in_by[0]}, which trains in {folder.uri}, is going: clean it once that run has "
                "ended",
            )
    if record.caching_runs and any(folder.kind == DATA for folder in doomed):
        raise refuse(
            arguments.run,
            f"run {record.caching_runs[0]} is going with caching on and may read this run's tokenizer and shards "
            "from the cache: clean its data once that run has ended",
        )


def delete(doomed: list[RunFolder], kept: list[RunFolder]) -> None:
    """Deletes the objects of the ``doomed`` folders, then the folders left empty, children first; a run folder only
    when it holds nothing kept."""
    for folder in doomed:
        for path, _ in folder.files:
            try:
                storage.remove(path)
            except Exception:
                if storage.exists(path):
                    raise
                # gone meanwhile (another clean of the run): what was to be done is done
    holding_kept = {folder.run_folder for folder in kept} | {folder.uri for folder in kept}
    emptied = {folder.uri for folder in doomed} | {folder.run_folder for folder in doomed}
    for uri in sorted(emptied - holding_kept - {""}, reverse=True):
        storage.remove_folder(uri)


def delete_command(arguments: CleanArguments) -> str:
    words = ["tpu-mlm", "clean", arguments.run]
    if arguments.project:
        words += ["--project", arguments.project, "--region", arguments.region]
    if arguments.api_endpoint:
        words += ["--api_endpoint", arguments.api_endpoint]
    if arguments.pipeline_root:
        words += ["--pipeline_root", arguments.pipeline_root]
    return shlex.join([*words, "--delete", arguments.delete, "--yes"])


def clean(arguments: CleanArguments) -> dict[str, Any]:
    """Reads the run's records, finds its folders and, with --yes, deletes those --delete names, once nothing
    needs them; returns what it found and did."""
    record = vertex_record(arguments) if arguments.project else local_record(arguments)
    folders = run_folders(arguments, record)
    doomed = [folder for folder in folders if not folder.keep]
    kept = [folder for folder in folders if folder.keep]
    refuse_what_others_need(arguments, record, doomed)
    if arguments.yes:
        delete(doomed, kept)
    keeping, deleting = ("kept", "deleted") if arguments.yes else ("keep", "delete")
    delete_bytes = sum(folder.bytes for folder in doomed)
    summary: dict[str, Any] = {
        "run": arguments.run,
        "dry_run": not arguments.yes,
        "roots": list(dict.fromkeys(record.searched)),
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
        "warnings": [CACHING_WARNING] if arguments.project and any(folder.kind == DATA for folder in doomed) else [],
    }
    if doomed and not arguments.yes:
        summary["command"] = delete_command(arguments)
    if record.resumed_from:
        summary["hints"] = [
            f"its checkpoints are run {record.resumed_from}'s, which it resumed: they go with tpu-mlm clean "
            f"{record.resumed_from}"
        ]
    elif record.own_fixed_checkpoint_dir:
        summary["hints"] = [fixed_checkpoint_dir_hint(record)]
    return summary


def fixed_checkpoint_dir_hint(record: RunRecord) -> str:
    """What becomes of the run's own fixed checkpoint_dir, which clean never deletes: how to delete it by hand, unless
    a run going trains there."""
    checkpoint_dir = record.own_fixed_checkpoint_dir
    going = record.going_in_fixed.get(checkpoint_dir)
    if going:
        return f"the fixed checkpoint_dir {checkpoint_dir} is not deleted: run {going}, going, trains there"
    remove = "gcloud storage rm -r" if storage.is_remote(checkpoint_dir) else "rm -r"
    return (
        f"the fixed checkpoint_dir {checkpoint_dir} is not deleted (runs submitted with it resume there); once none "
        f"will: {remove} {shlex.quote(checkpoint_dir)}"
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
    lines += summary.get("hints", [])
    if "command" in summary:
        lines.append(f"to delete them: {summary['command']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(CleanArguments, clean, run_as_flag(argv), description=__doc__, for_people=summary_for_people)


if __name__ == "__main__":
    sys.exit(main())
