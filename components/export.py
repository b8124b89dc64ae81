"""Add PyTorch weights to a model saved with TF weights only, so transformers 5 and the PyTorch tools load it.

Models trained before the project wrote ``model.safetensors`` hold ``tf_model.h5`` alone. This job reads
such a model, a local or ``gs://`` folder or a Hub repository (``hf:namespace/name``), converts its weights
into PyTorch's names and layouts (numpy only, no torch), makes its config name the PyTorch class and its
model card's usage section the current one, and writes the whole model to ``--output``: a folder (the same
one is fine) or a Hub repository, in one commit. A train step's folder going to the Hub, which has no card,
gets the push step's card without evaluation results. Running it again writes the same bytes, and makes no
new Hub commit. A Hub repository is read with ``HF_TOKEN`` when set; writing to one needs it (or
``--hf_token_secret``).

    python -m components.export --model gs://bucket/run/model --output hf:me/my-roberta
    python -m components.export --model hf:me/old-roberta --output hf:me/old-roberta
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.corpus import HUB_PREFIX
from components.lib.errors import InvalidParameter
from components.lib.hub import (
    CARD_FILE,
    DEFAULT_RETRIES,
    HubToken,
    check_repo_id,
    check_retries,
    check_secret_name,
    create_repo,
    download_repo,
    hub_token,
    push_folder,
    read_token,
)
from components.lib.job_runner import run_job
from components.lib.model_card import USAGE_HEADING, model_card, public_summary, usage_section
from components.lib.pytorch_weights import add_pytorch_weights, check_model_folder
from components.lib.results import SUMMARY_FILE


@dataclass
class ExportArguments(HubToken):
    model: str = field(metadata={"help": "Model folder (local or gs://) or Hub repository hf:namespace/name."})
    output: str = field(metadata={"help": "Folder (local or gs://; the model's own is fine) or hf:namespace/name."})
    private: bool = field(
        default=True, metadata={"help": "Create a new output repository as private (--no_private: public)."}
    )
    commit_message: str = field(
        default="Add PyTorch weights (model.safetensors) for transformers 5",
        metadata={"help": "The Hub commit's message."},
    )
    retries: int = field(
        default=DEFAULT_RETRIES, metadata={"help": "Tries again after transient Hub errors (1, 2, 4 ... s apart)."}
    )

    def __post_init__(self) -> None:
        for parameter in ("model", "output"):
            location = getattr(self, parameter)
            if location.startswith(HUB_PREFIX):
                try:
                    check_repo_id(parameter, location.removeprefix(HUB_PREFIX))
                except InvalidParameter as error:  # the value as typed, hf: included
                    raise InvalidParameter(parameter, location, error.expected) from None
            else:
                storage.check_uri(parameter, location)
        if not self.output.startswith(HUB_PREFIX) and storage.exists(self.output) and not storage.isdir(self.output):
            raise InvalidParameter("output", self.output, "is a file; name a folder (the model's own is fine)")
        check_retries(self.retries)
        if self.hf_token_secret:
            check_secret_name(self.hf_token_secret)


def export(arguments: ExportArguments) -> dict[str, Any]:
    """Reads the model, adds its PyTorch weights and writes it to the output; returns what was written."""
    to_hub = arguments.output.startswith(HUB_PREFIX)
    output_repo = arguments.output.removeprefix(HUB_PREFIX)
    token = (
        hub_token("output", arguments.output, arguments.hf_token_secret)
        if to_hub
        else read_token(arguments.hf_token_secret)
    )
    with tempfile.TemporaryDirectory() as staging:
        folder = _fetch(arguments.model, Path(staging, "model"), token, arguments.retries)
        written = add_pytorch_weights(folder, "model", arguments.model)
        # the card's code names the repository it describes: the output's, else the source's
        _update_card(folder, output_repo if to_hub else arguments.model.removeprefix(HUB_PREFIX), new=to_hub)
        result: dict[str, Any] = {"model": arguments.model, "output": arguments.output, "weights": written}
        if to_hub:  # published: the summary's public copy, as the push step's
            if (folder / SUMMARY_FILE).exists():
                summary = public_summary(json.loads((folder / SUMMARY_FILE).read_text()))
                (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
            create_repo(output_repo, token, arguments.private, arguments.retries)
            commit = push_folder(folder, output_repo, token, arguments.commit_message, retries=arguments.retries)
            result.update(commit=commit.oid, commit_url=commit.commit_url)
        else:
            storage.upload_folder(folder, arguments.output, last=[SUMMARY_FILE])
    return result


def _fetch(model: str, folder: Path, token: str, retries: int) -> Path:
    """A local copy of the model's files, from its folder or its Hub repository."""
    if model.startswith(HUB_PREFIX):
        return download_repo("model", model.removeprefix(HUB_PREFIX), folder, token, retries)
    check_model_folder("model", model)
    return storage.download_folder(model, folder)


def _update_card(folder: Path, name: str, new: bool) -> None:
    """The model card's usage section made the current one (an older card's TF snippet would now load
    ``model.safetensors`` and fail; a card of another layout gets the section added at its end); with ``new``
    (a Hub repository out), a train step's folder, which has none, gets the whole card the push step writes,
    without evaluation results."""
    card = folder / CARD_FILE
    if not card.exists():
        if new and (folder / SUMMARY_FILE).exists():
            summary = json.loads((folder / SUMMARY_FILE).read_text())
            card.write_text(model_card(name, summary, json.loads((folder / "config.json").read_text()), None))
        return
    text = card.read_text()
    kept = text.split(USAGE_HEADING)[0].rstrip("\n")
    card.write_text(kept + "\n\n" + "\n".join(usage_section(name)) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(ExportArguments, export, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
