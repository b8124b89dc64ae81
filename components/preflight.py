"""Check, in minutes on a CPU, what would otherwise fail hours into a TPU run.

Before the train step takes a TPU: tokenizer, shards and model config agree (the train component's own
checks, with the TPU's replica count for the batch arithmetic), the pipeline's storage is writable, and,
when a push is asked for, the Hub token is there and may write. Writes ``preflight.json`` with what it
checked.

    python -m components.preflight --tokenizer T --train_shards S --eval_shards V --replicas 8 --output OUT
"""

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components import storage
from components.cli import run_job
from components.errors import InvalidParameter
from components.hub import check_repo_id, hub_token
from components.train import TrainArguments, plan_training

WRITE_ROLES = ("write", "admin", "fineGrained")


@dataclass
class PreflightArguments:
    tokenizer: str = field(metadata={"help": "Tokenizer folder."})
    train_shards: str = field(metadata={"help": "Training shard folder."})
    output: str = field(metadata={"help": "Folder for preflight.json; also the storage checked for writing."})
    eval_shards: str = field(default="", metadata={"help": "Validation shard folder."})
    model_config: str = field(default="roberta-base", metadata={"help": "As for components.train."})
    per_replica_batch_size: int = field(default=256, metadata={"help": "As for components.train."})
    num_epochs: int = field(default=1, metadata={"help": "As for components.train."})
    max_steps: int = field(default=0, metadata={"help": "As for components.train."})
    replicas: int = field(default=1, metadata={"help": "Replicas of the training accelerator (a v3-8 has 8)."})
    hub_repo_id: str = field(default="", metadata={"help": "Repository the pipeline will push to, if any."})
    hf_token_secret: str = field(default="", metadata={"help": "Secret Manager secret holding the Hub token."})
    checkpoint_dir: str = field(default="", metadata={"help": "The training's checkpoint folder, if a fixed one."})

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise InvalidParameter("replicas", self.replicas, "must be a positive whole number")
        if self.hub_repo_id:
            check_repo_id("hub_repo_id", self.hub_repo_id)


def check_hub_write(repo_id: str, token: str) -> str:
    """Who the token belongs to, after checking it is valid and may write."""
    from huggingface_hub import HfApi
    from requests import HTTPError

    try:
        identity = HfApi(token=token).whoami()
    except HTTPError as error:  # huggingface_hub raises its subclasses, or HTTPError itself for a bad token
        raise InvalidParameter("hub_repo_id", repo_id, f"the Hub refused the token: {error}") from error
    role = identity.get("auth", {}).get("accessToken", {}).get("role")
    if role not in WRITE_ROLES:
        raise InvalidParameter("hub_repo_id", repo_id, f"the Hub token may not write (its role is {role!r})")
    return identity.get("name", "")


def check_writable(folder: str) -> None:
    probe = storage.join(folder, ".write-probe")
    try:
        storage.write_text_atomic(probe, "ok")
        storage.remove(probe)
    except Exception as error:  # every storage backend raises its own type
        raise InvalidParameter("output", folder, f"is not writable: {error}") from error


def preflight(arguments: PreflightArguments) -> dict[str, Any]:
    started = time.perf_counter()
    train_arguments = TrainArguments(
        tokenizer=arguments.tokenizer,
        train_shards=arguments.train_shards,
        eval_shards=arguments.eval_shards,
        output=arguments.output,
        model_config=arguments.model_config,
        per_replica_batch_size=arguments.per_replica_batch_size,
        num_epochs=arguments.num_epochs,
        max_steps=arguments.max_steps,
        checkpoint_dir=arguments.checkpoint_dir,
    )
    plan = plan_training(train_arguments, arguments.replicas)
    report: dict[str, Any] = {
        "total_steps": plan.total_steps,
        "global_batch_size": plan.global_batch_size,
        "train_samples": plan.manifest["num_records"],
        "vocab_size": plan.config.vocab_size,
        "max_length": plan.manifest["max_length"],
    }
    if arguments.hub_repo_id:
        token = hub_token("hub_repo_id", arguments.hub_repo_id, arguments.hf_token_secret)
        report["hub_user"] = check_hub_write(arguments.hub_repo_id, token)
    check_writable(arguments.output)  # last: the only check that writes
    report["seconds"] = round(time.perf_counter() - started, 3)
    storage.write_text_atomic(storage.join(arguments.output, "preflight.json"), json.dumps(report, indent=2) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(PreflightArguments, preflight, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
