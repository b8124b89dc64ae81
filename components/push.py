"""Push a trained model, its tokenizer and a model card with the evaluation results to the Hugging Face Hub.

Everything goes up in one commit to ``--repo_id``, created (optionally private) when it does not exist;
pushing unchanged content again makes no new commit. The token comes from ``HF_TOKEN``, or from a Secret
Manager secret named by ``--hf_token_secret`` (on Vertex AI); it never appears in arguments, logs or files.

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
from components.lib.errors import InvalidParameter
from components.lib.hub import DEFAULT_RETRIES, check_repo_id, check_secret_name, create_repo, hub_token, push_folder
from components.lib.jobs import run_job
from components.lib.results import METRICS_FILE, SUMMARY_FILE, loss_summary, metrics_table


@dataclass
class PushArguments:
    model: str = field(metadata={"help": "Model folder from components.train (local or gs://)."})
    repo_id: str = field(metadata={"help": "Hub repository 'namespace/name'."})
    evaluation: str = field(default="", metadata={"help": "Folder with metrics.json from components.evaluate."})
    private: bool = field(
        default=True,
        metadata={
            "help": "Create the repository as private (--no_private: public; an existing one keeps its visibility)."
        },
    )
    hf_token_secret: str = field(
        default="", metadata={"help": "Secret Manager secret holding the token; else HF_TOKEN is used."}
    )
    commit_message: str = field(default="Upload masked language model pre-trained with tpu-mlm-pipeline")
    retries: int = field(
        default=DEFAULT_RETRIES, metadata={"help": "Tries again after transient Hub errors (1, 2, 4 ... s apart)."}
    )

    def __post_init__(self) -> None:
        check_repo_id("repo_id", self.repo_id)
        if not 0 <= self.retries <= 10:
            raise InvalidParameter("retries", self.retries, "must be from 0 to 10")
        storage.check_uri("model", self.model)
        if self.evaluation:
            storage.check_uri("evaluation", self.evaluation)
        if self.hf_token_secret:
            check_secret_name(self.hf_token_secret)


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
        summary = json.loads((folder / SUMMARY_FILE).read_text())
        config = json.loads((folder / "config.json").read_text())
        (folder / "README.md").write_text(model_card(arguments.repo_id, summary, config, metrics))
        create_repo(arguments.repo_id, token, arguments.private, arguments.retries)
        commit = push_folder(folder, arguments.repo_id, token, arguments.commit_message, retries=arguments.retries)
    return {"repo_id": arguments.repo_id, "commit": commit.oid, "commit_url": commit.commit_url}


def model_card(repo_id: str, summary: dict[str, Any], config: dict[str, Any], metrics: dict | None) -> str:
    """The repository's README.md: what was trained on what, how, with which results, and how to use it."""
    train_arguments = summary["arguments"]
    hyperparameters = {
        key: train_arguments[key]
        for key in (
            "model_config",
            "per_replica_batch_size",
            "learning_rate",
            "warmup_fraction",
            "weight_decay",
            "mlm_probability",
            "bf16",
            "seed",
        )
    }
    hyperparameters.update(global_batch_size=summary["global_batch_size"], total_steps=summary["total_steps"])
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: fill-mask",
        "tags:",
        "- tensorflow",
        "- roberta",
        "- masked-language-modeling",
        "- tpu-mlm-pipeline",
        "---",
        "",
        f"# {repo_id.split('/')[-1]}",
        "",
        f"A {config.get('model_type', 'roberta')} masked language model pre-trained from scratch with "
        "[tpu-mlm-pipeline](https://github.com/) (Kubeflow Pipelines on Vertex AI, TensorFlow).",
        "",
        "## Model",
        "",
        f"- hidden size {config['hidden_size']}, {config['num_hidden_layers']} layers, "
        f"{config['num_attention_heads']} attention heads, intermediate size {config['intermediate_size']}",
        f"- {summary['num_parameters']:,} parameters, vocabulary of {config['vocab_size']:,} Unigram pieces",
        f"- tokenizer fingerprint `{summary['tokenizer_fingerprint']}`",
        "",
        "## Training",
        "",
        f"- {summary['total_steps']:,} steps, {summary['samples']:,} samples, {summary['tokens']:,} tokens on "
        f"{summary['replicas']} {summary['accelerator'].upper()} replica(s)",
        f"- training corpus: `{summary['corpus']['source']}` (shards `{train_arguments['train_shards']}`)",
        f"- training loss: {loss_summary(summary)}",
        "",
        "| hyperparameter | value |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in hyperparameters.items()],
    ]
    if metrics:
        lines += [
            "",
            f"## Evaluation on `{metrics['split']}`",
            "",
            *metrics_table(metrics),
        ]
    lines += [
        "",
        "## How to use",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        "# dtype=None: transformers 4.57 looks its default dtype up on torch, which a TF-only setup lacks",
        f'fill = pipeline("fill-mask", model="{repo_id}", framework="tf", dtype=None)',
        'fill("The history of the <mask> begins in the early twentieth century.")',
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(PushArguments, push, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
