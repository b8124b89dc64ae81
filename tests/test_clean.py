"""tpu-mlm clean: a run's folders found in the Vertex AI, kfp.local and output_root layouts, on this machine and in a
bucket (the emulator, which answers any bucket request with the 403 the README's object roles get); the dry run
deletes nothing; --yes deletes exactly the run's folders but what --keep keeps, never another run's (one whose name
begins with this run's included), and finds nothing left the second time; a name that could reach beyond the run is
refused in one line with status 2. What is left is read without the storage layer: google-cloud-storage in the
bucket (TensorFlow's folder markers included), pathlib on this machine (folders included)."""

import json
import os
import uuid
from pathlib import Path

import pytest
from conftest import run_module
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs_client

from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.job_runner import BAD_INPUT_EXIT
from pipelines import cli
from pipelines.clean import CACHING_WARNING, GIB, TASK_KINDS, TASK_SUFFIXES, CleanArguments, clean, summary_for_people
from pipelines.pipeline import build_pipeline
from pipelines.run_folders import checkpoint_folder
from pipelines.run_local import display_names

pytestmark = pytest.mark.timeout(120)

RUN = "tpu-mlm-pretraining-20260101120000"
OTHER_RUN = f"{RUN}-2"  # a glob or prefix that took RUN for a beginning would reach it
PROJECT_NUMBER = "123456"


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


# RUN's folders in vertex_run, by what the default --keep (model, reports, tensorboard) does to them
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
    for relative, size in files.items():
        storage.write_bytes_atomic(storage.join(root, relative), bytes(size))


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


def test_the_dry_run_lists_the_run_s_folders_with_their_sizes_and_deletes_nothing(root, capsys):
    write_files(root, vertex_run(RUN))
    write_files(root, vertex_run(OTHER_RUN))
    before = stored(root)

    assert cli.main(["clean", RUN, "--pipeline_root", root]) == 0  # the run's name as the first word

    assert stored(root) == before
    printed = capsys.readouterr().out
    assert cli.main(["clean", RUN, "--pipeline_root", root, "--json"]) == 0
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
    assert summary["command"] == f"tpu-mlm clean {RUN} --pipeline_root {root} --keep model,reports,tensorboard --yes"
    lines = printed.splitlines()
    assert lines[0] == f"run {RUN}: dry run, nothing deleted"
    assert lines[-1] == f"to delete them: {summary['command']}" and CACHING_WARNING in lines
    assert "11.2 KiB to delete: $0.00 a month to save at $0.020 a GiB-month (Standard, us-central1)" in lines
    assert any(line.split() == [f"{root}/checkpoints/{RUN}", "checkpoints", "2", "5,060", "delete"] for line in lines)


def test_yes_deletes_the_run_s_folders_but_the_kept_ones_and_then_finds_nothing_left(root, capsys):
    write_files(root, vertex_run(RUN))
    write_files(root, vertex_run(OTHER_RUN))
    other_run = of_run(stored(root), OTHER_RUN)
    model = f"{PROJECT_NUMBER}/{RUN}/train-step_4/"

    summary = clean(CleanArguments(run=RUN, pipeline_root=root, keep="model", yes=True))

    left = of_run(stored(root), RUN)
    assert {path: size for path, size in left.items() if not path.endswith("/")} == {
        path: size for path, size in vertex_run(RUN).items() if path.startswith(model)
    }
    assert [path for path in left if not path.startswith(model)] in ([], [f"{PROJECT_NUMBER}/{RUN}/"])  # its folder
    assert of_run(stored(root), OTHER_RUN) == other_run
    assert {folder: action for folder, (*_, action) in found(summary, root).items()} == {
        folder: "kept" if folder == model.rstrip("/") else "deleted" for folder in DEFAULT_ACTIONS
    }
    assert summary["delete_objects"] == 10 and "command" not in summary

    again = clean(CleanArguments(run=RUN, pipeline_root=root, keep="model", yes=True))
    assert again["delete_objects"] == 0 and [entry["action"] for entry in again["folders"]] == ["kept"]
    assert summary_for_people(again).startswith(f"run {RUN}: nothing left to delete\n")

    assert cli.main(["clean", RUN, "--pipeline_root", root, "--keep", "", "--yes"]) == 0
    assert capsys.readouterr().out.startswith(f"run {RUN}: deleted 2 objects\n")
    assert of_run(stored(root), RUN) == {} and of_run(stored(root), OTHER_RUN) == other_run

    assert cli.main(["clean", RUN, "--pipeline_root", root, "--keep", "", "--yes"]) == 0
    assert (
        capsys.readouterr().out.strip()
        == f"run {RUN}: no folder of it under {root}: nothing to delete (check the name)"
    )
    assert of_run(stored(root), OTHER_RUN) == other_run


def test_the_kfp_local_and_output_root_layouts_and_a_fixed_checkpoint_dir(root):
    pipeline_root, output_root = storage.join(root, "pipeline"), storage.join(root, "out")
    fixed_checkpoints = storage.join(root, "fixed-checkpoints")
    for run in (RUN, OTHER_RUN):
        write_files(
            pipeline_root,
            {
                f"{run}/for-loop-1-iteration-0/shards-step-2/shards/train-0-20.tfrecord": 800,
                f"{run}/tokenizer-step/tokenizer/tokenizer.json": 300,
                f"{run}/logs/tokenizer-step.log": 20,
            },
        )
        write_files(
            output_root,
            {
                f"{run}/train-step_4/model/tf_model.h5": 1500,
                f"{run}/report-step_7/report": 90,
                f"checkpoints/{run}/checkpoint": 60,
                f"tensorboard/{run}/events.out.tfevents.1": 70,
            },
        )
    write_files(fixed_checkpoints, {"checkpoint": 60})
    before = stored(root)
    arguments = {"run": RUN, "pipeline_root": pipeline_root, "output_root": output_root, "keep": ""}

    summary = clean(CleanArguments(**arguments, checkpoint_dir=fixed_checkpoints))

    assert stored(root) == before
    assert found(summary, root) == {
        f"out/checkpoints/{RUN}": ("checkpoints", 1, 60, "delete"),
        f"out/tensorboard/{RUN}": ("tensorboard", 1, 70, "delete"),
        f"out/{RUN}/report-step_7": ("report-step: reports", 1, 90, "delete"),
        f"out/{RUN}/train-step_4": ("train-step: model", 1, 1500, "delete"),
        f"pipeline/{RUN}/for-loop-1-iteration-0/shards-step-2": ("shards-step: data", 1, 800, "delete"),
        f"pipeline/{RUN}/logs": ("logs: other", 1, 20, "delete"),
        f"pipeline/{RUN}/tokenizer-step": ("tokenizer-step: data", 1, 300, "delete"),
    }
    assert summary["command"] == (
        f"tpu-mlm clean {RUN} --pipeline_root {pipeline_root} --output_root {output_root} --keep '' --yes"
    )
    assert summary["hint"].startswith(f"the run's checkpoint_dir {fixed_checkpoints} is not deleted")

    clean(CleanArguments(**arguments, checkpoint_dir=fixed_checkpoints, yes=True))

    assert of_run(stored(root), RUN) == {}
    assert stored(root) == {path: size for path, size in before.items() if RUN not in path.split("/")}


def test_a_pipeline_root_at_the_bucket_s_root_needs_no_bucket_permission(gcs):
    """The emulator answers a request for the bucket itself with a 403, as Cloud Storage does for the README's
    account: finding the run's folders under gs://bucket must not list the bucket as a folder."""
    run = f"run-{uuid.uuid4().hex[:8]}"  # the bucket is the whole test session's
    files = {f"{PROJECT_NUMBER}/{run}/tokenizer-step_1/tokenizer/tokenizer.json": 300, f"checkpoints/{run}/c": 60}
    write_files("gs://bucket", files)

    summary = clean(CleanArguments(run=run, pipeline_root="gs://bucket", keep="", yes=True))

    assert summary["delete_bytes"] == 360 and of_run(stored("gs://bucket"), run) == {}


def test_a_link_in_a_run_folder_is_deleted_not_what_it_points_to(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    write_files(str(root), vertex_run(RUN))
    write_files(str(outside), {"precious.txt": 5})
    os.symlink(outside, root / PROJECT_NUMBER / RUN / "tokenizer-step_1" / "tokenizer" / "linked")
    os.symlink(outside, root / "checkpoints" / OTHER_RUN)  # another run's checkpoints, elsewhere

    summary = clean(CleanArguments(run=RUN, pipeline_root=str(root), keep="", yes=True))

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


def test_names_of_the_folders_beside_the_runs_and_bad_flags_are_refused(tmp_path):
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
    with pytest.raises(InvalidParameter, match=r"--keep='model,weights': must be a comma list of model, reports, "):
        CleanArguments(run=RUN, pipeline_root=str(tmp_path), keep="model,weights")
    with pytest.raises(InvalidParameter, match=r"--pipeline-root='s3://b/root': unsupported URI scheme"):
        CleanArguments(run=RUN, pipeline_root="s3://b/root")


def test_every_task_of_the_pipeline_is_known_by_what_its_folder_holds():
    """A new step's folder must be classified on purpose (a model of its own would otherwise go as "other")."""
    tasks = {TASK_SUFFIXES.sub("", name) for name in display_names(build_pipeline("vertex"))}
    assert tasks == set(TASK_KINDS)


def test_help_says_what_is_kept_by_default(capsys):
    with pytest.raises(SystemExit) as ended:
        cli.main(["clean", "--help"])
    assert ended.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "tpu-mlm clean tpu-mlm-20260101-120000 --pipeline_root gs://MY_BUCKET/root --yes" in printed
    assert "By default the model, the reports and the TensorBoard logs are kept" in printed
    assert "(default: model,reports,tensorboard)" in printed


def test_checkpoints_a_training_still_runs_in_are_not_deleted(tmp_path):
    """A run resumed from this one (submit --resume) trains in this run's checkpoint folder: while its attempt is
    running there (attempts.json, the train step's own record), the checkpoints are refused, in one line."""
    from components.lib.attempts import Attempts

    root = str(tmp_path / "root")
    write_files(root, vertex_run(RUN))
    folder = checkpoint_folder(root, RUN)
    attempt = Attempts(folder, {"learning_rate": 4e-4}, ())
    with attempt.recorded():
        with pytest.raises(InvalidParameter, match=f"--run='{RUN}': a training is running in {folder}"):
            clean(CleanArguments(run=RUN, pipeline_root=root, yes=True))
        assert vertex_run(RUN).keys() <= stored(root).keys()  # nothing deleted
        kept = clean(CleanArguments(run=RUN, pipeline_root=root, keep="checkpoints", yes=True))
        assert kept["delete_objects"] > 0 and storage.exists(storage.join(folder, "attempts.json"))
    # once it has ended, they go
    assert clean(CleanArguments(run=RUN, pipeline_root=root, keep="", yes=True))["delete_objects"] > 0
    assert storage.files_under(folder) == []
