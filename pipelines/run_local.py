"""Run the whole pipeline on this machine under ``kfp.local``, then show what it made.

The default is a first run in minutes on 2 cores: the embedded corpus, a 5,000-piece tokenizer and the
``tiny`` model, every step a subprocess in this environment (``SubprocessRunner``, no Docker). With
``--docker`` each step runs in the project's CPU image through ``DockerRunner`` instead. At the end it
prints where each artifact is, the evaluation metrics and a fill-mask example; the run's folder holds
everything under ``--pipeline_root``.

    python -m pipelines.run_local [--corpus FILES] [--model_config tiny] [--docker]
"""

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components import storage
from components.cli import run_job
from components.errors import InvalidParameter
from components.evaluate import METRICS_FILE
from components.hub import check_repo_id, hub_token
from pipelines.pipeline import DEFAULT_CPU_IMAGE, PIPELINE_NAME, build_pipeline

# The folder of each artifact inside a run, by task and output name, in the order they are made.
ARTIFACTS = {
    "tokenizer": "tokenizer-step/tokenizer",
    "validation shards": "shards-step/shards",
    "train shards": "merge-shards-step/shards",
    "model": "train-step/model",
    "evaluation": "evaluate-step/evaluation",
    "evaluation report": "evaluate-step/report",
    "run report": "report-step/report",
}
# What a push from inside a step's container needs from this environment.
HUB_ENVIRONMENT = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_DISABLE_XET")
# The ones that move to --output_root when it is set (the reports are KFP's, they stay with the run).
DATA_ARTIFACTS = ("tokenizer", "validation shards", "train shards", "model", "evaluation")


@dataclass
class RunLocalArguments:
    pipeline_root: str = field(default="runs", metadata={"help": "Local folder for the runs (kfp.local's own)."})
    checkpoint_dir: str = field(
        default="", metadata={"help": "A fixed checkpoint folder: running again resumes the training from it."}
    )
    output_root: str = field(
        default="", metadata={"help": "Store the steps' data here (a gs:// URI or a folder) instead of the root."}
    )
    corpus: str = field(default="embedded", metadata={"help": "Training corpus (see components.corpus)."})
    validation_corpus: str = field(default="", metadata={"help": "Validation corpus; else a held-out fraction."})
    holdout_fraction: float = field(default=0.05, metadata={"help": "Held out for validation without one."})
    vocab_size: int = field(default=5_000, metadata={"help": "Tokenizer vocabulary."})
    model_config: str = field(default="tiny", metadata={"help": "Model preset or config.json."})
    per_replica_batch_size: int = field(default=16, metadata={"help": "Samples per replica and step."})
    replicas: int = field(
        default=0,
        metadata={"help": "Split the CPU into N replicas for training, as a TPU would (8 rehearses a v3-8's batch)."},
    )
    num_epochs: int = field(default=3, metadata={"help": "Passes over the training shards."})
    max_steps: int = field(default=0, metadata={"help": "Steps; overrides num_epochs when > 0."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate (higher for tiny models)."})
    num_parts: int = field(default=1, metadata={"help": "Training-shard tasks run in parallel."})
    hub_repo_id: str = field(default="", metadata={"help": "Push the model here at the end (token: HF_TOKEN)."})
    hub_private: bool = field(default=False, metadata={"help": "Create the Hub repository as private."})
    docker: bool = field(default=False, metadata={"help": "Run each step in the CPU image with DockerRunner."})
    image: str = field(default=DEFAULT_CPU_IMAGE, metadata={"help": "Image for --docker (local name:tag)."})

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


def run_local(arguments: RunLocalArguments) -> dict[str, Any]:
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
    # loop iterations' folders repeat from run to run, so each run's data gets a folder of its own
    output_root = arguments.output_root and storage.join(arguments.output_root, time.strftime("run-%Y%m%d-%H%M%S"))
    started = time.perf_counter()
    pipeline(
        corpus=arguments.corpus,
        validation_corpus=arguments.validation_corpus,
        holdout_fraction=arguments.holdout_fraction,
        vocab_size=arguments.vocab_size,
        model_config=arguments.model_config,
        per_replica_batch_size=arguments.per_replica_batch_size,
        replicas=arguments.replicas,
        num_epochs=arguments.num_epochs,
        max_steps=arguments.max_steps,
        learning_rate=arguments.learning_rate,
        num_parts=arguments.num_parts,
        log_every_steps=20,
        hub_repo_id=arguments.hub_repo_id,
        hub_private=arguments.hub_private,
        accelerator="cpu" if arguments.docker else "auto",
        output_root=output_root,
        checkpoint_dir=arguments.checkpoint_dir,
    )
    (run_dir,) = set(root.glob(f"{PIPELINE_NAME}-*")) - before
    artifacts = {name: str(run_dir / relative) for name, relative in ARTIFACTS.items()}
    for name in DATA_ARTIFACTS:
        artifacts[name] = storage.relocate(artifacts[name], output_root)
    metrics = json.loads(storage.read_text(storage.join(artifacts["evaluation"], METRICS_FILE)))
    summary = {
        "run": str(run_dir),
        "seconds": round(time.perf_counter() - started, 1),
        "artifacts": artifacts,
        "metrics": {key: metrics[key] for key in ("loss", "perplexity", "masked_accuracy", "masked_tokens")},
        "fill_mask": metrics["fill_mask"][:1],
    }
    print_summary(summary)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    lines = [f"\nPipeline run finished in {summary['seconds']} s: {summary['run']}", "", "Artifacts:"]
    lines += [f"  {name:<18} {path}" for name, path in summary["artifacts"].items()]
    metrics = summary["metrics"]
    lines += [
        "",
        "Evaluation (validation shards):",
        f"  loss {metrics['loss']:.4f}   perplexity {metrics['perplexity']:.1f}   "
        f"masked-token accuracy {metrics['masked_accuracy']:.2%} on {metrics['masked_tokens']:,} masked tokens",
    ]
    for example in summary["fill_mask"]:
        predictions = ", ".join(f"{p['token']!r} ({p['score']:.3f})" for p in example["predictions"])
        lines += ["", f"Fill-mask: {example['sentence']}", f"  {predictions}"]
    print("\n".join(lines) + "\n", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(RunLocalArguments, run_local, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
