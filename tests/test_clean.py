"""tpu-mlm clean: a run's folders found from the run's own records (a Vertex AI run's pipeline job in the Vertex AI
stand-in; a run-local run's record, written by run-local's own writer), on this machine and in a bucket (the
emulator, which answers any bucket request with the 403 the README's object roles get). It deletes nothing while the
run or a run that needs its files is going (a pipeline job not ended, a TPU job alive, a run resumed from it, a run
that may read its data from the cache, a training's lease), nothing of a fixed checkpoint_dir, nothing no task of
the pipeline makes, nothing written after its listing; the dry run deletes nothing; --yes deletes exactly what
--delete names and finds nothing left the second time; a name or root that could reach beyond the run is refused in
one line. What is left is read without the storage layer: google-cloud-storage in the bucket (TensorFlow's folder
markers included), pathlib on this machine (folders included)."""

import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import run_module
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_client
from vertex_server import VertexStandIn

from components.lib import lease, storage
from components.lib.attempts import RUN_VARIABLE, Attempts
from components.lib.errors import InvalidParameter
from components.lib.job_runner import BAD_INPUT_EXIT
from pipelines import cli
from pipelines.clean import (
    CACHING_WARNING,
    GIB,
    TASK_KINDS,
    TASK_SUFFIXES,
    CleanArguments,
    clean,
    delete,
    local_record,
    run_folders,
    summary_for_people,
    vertex_record,
)
from pipelines.pipeline import build_pipeline
from pipelines.run_folders import (
    LOCAL_RUN_RECORD,
    PIPELINE_NAME,
    RESUMED_FROM_LABEL,
    RUN_NAME_LABEL,
    checkpoint_folder,
    local_run_recorded,
    run_label,
)
from pipelines.run_local import display_names, new_run_folder

pytestmark = pytest.mark.timeout(120)

RUN = "tpu-mlm-pretraining-20260101120000"
OTHER_RUN = f"{RUN}-2"  # a glob or prefix that took RUN for a beginning would reach it
PROJECT, REGION, PROJECT_NUMBER = "my-project", "us-central1", "123456"
PARENT = f"projects/{PROJECT}/locations/{REGION}"


def vertex_run(run: str) -> dict[str, int]:
    """A Vertex AI run's files under its pipeline root, with their sizes: its tasks' artifacts, its checkpoints and its
    TensorBoard logs."""
    tasks = f"{PROJECT_NUMBER}/{run}"
    return {
        f"{tasks}/tokenizer-step_1/tokenizer/tokenizer.json": 300,
        f"{tasks}/shards-step_2/shards/validation-0-10.tfrecord": 2000,
        f"{tasks}/shards-step-2_3/shards/train-0-20.tfrecord": 4000,
        f"{tasks}/shards-step-2_3/shards/manifest.json": 100,
        f"{tasks}/train-step_4/model/tf_model.h5": 1500,
        f"{tasks}/train-step_4/model/tokenizer.json": 300,
        f"{tasks}/evaluate-step_5/evaluation/metrics.json": 50,
        f"{tasks}/evaluate-step_5/report": 40,
        f"{tasks}/part-indices_6/executor_output.json": 10,
        f"checkpoints/{run}/ckpt-1.data-00000-of-00001": 5000,
        f"checkpoints/{run}/checkpoint": 60,
        f"tensorboard/{run}/train/events.out.tfevents.1": 70,
    }


# RUN's folders in vertex_run, by what the default --delete (checkpoints, data) does to them
DEFAULT_ACTIONS = {
    f"{PROJECT_NUMBER}/{RUN}/tokenizer-step_1": ("tokenizer-step: data", "delete"),
    f"{PROJECT_NUMBER}/{RUN}/shards-step_2": ("shards-step: data", "delete"),
    f"{PROJECT_NUMBER}/{RUN}/shards-step-2_3": ("shards-step: data", "delete"),
    f"{PROJECT_NUMBER}/{RUN}/train-step_4": ("train-step: model", "keep"),
    f"{PROJECT_NUMBER}/{RUN}/evaluate-step_5": ("evaluate-step: reports", "keep"),
    f"{PROJECT_NUMBER}/{RUN}/part-indices_6": ("part-indices: other", "delete"),
    f"checkpoints/{RUN}": ("checkpoints", "delete"),
    f"tensorboard/{RUN}": ("tensorboard", "keep"),
}


def write_files(root: str, files: dict[str, int]) -> None:
    """A run's files as its steps leave them: in a bucket, each file's object and its folder's marker object (what
    ``storage.write_bytes_atomic`` makes there), uploaded one request each rather than through TensorFlow's
    mkdir-write-rename, which takes the emulator about half a second a file."""
    if not storage.is_remote(root):
        for relative, size in files.items():
            storage.write_bytes_atomic(storage.join(root, relative), bytes(size))
        return
    bucket_name, _, prefix = root.removeprefix("gs://").partition("/")
    bucket = gcs_client.Client(project="test", credentials=AnonymousCredentials()).bucket(bucket_name)
    names = [f"{prefix}/{relative}".lstrip("/") for relative in files]
    for marker in sorted({name.rsplit("/", 1)[0] + "/" for name in names if "/" in name}):
        bucket.blob(marker).upload_from_string(b"")
    for name, size in zip(names, files.values(), strict=True):
        bucket.blob(name).upload_from_string(bytes(size))


def stored(root: str) -> dict[str, int]:
    """Everything under ``root`` by its path there, with its size: in a bucket every object (a folder marker as
    "folder/"), on this machine every file and folder (a folder as "folder/")."""
    if storage.is_remote(root):
        client = gcs_client.Client(project="test", credentials=AnonymousCredentials())
        bucket, _, prefix = root.removeprefix("gs://").partition("/")
        prefix = f"{prefix}/" if prefix else ""
        return {blob.name.removeprefix(prefix): blob.size for blob in client.list_blobs(bucket, prefix=prefix)}
    base = Path(root)
    return {
        path.relative_to(base).as_posix() + ("/" if path.is_dir() else ""): 0 if path.is_dir() else path.stat().st_size
        for path in base.rglob("*")
    }


def of_run(entries: dict[str, int], run: str) -> dict[str, int]:
    return {path: size for path, size in entries.items() if run in path.split("/")}


def files_only(entries: dict[str, int]) -> dict[str, int]:
    return {path: size for path, size in entries.items() if not path.endswith("/")}


def folder_sizes(files: dict[str, int], folder: str) -> tuple[int, int]:
    """How many of ``files`` are under ``folder``, and their bytes."""
    inside = [size for path, size in files.items() if path.startswith(f"{folder}/")]
    return len(inside), sum(inside)


def found(summary: dict, root: str) -> dict[str, tuple[str, int, int, str]]:
    """The summary's folders by their path under ``root``: what each is, its objects, bytes and action."""
    return {
        entry["folder"][len(root) + 1 :]: (entry["what"], entry["objects"], entry["bytes"], entry["action"])
        for entry in summary["folders"]
    }


@pytest.fixture(params=["local", "bucket"])
def root(request, tmp_path) -> str:
    """A pipeline root on this machine, then in the emulator's bucket."""
    return str(tmp_path / "root") if request.param == "local" else storage.join(request.getfixturevalue("gcs"), "root")


@pytest.fixture
def vertex():
    with VertexStandIn() as stand_in:
        yield stand_in


def pipeline_job(
    vertex: VertexStandIn,
    run: str,
    pipeline_root: str,
    state: str = "PIPELINE_STATE_SUCCEEDED",
    parameters: dict | None = None,
    labels: dict | None = None,
    caching: bool = False,
    pipeline: str = PIPELINE_NAME,
) -> None:
    """A pipeline job in the stand-in as Vertex AI keeps it: its pipeline's name and tasks (caching on or off, as
    submit --enable_caching sets it in each), its pipeline root and parameters, its labels; then ended in
    ``state`` (PIPELINE_STATE_RUNNING: left going)."""
    tasks = {task: {"cachingOptions": {"enableCache": caching}} for task in ("tokenizer-step", "train-step")}
    spec = {"pipelineInfo": {"name": pipeline}, "root": {"dag": {"tasks": tasks}}}
    config = {"gcsOutputDirectory": pipeline_root, "parameterValues": parameters or {}}
    job = {"pipelineSpec": spec, "runtimeConfig": config, "labels": labels or {}}
    vertex.create_pipeline_job(PARENT, run, job)
    if state != "PIPELINE_STATE_RUNNING":
        vertex.end_pipeline_job(f"{PARENT}/pipelineJobs/{run}", state)


def arguments(vertex: VertexStandIn, **values) -> CleanArguments:
    return CleanArguments(run=RUN, project=PROJECT, region=REGION, api_endpoint=vertex.url, **values)


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_the_dry_run_lists_the_run_s_folders_with_their_sizes_and_deletes_nothing(root, vertex, capsys):
    write_files(root, vertex_run(RUN))
    write_files(root, vertex_run(OTHER_RUN))
    pipeline_job(vertex, RUN, root)
    before = stored(root)
    where = ["--project", PROJECT, "--region", REGION, "--api_endpoint", vertex.url]

    assert cli.main(["clean", RUN, *where]) == 0  # the run's name as the first word

    assert stored(root) == before
    printed = capsys.readouterr().out
    assert cli.main(["clean", RUN, *where, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    files = vertex_run(RUN)
    assert found(summary, root) == {
        folder: (what, *folder_sizes(files, folder), action) for folder, (what, action) in DEFAULT_ACTIONS.items()
    }
    to_delete = [folder for folder, (_, action) in DEFAULT_ACTIONS.items() if action == "delete"]
    deleted = sum(folder_sizes(files, folder)[1] for folder in to_delete)
    assert summary["delete_objects"] == sum(folder_sizes(files, folder)[0] for folder in to_delete) == 7
    assert summary["delete_bytes"] == deleted == 11_470
    assert summary["keep_bytes"] == sum(files.values()) - deleted
    assert summary["monthly_cost"] == pytest.approx(deleted / GIB * 0.020)
    assert summary["warnings"] == [CACHING_WARNING]  # data goes: a later cached run would be handed it
    assert summary["command"] == (
        f"tpu-mlm clean {RUN} --project {PROJECT} --region {REGION} --api_endpoint {vertex.url} --delete "
        "checkpoints,data --yes"  # the command as it was given, the endpoint included
    )
    lines = printed.splitlines()
    assert lines[0] == f"run {RUN}: dry run, nothing deleted"
    assert lines[-1] == f"to delete them: {summary['command']}" and CACHING_WARNING in lines
    assert "11.2 KiB to delete: $0.00 a month to save at $0.020 a GiB-month (Standard, us-central1)" in lines
    assert any(line.split() == [f"{root}/checkpoints/{RUN}", "checkpoints", "2", "5,060", "delete"] for line in lines)


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_yes_deletes_what_delete_names_and_then_finds_nothing_left(root, vertex, capsys):
    write_files(root, vertex_run(RUN))
    write_files(root, vertex_run(OTHER_RUN))
    pipeline_job(vertex, RUN, root, state="PIPELINE_STATE_FAILED")
    other_run = of_run(stored(root), OTHER_RUN)
    model = f"{PROJECT_NUMBER}/{RUN}/train-step_4/"

    summary = clean(arguments(vertex, delete="checkpoints,data,reports,tensorboard", yes=True))

    left = of_run(stored(root), RUN)
    assert files_only(left) == {path: size for path, size in vertex_run(RUN).items() if path.startswith(model)}
    assert [path for path in left if not path.startswith(model)] in ([], [f"{PROJECT_NUMBER}/{RUN}/"])  # its folder
    assert of_run(stored(root), OTHER_RUN) == other_run
    assert {folder: action for folder, (*_, action) in found(summary, root).items()} == {
        folder: "kept" if folder == model.rstrip("/") else "deleted" for folder in DEFAULT_ACTIONS
    }
    assert summary["delete_objects"] == 10 and "command" not in summary

    again = clean(arguments(vertex, yes=True))
    assert again["delete_objects"] == 0 and [entry["action"] for entry in again["folders"]] == ["kept"]
    assert summary_for_people(again).startswith(f"run {RUN}: nothing left to delete\n")

    where = ["--project", PROJECT, "--region", REGION, "--api_endpoint", vertex.url]
    assert cli.main(["clean", RUN, *where, "--delete", "all", "--yes"]) == 0
    assert capsys.readouterr().out.startswith(f"run {RUN}: deleted 2 objects\n")
    assert of_run(stored(root), RUN) == {} and of_run(stored(root), OTHER_RUN) == other_run

    assert cli.main(["clean", RUN, *where, "--delete", "all", "--yes"]) == 0
    assert capsys.readouterr().out.strip() == f"run {RUN}: no folder of it under {root}: " + (
        "nothing to delete (check the name)"
    )
    assert of_run(stored(root), OTHER_RUN) == other_run


@pytest.mark.parametrize(
    "going",
    ["the run", "its TPU job", "a run resumed from it", "a run that may read its data from the cache"],
)
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_nothing_is_deleted_while_the_run_or_a_run_that_needs_its_files_is_going(going, vertex, tmp_path):
    """The run's pipeline job not ended (preempted, between its train task's retries, or queued: all RUNNING to the
    API), one of its TPU jobs alive, a run resumed from it (submit --resume: its label and checkpoint_dir), or a run
    of the pipeline with caching on: refused in one line, before anything is deleted, without suggesting a
    deletion; once they have ended, the same command deletes."""
    root = str(tmp_path / "root")
    write_files(root, vertex_run(RUN))
    pipeline_job(vertex, RUN, root, state="PIPELINE_STATE_RUNNING" if going == "the run" else "PIPELINE_STATE_FAILED")
    tpu_job = None
    if going == "its TPU job":
        spec = {
            "workerPoolSpecs": [{"containerSpec": {"command": [sys.executable, "-c", "import time; time.sleep(60)"]}}]
        }
        tpu_job = vertex.create(PARENT, {"labels": {RUN_NAME_LABEL: run_label(RUN)}, "jobSpec": spec})["name"]
    elif going == "a run resumed from it":
        pipeline_job(
            vertex,
            "resumed-run",
            root,
            state="PIPELINE_STATE_RUNNING",
            parameters={"checkpoint_dir": checkpoint_folder(root, RUN)},
            labels={RESUMED_FROM_LABEL: run_label(RUN)},
        )
    elif going == "a run that may read its data from the cache":
        pipeline_job(vertex, "later-run", root, state="PIPELINE_STATE_RUNNING", caching=True)
    before = stored(root)

    refused = run_module(
        "pipelines.clean", RUN, "--project", PROJECT, "--api_endpoint", vertex.url, "--yes", timeout=100
    )

    assert refused.returncode == BAD_INPUT_EXIT and refused.stdout == "", refused.stderr[-2000:]
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: --run='{RUN}': ") and "Traceback" not in refused.stderr
    assert "--delete" not in line and "--keep" not in line and "once" in line, line
    assert stored(root) == before
    if going == "the run":
        vertex.end_pipeline_job(f"{PARENT}/pipelineJobs/{RUN}", "PIPELINE_STATE_CANCELLED")
    elif tpu_job:
        vertex.cancel(tpu_job)
        vertex.wait(tpu_job)
    else:
        other = "resumed-run" if going == "a run resumed from it" else "later-run"
        vertex.end_pipeline_job(f"{PARENT}/pipelineJobs/{other}", "PIPELINE_STATE_SUCCEEDED")
    assert clean(arguments(vertex, yes=True))["delete_objects"] == 7


def test_checkpoints_a_training_holds_are_not_deleted(tmp_path, vertex):
    """A training's lease in the checkpoint folder (the train step's own, taken as it starts) refuses their deletion
    whatever the API says; released, they go."""
    root = str(tmp_path / "root")
    write_files(root, vertex_run(RUN))
    pipeline_job(vertex, RUN, root)
    with lease.Lease(checkpoint_folder(root, RUN), expiry=60).held():
        with pytest.raises(InvalidParameter, match=f"a training holds {checkpoint_folder(root, RUN)} "):
            clean(arguments(vertex, yes=True))
        assert files_only(stored(root)).keys() >= vertex_run(RUN).keys()
        # what is not the checkpoints can go meanwhile
        assert clean(arguments(vertex, delete="data", yes=True))["delete_objects"] == 5
    assert clean(arguments(vertex, yes=True))["delete_objects"] == 2


def test_a_fixed_checkpoint_dir_and_files_no_task_makes_are_kept(gcs, vertex):
    """A run whose output_root is the bucket's root and whose name is that of the folder another run names as its
    fixed checkpoint_dir: that folder is kept, and so are a folder in the run's folder that no task makes and a file
    of the run folder itself; no deletion of another run's folder is suggested."""
    bucket_root = "gs://bucket"
    run = f"ckpt-{uuid.uuid4().hex[:8]}"  # the bucket is the whole test session's
    fixed = checkpoint_folder(bucket_root, run)
    run_folder = storage.join(gcs, "root", PROJECT_NUMBER, run)
    write_files(run_folder, {"shared-notes/notes.txt": 7, "README.md": 5})
    write_files(bucket_root, {f"{run}/tokenizer-step_1/tokenizer/tokenizer.json": 300, f"checkpoints/{run}/c": 60})
    pipeline_job(vertex, run, storage.join(gcs, "root"), parameters={"output_root": bucket_root})
    pipeline_job(vertex, "another-run", storage.join(gcs, "root"), parameters={"checkpoint_dir": fixed})

    summary = clean(CleanArguments(run=run, project=PROJECT, api_endpoint=vertex.url, delete="all", yes=True))

    assert {entry["folder"]: (entry["what"], entry["action"]) for entry in summary["folders"]} == {
        run_folder: ("run folder's files: unknown", "kept"),
        storage.join(run_folder, "shared-notes"): ("shared-notes: unknown", "kept"),
        storage.join(bucket_root, run, "tokenizer-step_1"): ("tokenizer-step: data", "deleted"),
        fixed: ("checkpoints (a fixed checkpoint_dir: never deleted)", "kept"),
    }
    assert all(storage.exists(path) for path in (storage.join(fixed, "c"), storage.join(run_folder, "README.md")))
    assert storage.exists(storage.join(run_folder, "shared-notes", "notes.txt")) and "hints" not in summary


def test_the_run_s_own_fixed_checkpoint_dir_is_kept_with_how_to_delete_it_unless_a_run_going_trains_there(
    tmp_path, vertex
):
    root, fixed = str(tmp_path / "root"), str(tmp_path / "my checkpoints")
    write_files(root, vertex_run(RUN))
    write_files(fixed, {"checkpoint": 60})
    pipeline_job(vertex, RUN, root, parameters={"checkpoint_dir": fixed})

    summary = clean(arguments(vertex, yes=True))

    assert summary["hints"] == [
        f"the fixed checkpoint_dir {fixed} is not deleted (runs submitted with it resume there); once none will: "
        f"rm -r '{fixed}'"
    ]
    assert storage.exists(storage.join(fixed, "checkpoint"))
    pipeline_job(vertex, "next-run", root, state="PIPELINE_STATE_RUNNING", parameters={"checkpoint_dir": fixed})
    assert clean(arguments(vertex))["hints"] == [
        f"the fixed checkpoint_dir {fixed} is not deleted: run next-run, going, trains there"
    ]


@pytest.mark.parametrize("other", ["going", "ended", "resumed from the run"])
def test_checkpoints_a_run_of_another_region_trained_in_are_kept_while_it_may_need_them(
    other, tmp_path, vertex, monkeypatch
):
    """The attempts in the checkpoint folder (the train step's own records, each naming its run as the launcher tells
    it) name a run in another region, which no listing of the run's region sees: going, the deletion is refused;
    ended, the checkpoints are kept as that run's too, unless it was a resume of this run (its label)."""
    root = str(tmp_path / "root")
    write_files(root, vertex_run(RUN))
    pipeline_job(vertex, RUN, root, state="PIPELINE_STATE_FAILED")
    elsewhere = f"projects/{PROJECT}/locations/europe-west4"
    labels = {RESUMED_FROM_LABEL: run_label(RUN)} if other == "resumed from the run" else {}
    spec = {"pipelineInfo": {"name": PIPELINE_NAME}, "root": {"dag": {"tasks": {}}}}
    vertex.create_pipeline_job(elsewhere, "abroad", {"pipelineSpec": spec, "runtimeConfig": {}, "labels": labels})
    if other != "going":
        vertex.end_pipeline_job(f"{elsewhere}/pipelineJobs/abroad", "PIPELINE_STATE_SUCCEEDED")
    checkpoints = checkpoint_folder(root, RUN)
    for run in (f"{PARENT}/pipelineJobs/{RUN}", f"{elsewhere}/pipelineJobs/abroad"):  # the train step's own records
        monkeypatch.setenv(RUN_VARIABLE, run)
        with Attempts(checkpoints, {}, ()).recorded():
            pass

    if other == "going":
        with pytest.raises(
            InvalidParameter, match=f"run abroad \\(in europe-west4\\), which trains in {checkpoints}, "
        ):
            clean(arguments(vertex, yes=True))
        assert files_only(stored(root)).keys() >= vertex_run(RUN).keys()
        return
    summary = clean(arguments(vertex, yes=True))
    (action,) = [entry["action"] for entry in summary["folders"] if entry["folder"] == checkpoints]
    assert action == ("deleted" if other == "resumed from the run" else "kept")
    assert storage.exists(storage.join(checkpoints, "checkpoint")) == (action == "kept")


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_run_local_run_is_cleaned_by_its_record_and_not_while_it_runs(root, tmp_path):
    """run-local's record (its own writer): while its process runs the run is refused; over, its folders go, those
    under its output_root included, which no listing of the pipeline root would find; a folder with no record is no
    run of this pipeline's, and nothing of it is deleted."""
    pipeline_root, output_root = str(tmp_path / "pipeline"), storage.join(root, "out")
    layout = {
        f"{RUN}/for-loop-1-iteration-0/shards-step-2/shards/train-0-20.tfrecord": 800,
        f"{RUN}/tokenizer-step/tokenizer/tokenizer.json": 300,
        f"{RUN}/logs/tokenizer-step.log": 20,
    }
    write_files(pipeline_root, layout)
    write_files(
        output_root,
        {
            f"{RUN}/for-loop-1-iteration-0/shards-step-2/shards/train-0-20.tfrecord": 800,
            f"{RUN}/train-step/model/tf_model.h5": 1500,
            f"checkpoints/{RUN}/checkpoint": 60,
            f"tensorboard/{RUN}/events.out.tfevents.1": 70,
        },
    )
    write_files(pipeline_root, {f"{OTHER_RUN}/tokenizer-step/tokenizer/tokenizer.json": 300})  # no record: no run
    values = {"output_root": output_root, "checkpoint_dir": ""}
    before = stored(pipeline_root), stored(root)

    with local_run_recorded(lambda: Path(pipeline_root, RUN), values):
        deadline = time.monotonic() + 30
        while not Path(pipeline_root, RUN, LOCAL_RUN_RECORD).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(InvalidParameter, match=f"its run-local process {os.getpid()} is running"):
            clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))
    assert (stored(pipeline_root), stored(root)) == (
        {**before[0], f"{RUN}/{LOCAL_RUN_RECORD}": stored(pipeline_root)[f"{RUN}/{LOCAL_RUN_RECORD}"]},
        before[1],
    )
    with pytest.raises(InvalidParameter, match="holds no record of a run-local run of this pipeline"):
        clean(CleanArguments(run=OTHER_RUN, pipeline_root=pipeline_root, delete="all", yes=True))

    summary = clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))

    assert {entry["what"]: entry["action"] for entry in summary["folders"]} == {
        "shards-step: data": "deleted",  # both: the pipeline root's and the output_root's
        "tokenizer-step: data": "deleted",
        "logs: other": "deleted",
        "train-step: model": "kept",
        "checkpoints": "deleted",
        "tensorboard": "kept",
        "the run's record": "kept",  # with the model: the run stays provable
    }
    assert files_only(of_run(stored(root), RUN)) == {
        f"out/{RUN}/train-step/model/tf_model.h5": 1500,
        f"out/tensorboard/{RUN}/events.out.tfevents.1": 70,
    }
    clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, delete="all", yes=True))
    assert of_run(stored(pipeline_root), RUN) == {} and files_only(of_run(stored(root), RUN)) == {}
    assert of_run(stored(pipeline_root), OTHER_RUN) == of_run(before[0], OTHER_RUN)


def test_a_run_local_run_whose_process_died_has_ended(tmp_path):
    pipeline_root = str(tmp_path / "pipeline")
    write_files(pipeline_root, {f"{RUN}/tokenizer-step/tokenizer/tokenizer.json": 300})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"pipeline": PIPELINE_NAME, "host": os.uname().nodename, "pid": int(dead.stdout), "state": "running"}
    record.update(output_root="", checkpoint_dir="")
    Path(pipeline_root, RUN, LOCAL_RUN_RECORD).write_text(json.dumps(record))
    assert local_record(CleanArguments(run=RUN, pipeline_root=pipeline_root)).task_folders == [
        storage.join(pipeline_root, RUN)
    ]
    record["host"] = "another-machine"
    Path(pipeline_root, RUN, LOCAL_RUN_RECORD).write_text(json.dumps(record))
    with pytest.raises(InvalidParameter, match="it is running on 'another-machine'"):
        clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))
    for forged in ({"pid": "1"}, {"pid": 2**40}, {"output_root": ["gs://b"]}, {"checkpoint_dir": None}):  # one line
        Path(pipeline_root, RUN, LOCAL_RUN_RECORD).write_text(json.dumps({**record, **forged}))
        with pytest.raises(InvalidParameter, match=f"its {LOCAL_RUN_RECORD} is not as run-local writes it"):
            clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))


def test_a_run_local_run_keeps_checkpoints_other_run_local_runs_use(tmp_path, monkeypatch):
    """Another run-local run's record naming this run's checkpoints as its checkpoint_dir keeps them; a run-local run
    whose attempts trained there and still runs refuses their deletion."""
    pipeline_root = str(tmp_path / "pipeline")
    checkpoints = checkpoint_folder(pipeline_root, RUN)
    write_files(pipeline_root, {f"{RUN}/tokenizer-step/tokenizer/tokenizer.json": 300, f"checkpoints/{RUN}/c": 60})
    for run, values in ((RUN, {}), (OTHER_RUN, {"checkpoint_dir": checkpoints})):
        with local_run_recorded(lambda run=run: Path(pipeline_root, run), values):
            pass  # its record, as run-local writes it, of a run that ended
    assert clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))["delete_objects"] == 1
    assert storage.exists(storage.join(checkpoints, "c"))

    Path(pipeline_root, OTHER_RUN, LOCAL_RUN_RECORD).unlink()
    with local_run_recorded(lambda: Path(pipeline_root, OTHER_RUN), {}):  # a run-local run going
        deadline = time.monotonic() + 30
        while os.environ.get(RUN_VARIABLE) != OTHER_RUN and time.monotonic() < deadline:
            time.sleep(0.05)
        with Attempts(checkpoints, {}, ()).recorded():  # its train step, named by run-local's environment
            pass
        with pytest.raises(InvalidParameter, match=f"run {OTHER_RUN}, which trains in {checkpoints}, is going"):
            clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))
    summary = clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))  # ended: its checkpoints too
    assert [entry["what"] for entry in summary["folders"] if entry["folder"] == checkpoints] == [
        f"checkpoints (run {OTHER_RUN} trained in them too)"
    ]
    assert storage.exists(storage.join(checkpoints, "c"))


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_only_the_objects_listed_are_deleted(root, vertex):
    """An object written in a doomed folder after the listing (a step still writing, a user's upload) stays, with the
    folders that hold it."""
    write_files(root, vertex_run(RUN))
    pipeline_job(vertex, RUN, root)
    everything = arguments(vertex, delete="all", yes=True)
    folders = run_folders(everything, vertex_record(everything))
    late = storage.join(root, PROJECT_NUMBER, RUN, "shards-step_2", "shards", "written-after-the-listing")
    storage.write_bytes_atomic(late, b"late")

    delete(folders, [])

    assert files_only(of_run(stored(root), RUN)) == {
        f"{PROJECT_NUMBER}/{RUN}/shards-step_2/shards/written-after-the-listing": 4
    }


def test_a_pipeline_root_at_the_bucket_s_root_needs_no_bucket_permission(gcs, vertex):
    """The emulator answers a request for the bucket itself with a 403, as Cloud Storage does for the README's
    account: finding the run's folders under gs://bucket must not list the bucket as a folder."""
    run = f"run-{uuid.uuid4().hex[:8]}"  # the bucket is the whole test session's
    files = {f"{PROJECT_NUMBER}/{run}/tokenizer-step_1/tokenizer/tokenizer.json": 300, f"checkpoints/{run}/c": 60}
    write_files("gs://bucket", files)
    pipeline_job(vertex, run, "gs://bucket/")  # a root written with its "/" is the same root

    summary = clean(CleanArguments(run=run, project=PROJECT, api_endpoint=vertex.url, delete="all", yes=True))

    assert summary["delete_bytes"] == 360 and of_run(stored("gs://bucket"), run) == {}


def test_a_link_in_a_run_folder_is_deleted_not_what_it_points_to(tmp_path, vertex):
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    write_files(str(root), vertex_run(RUN))
    write_files(str(outside), {"precious.txt": 5})
    os.symlink(outside, root / PROJECT_NUMBER / RUN / "tokenizer-step_1" / "tokenizer" / "linked")
    os.symlink(outside, root / "checkpoints" / OTHER_RUN)  # another run's checkpoints, elsewhere
    pipeline_job(vertex, RUN, str(root))

    summary = clean(arguments(vertex, delete="all", yes=True))

    assert summary["delete_objects"] == len(vertex_run(RUN)) + 1
    assert (outside / "precious.txt").read_bytes() == bytes(5) and (root / "checkpoints" / OTHER_RUN).is_symlink()
    assert of_run(stored(str(root)), RUN) == {}


@pytest.mark.parametrize("name", ["..", "a/b", ""])
def test_a_name_that_could_reach_beyond_the_run_is_refused_in_one_line(name, tmp_path):
    root = tmp_path / "root"
    write_files(str(root), vertex_run("b"))
    before = stored(str(root))

    result = run_module("pipelines.clean", name, "--pipeline_root", str(root / PROJECT_NUMBER), "--yes", timeout=100)

    assert result.returncode == BAD_INPUT_EXIT and result.stdout == "", result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.stderr.strip().splitlines()[-1].startswith(
        f"error: --run={name!r}: "
    )
    assert stored(str(root)) == before


def test_names_roots_and_flags_that_could_reach_beyond_the_run_are_refused(tmp_path):
    refused = {
        "checkpoints": "--run='checkpoints': is the folder of every run's checkpoints, not a run",
        "tensorboard": "--run='tensorboard': is the folder of every run's tensorboard, not a run",
        "/": "--run='/': must be a run's name or resource name (projects/P/locations/R/pipelineJobs/NAME), not a path",
        "projects/p/locations/r/pipelineJobs/..": "--run='projects/p/locations/r/pipelineJobs/..': must be a pipeline",
    }
    for name, message in refused.items():
        with pytest.raises(InvalidParameter) as error:
            CleanArguments(run=name, pipeline_root=str(tmp_path))
        assert str(error.value).startswith(message)
    resource = f"projects/my-project/locations/us-central1/pipelineJobs/{RUN}"
    assert CleanArguments(run=resource, pipeline_root=str(tmp_path)).run == RUN
    with pytest.raises(InvalidParameter, match=r"--delete='model,weights': must be a comma list of checkpoints, "):
        CleanArguments(run=RUN, pipeline_root=str(tmp_path), delete="model,weights")
    with pytest.raises(InvalidParameter, match=r"--delete='': must be a comma list"):
        CleanArguments(run=RUN, pipeline_root=str(tmp_path), delete="")
    with pytest.raises(InvalidParameter, match=r"--pipeline-root='s3://b/root': unsupported URI scheme"):
        CleanArguments(run=RUN, pipeline_root="s3://b/root")
    for pattern in ("gs://b/root-*", "gs://b/root-[x]", "runs?"):
        with pytest.raises(InvalidParameter, match=r"must be a path, without '\*', '\?', '\[' or '\]'"):
            CleanArguments(run=RUN, pipeline_root=pattern)
    with pytest.raises(InvalidParameter, match=r"--pipeline-root='': a run-local run's pipeline root is needed"):
        CleanArguments(run=RUN)
    assert CleanArguments(run=RUN, pipeline_root="gs://b/t6/").pipeline_root == "gs://b/t6"
    assert (
        CleanArguments(run=RUN, pipeline_root="runs", delete="all").delete
        == "checkpoints,data,model,reports,tensorboard"
    )


def test_every_task_of_the_pipeline_is_known_by_what_its_folder_holds():
    """A new step's folder must be classified on purpose (a model of its own would otherwise be kept as unknown)."""
    tasks = {TASK_SUFFIXES.sub("", name) for name in display_names(build_pipeline("vertex"))}
    assert tasks == set(TASK_KINDS)


def test_help_says_what_is_deleted_by_default(capsys):
    with pytest.raises(SystemExit) as ended:
        cli.main(["clean", "--help"])
    assert ended.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "tpu-mlm clean tpu-mlm-20260101-120000 --project my-project --region us-central1 --yes" in printed
    assert "its checkpoints and its data (tokenizer and shards) by default" in printed
    assert "(default: checkpoints,data)" in printed


def test_a_run_of_the_same_name_elsewhere_refuses_and_an_unreadable_one_keeps_the_checkpoints(
    tmp_path, vertex, monkeypatch
):
    """Attempts naming a run of this name in another region (its folders are this run's folders) refuse; attempts
    naming a run whose region is no region, or that cannot be read, keep the checkpoints, in one line each."""
    root = str(tmp_path / "root")
    write_files(root, vertex_run(RUN))
    pipeline_job(vertex, RUN, root)
    checkpoints = checkpoint_folder(root, RUN)
    for run in (f"projects/{PROJECT}/locations/bad@x/pipelineJobs/odd", f"{PARENT}/pipelineJobs/gone"):
        monkeypatch.setenv(RUN_VARIABLE, run)
        with Attempts(checkpoints, {}, ()).recorded():
            pass
    summary = clean(arguments(vertex, yes=True))
    assert [entry["what"] for entry in summary["folders"] if entry["folder"] == checkpoints] == [
        "checkpoints (run odd in bad@x, not readable: InvalidParameter trained in them too)"
    ]
    monkeypatch.setenv(RUN_VARIABLE, f"projects/{PROJECT}/locations/europe-west4/pipelineJobs/{RUN}")
    with Attempts(checkpoints, {}, ()).recorded():
        pass
    with pytest.raises(InvalidParameter, match=r"a run of the same name elsewhere .* cannot be told apart"):
        clean(arguments(vertex, yes=True))
    assert storage.exists(storage.join(checkpoints, "checkpoint"))


def test_a_resume_s_clean_points_at_the_resumed_run_and_delete_keeps_what_it_does_not_name(tmp_path, vertex):
    root = str(tmp_path / "root")
    write_files(root, vertex_run(RUN))
    pipeline_job(
        vertex,
        RUN,
        root,
        parameters={"checkpoint_dir": checkpoint_folder(root, "first-run")},
        labels={RESUMED_FROM_LABEL: "first-run"},
    )
    summary = clean(arguments(vertex, delete="tensorboard", yes=True))
    assert summary["hints"] == [
        "its checkpoints are run first-run's, which it resumed: they go with tpu-mlm clean first-run"
    ]
    actions = {entry["what"]: entry["action"] for entry in summary["folders"]}
    assert actions["tensorboard"] == "deleted" and actions["part-indices: other"] == "kept"  # other goes with data


def test_a_root_written_two_ways_is_listed_once(tmp_path, monkeypatch):
    """run-local's output_root the pipeline root, written relative: each file listed and deleted once."""
    monkeypatch.chdir(tmp_path)
    pipeline_root = str(tmp_path / "runs")
    write_files(pipeline_root, {f"{RUN}/tokenizer-step/tokenizer/tokenizer.json": 300})
    with local_run_recorded(lambda: Path(pipeline_root, RUN), {"output_root": "./runs/", "checkpoint_dir": ""}):
        pass
    summary = clean(CleanArguments(run=RUN, pipeline_root=pipeline_root, yes=True))
    assert summary["delete_objects"] == 2 and of_run(stored(pipeline_root), RUN) == {}  # the tokenizer, the record


def test_run_local_finds_its_own_folder_when_another_run_local_makes_one_beside_it(tmp_path):
    before = {tmp_path / f"{PIPELINE_NAME}-2026-12-05-08-00-00-000000"}
    for folder in (*before, tmp_path / f"{PIPELINE_NAME}-2026-12-05-09-00-00-000000"):
        folder.mkdir()
    assert new_run_folder(tmp_path, before, datetime.datetime(2026, 12, 5, 9, 0, 1)).name.endswith("09-00-00-000000")
    (tmp_path / f"{PIPELINE_NAME}-2026-12-05-09-00-03-000000").mkdir()  # another's, started later
    assert new_run_folder(tmp_path, before, datetime.datetime(2026, 12, 5, 9, 0, 0)).name.endswith("09-00-00-000000")
