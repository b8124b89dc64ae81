"""tpu-mlm export: a model saved with TF weights only (as the project saved them before) gets the PyTorch weights
the train step now writes, from a folder, a bucket or a Hub repository, into a folder or a Hub repository."""

import re
import shutil
from pathlib import Path

import pytest
from conftest import HUB_TOKEN, LONG_TEST_SECONDS, run_module
from huggingface_hub import HfApi
from pytorch_env import run_pytorch

from components.export import ExportArguments
from components.lib import storage
from components.lib.errors import InvalidParameter
from components.lib.model_card import USAGE_HEADING
from components.lib.pytorch_weights import WEIGHTS_FILE

# the tests of the files that read the tiny model in one process: the others need not wait on its making
pytestmark = pytest.mark.xdist_group("tiny_model")

OLD_CARD = """---
library_name: transformers
---

# old-roberta

Trained long ago.

## How to use

```python
fill = pipeline("fill-mask", model="user/old-roberta", framework="tf", dtype=None)
```
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_model) -> dict[str, Path]:
    """The train step's model folder, and the same folder as the project saved it before: TF weights only."""
    tf_only = tmp_path_factory.mktemp("export") / "tf-only"
    shutil.copytree(tiny_model, tf_only, ignore=shutil.ignore_patterns("checkpoints", "logs"))
    (tf_only / WEIGHTS_FILE).unlink()
    return {"model": tiny_model, "tf-only": tf_only}


def export(*args: str, env: dict | None = None):
    """Runs the job as a user would, in this process's environment or ``env`` (a Hub stand-in's)."""
    result = run_module("components.export", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow
def test_a_tf_only_folder_gets_the_weights_the_train_step_writes_and_a_rerun_changes_nothing(tmp_path, models):
    output = tmp_path / "exported"
    export("--model", str(models["tf-only"]), "--output", str(output))
    assert (output / WEIGHTS_FILE).read_bytes() == (models["model"] / WEIGHTS_FILE).read_bytes()
    assert {p.name for p in models["tf-only"].iterdir()} | {WEIGHTS_FILE} == {p.name for p in output.iterdir()}
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    export("--model", str(output), "--output", str(output))  # in place, again
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before
    answer = run_pytorch({"model": str(output)})
    assert answer["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}


@pytest.mark.slow
def test_a_hub_repository_is_exported_in_place_in_one_commit_its_card_made_current(tmp_path, hub, models, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # the commit URLs this process parses
    api = HfApi(endpoint=hub.url, token=HUB_TOKEN)
    api.create_repo("user/old-roberta", private=True)
    (tmp_path / "README.md").write_text(OLD_CARD)
    api.upload_folder(repo_id="user/old-roberta", folder_path=models["tf-only"])
    api.upload_file(repo_id="user/old-roberta", path_or_fileobj=str(tmp_path / "README.md"), path_in_repo="README.md")
    repo = hub.repos["user/old-roberta"]
    assert WEIGHTS_FILE not in repo.files and len(repo.commits) == 2

    export("--model", "hf:user/old-roberta", "--output", "hf:user/old-roberta", env=hub.env)
    assert len(repo.commits) == 3
    assert hub.file("user/old-roberta", WEIGHTS_FILE) == (models["model"] / WEIGHTS_FILE).read_bytes()
    card = hub.file("user/old-roberta", "README.md").decode()
    assert card.startswith(OLD_CARD.split(USAGE_HEADING)[0]) and card.count(USAGE_HEADING) == 1
    assert 'pipeline("fill-mask", model="user/old-roberta")' in card and '"use_safetensors": False' in card

    export("--model", "hf:user/old-roberta", "--output", "hf:user/old-roberta", env=hub.env)
    assert len(repo.commits) == 3, "an export of an exported repository made a new commit"
    answer = run_pytorch({"model": "user/old-roberta"}, hub.env)
    assert answer["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}


@pytest.mark.slow
def test_a_bucket_folder_is_exported_to_a_new_hub_repository(gcs, hub, models):
    storage.upload_folder(models["tf-only"], gcs + "/model")
    export("--model", gcs + "/model", "--output", "hf:user/from-bucket", "--no_private", env=hub.env)  # gcs's too
    repo = hub.repos["user/from-bucket"]
    assert not repo.private and len(repo.commits) == 1
    assert hub.file("user/from-bucket", WEIGHTS_FILE) == (models["model"] / WEIGHTS_FILE).read_bytes()
    card = hub.file("user/from-bucket", "README.md").decode()  # a train step's folder has none: the push's card
    assert "pipeline_tag: fill-mask" in card and 'pipeline("fill-mask", model="user/from-bucket")' in card


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model": "hf:bad", "output": "/tmp/x"}, "--model='hf:bad': must be a Hub repository id"),
        ({"model": "/tmp/m", "output": "hf:a/b/c"}, "--output='hf:a/b/c': must be a Hub repository id"),
        ({"model": "/tmp/m", "output": "s3://b/m"}, "--output='s3://b/m': unsupported URI scheme"),
    ],
)
def test_bad_locations_are_refused_as_typed(values, message):
    with pytest.raises(InvalidParameter, match=re.escape(message)):
        ExportArguments(**values)


def test_an_output_that_is_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "tf_model.h5").write_bytes(b"")
    with pytest.raises(InvalidParameter, match=r"--output='.*tf_model.h5': is a file; name a folder"):
        ExportArguments(model=str(tmp_path), output=str(tmp_path / "tf_model.h5"))
