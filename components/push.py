"""Push a trained model, its tokenizer and a model card with the evaluation results to the Hugging Face Hub.

The repository holds the weights for PyTorch (``model.safetensors``, what transformers 5 loads) and for TF
(``tf_model.h5``); a model folder trained before the project wrote PyTorch weights gets them here. Everything
goes up in one commit to ``--repo_id``, created (optionally private) when it does not exist;
pushing unchanged content again makes no new commit. The token comes from ``HF_TOKEN``, or from a Secret
Manager secret named by ``--hf_token_secret`` (on Vertex AI); it never appears in arguments, logs or files. What
is pushed names no bucket, project, path or secret: ``training_summary.json`` goes up as its public copy (the run's
figures and settings; the arguments that held locations are left out and listed under ``left_out``).

    HF_TOKEN=... python -m components.push --model /tmp/model --evaluation /tmp/eval --repo_id me/my-roberta
"""

import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.base_model import base_license, base_model_token
from components.lib.errors import InvalidParameter, first_line
from components.lib.hub import (
    CARD_FILE,
    DEFAULT_RETRIES,
    LICENSE_ID,
    HubToken,
    check_repo_id,
    check_retries,
    check_secret_name,
    create_repo,
    hub_token,
    push_folder,
)
from components.lib.job_runner import run_job
from components.lib.model_card import model_card, public_summary
from components.lib.pytorch_weights import add_pytorch_weights, pytorch_weight_files
from components.lib.results import METRICS_FILE, SUMMARY_FILE, read_downstream


@dataclass
class PushArguments(HubToken):
    model: str = field(metadata={"help": "Model folder from components.train (local or gs://)."})
    repo_id: str = field(metadata={"help": "Hub repository 'namespace/name'."})
    evaluation: str = field(default="", metadata={"help": "Folder with metrics.json from components.evaluate."})
    downstream: str = field(
        default="", metadata={"help": "Folder with downstream.json from components.downstream; none if empty."}
    )
    private: bool = field(
        default=True,
        metadata={
            "help": "Create the repository as private (--no_private: public; an existing one keeps its visibility)."
        },
    )
    license: str = field(
        default="",
        metadata={
            "help": "The model card's license, a Hub license id (apache-2.0, mit, cc-by-4.0, other, ...); if empty, "
            "none stated (a model continued with init_from: its base card's)."
        },
    )
    commit_message: str = field(default="Upload masked language model pre-trained with tpu-mlm-pipeline")
    retries: int = field(
        default=DEFAULT_RETRIES, metadata={"help": "Tries again after transient Hub errors (1, 2, 4 ... s apart)."}
    )

    def __post_init__(self) -> None:
        check_repo_id("repo_id", self.repo_id)
        check_retries(self.retries)
        storage.check_uri("model", self.model)
        for parameter in ("evaluation", "downstream"):
            if getattr(self, parameter):
                storage.check_uri(parameter, getattr(self, parameter))
        if self.hf_token_secret:
            check_secret_name(self.hf_token_secret)
        if self.license and not LICENSE_ID.match(self.license):
            raise InvalidParameter(
                "license", self.license, "must be a Hub license id such as apache-2.0, mit, cc-by-4.0 or other"
            )


def push(arguments: PushArguments) -> dict[str, Any]:
    """Checks everything, then uploads model, tokenizer and model card in one commit."""
    token = hub_token("repo_id", arguments.repo_id, arguments.hf_token_secret)
    if not storage.exists(storage.join(arguments.model, SUMMARY_FILE)):
        raise InvalidParameter("model", arguments.model, f"is not a finished model folder (no {SUMMARY_FILE})")
    metrics = None
    if arguments.evaluation:
        metrics_uri = storage.join(arguments.evaluation, METRICS_FILE)
        if not storage.exists(metrics_uri):
            raise InvalidParameter("evaluation", arguments.evaluation, f"holds no {METRICS_FILE}")
        metrics = json.loads(storage.read_text(metrics_uri))
    with tempfile.TemporaryDirectory() as staging:
        folder = storage.download_folder(arguments.model, Path(staging))  # files only: no checkpoints, no logs
        if not pytorch_weight_files(folder):
            add_pytorch_weights(folder, "model", arguments.model)  # a model trained before they were written
        trained = json.loads((folder / SUMMARY_FILE).read_text())
        terms = base_terms(trained.get("base_model", ""), arguments)
        summary = public_summary(trained)  # no bucket, project, path, secret
        (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        config = json.loads((folder / "config.json").read_text())
        probe = read_downstream(arguments.downstream)
        card = model_card(arguments.repo_id, summary, config, metrics, arguments.license, probe, terms)
        (folder / CARD_FILE).write_text(card)
        create_repo(arguments.repo_id, token, arguments.private, arguments.retries)
        commit = push_folder(folder, arguments.repo_id, token, arguments.commit_message, retries=arguments.retries)
    return {"repo_id": arguments.repo_id, "commit": commit.oid, "commit_url": commit.commit_url}


def base_terms(base: str, arguments: PushArguments) -> dict[str, str]:
    """The license of the model a continued model was trained from (its card's, at the commit it was read), which
    the card states. A base that cannot be read now does not stop the push at the end of a run: the card says so
    (``unread``), and so does a warning."""
    if not base:
        return {}
    try:
        return base_license(base, base_model_token(base, arguments.hf_token_secret))
    except Exception as error:  # a base gone, a bucket no longer readable, a card whose metadata does not parse
        reason = f"{type(error).__name__}: {first_line(error)}"
        print(f"warning: the base model's license could not be read ({reason}); give --license", file=sys.stderr)
        return {"unread": reason}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(PushArguments, push, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
