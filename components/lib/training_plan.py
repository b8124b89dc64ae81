"""The training's settings and plan: what is checked before an accelerator is used, by the train step and by
preflight alike (the batch arithmetic, the data, the model config, the checkpoints' identity)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.base_model import (
    BaseModelChoice,
    base_model_token,
    check_base_model,
    check_init_from,
    check_positions,
    model_name,
    pinned_by_tokenizer,
)
from components.lib.devices import ACCELERATORS, check_accelerator
from components.lib.errors import InvalidParameter
from components.lib.hub import check_repo_id
from components.lib.modeling import PRESETS, model_config, pretraining_config
from components.lib.recipe import KNOBS, RECIPES, Recipe, apply_recipe
from components.lib.run_shape import RunShape, settings_shape
from components.lib.shard_set import read_manifest, verify_files
from components.lib.tokenization import SPECIAL_TOKEN_ROLES, SPECIAL_TOKENS, load_tokenizer
from components.lib.tpu_catalogue import BatchSettings, TpuType

# Written beside the checkpoints: what they are checkpoints of, so that resuming with another model is refused.
CHECKPOINT_IDENTITY_FILE = "checkpoint_identity.json"
NOT_ARCHITECTURE = ("transformers_version", "_name_or_path", "architectures")  # config keys that are bookkeeping
DATA_SETTLED = ("vocab_size",)  # the architecture's keys that the tokenizer step settles, not the parameters
XLA_CHOICES = ("auto", "on", "off")
DIVERGENCE_CHOICES = ("stop", "rewind")


@dataclass(kw_only=True)
class TrainingInputs(BaseModelChoice):
    """The training's data and model."""

    tokenizer: str = field(metadata={"help": "Tokenizer folder (local or gs://)."})
    train_shards: str = field(metadata={"help": "Training shard folder with manifest.json."})
    eval_shards: str = field(default="", metadata={"help": "Validation shards: loss logged at each checkpoint."})
    model_config: str = field(
        default="roberta-base",
        metadata={
            "help": f"Preset {sorted(PRESETS)}, a config.json path/URI, or a Hub model name (a config only: its "
            "weights are init_from's); ignored with init_from, whose config the model keeps (but by submit --dry_run "
            "and the smoke test, which size the run by it: give the base's)."
        },
    )


@dataclass(kw_only=True)
class TrainingData(BatchSettings, TrainingInputs):
    """The training's data, model and batch: the first of its settings (they come first in ``--help`` and in the
    pipeline's parameters, before the recipe's knobs)."""

    num_epochs: int = field(default=1, metadata={"help": "Passes over the training shards."})
    max_steps: int = field(default=0, metadata={"help": "Total optimizer steps; overrides num_epochs when > 0."})


@dataclass(kw_only=True)
class TrainingSettings(Recipe, TrainingData):
    """The training: its data, model, optimization (the recipe and its knobs, ``Recipe``), accelerator and
    checkpoints. The train step runs with these, preflight checks them for a TPU, and the pipeline's training
    parameters are these fields."""

    bf16: bool = field(default=False, metadata={"help": "Mixed bfloat16 precision (TPUs, recent GPUs)."})
    steps_per_execution: int = field(default=50, metadata={"help": "Steps run per call into the graph."})
    xla: str = field(
        default="auto",
        metadata={
            "help": "XLA-compile the replica step on GPU/CPU: on, off, auto (off). Never nested on a TPU, which "
            "compiles the whole step anyway.",
            "choices": XLA_CHOICES,
        },
    )
    shuffle_buffer: int = field(default=10_000, metadata={"help": "Samples in the shuffle buffer."})
    seed: int = field(default=42, metadata={"help": "Seed of initialization, shuffling and masking."})
    checkpoint_every_steps: int = field(default=1_000, metadata={"help": "Steps between checkpoints."})
    log_every_steps: int = field(default=100, metadata={"help": "Steps between log lines and TensorBoard points."})
    eval_batches: int = field(default=20, metadata={"help": "Validation batches at each checkpoint."})
    on_divergence: str = field(
        default="stop",
        metadata={
            "help": "When the loss or the gradient norm is not finite (checked at every call into the graph, at "
            "least every log point): stop (exit 4, nothing written from those weights), or rewind to the last "
            "checkpoint, skip the batches that followed it and go on, lowering nothing, at most max_rewinds times.",
            "choices": DIVERGENCE_CHOICES,
        },
    )
    max_rewinds: int = field(
        default=3, metadata={"help": "With on_divergence rewind: the most rewinds in a run before it stops."}
    )
    rehearse_restart: bool = field(
        default=False,
        metadata={
            "help": "Once, at the first checkpoint of a training that starts from nothing, exit as a preempted job "
            "does, so that Vertex AI's restart resumes from that checkpoint: what a first run proves before a long "
            "run meets its first preemption. Only inside the TPU job the pipeline's launcher created (where Vertex "
            "AI restarts the worker); nothing elsewhere."
        },
    )
    accelerator: str = field(
        default="auto",
        metadata={
            "help": "auto, tpu, gpu or cpu; tpu and gpu fail when absent rather than train on the host's CPU.",
            "choices": ACCELERATORS,
        },
    )
    replicas: int = field(
        default=0,
        metadata={
            "help": "Replicas: 0 for every device of the accelerator. A TPU or the GPUs found must have exactly "
            "this many; on the CPU, N > 1 splits it into N logical devices (rehearse a v3-8 with 8)."
        },
    )
    tpu: str = field(default="local", metadata={"help": "TPU name for TPUClusterResolver ('local' on TPU VMs)."})
    peak_tflops: float = field(
        default=0.0, metadata={"help": "Peak TFLOP/s of one replica, for MFU where it is not known (0: look it up)."}
    )
    price_per_hour: float = field(
        default=0.0,
        metadata={
            "help": "Price of the accelerator per hour (Vertex AI pricing, your region): the log lines show the "
            "cost so far and projected."
        },
    )
    hub_repo_id: str = field(
        default="", metadata={"help": "Push each checkpoint to this Hub repository (HF_TOKEN); off when empty."}
    )
    hub_private: bool = field(
        default=True, metadata={"help": "Create the checkpoint repository as private (--no_hub_private: public)."}
    )
    checkpoint_dir: str = field(
        default="",
        metadata={
            "help": "A fixed folder for the checkpoints: a rerun resumes from them instead of training again. "
            "Default: $AIP_CHECKPOINT_DIR, else the model folder's checkpoints/."
        },
    )

    def __post_init__(self) -> None:
        for parameter in ("tokenizer", "train_shards"):
            storage.check_uri(parameter, getattr(self, parameter))
        check_init_from(self.init_from)
        if self.checkpoint_dir:
            storage.check_uri("checkpoint_dir", self.checkpoint_dir)
        if self.eval_shards:
            storage.check_uri("eval_shards", self.eval_shards)
        self.check_batch()
        for parameter in (
            "num_epochs",
            "steps_per_execution",
            "shuffle_buffer",
            "checkpoint_every_steps",
            "log_every_steps",
            "eval_batches",
        ):
            if getattr(self, parameter) < 1:
                raise InvalidParameter(parameter, getattr(self, parameter), "must be a positive whole number")
        if self.max_steps < 0:
            raise InvalidParameter("max_steps", self.max_steps, "must be 0 (use num_epochs) or positive")
        apply_recipe(self)
        if self.price_per_hour < 0:
            raise InvalidParameter("price_per_hour", self.price_per_hour, "must be 0 (unknown) or positive")
        check_accelerator(self.accelerator, self.replicas)
        if self.xla not in XLA_CHOICES:
            raise InvalidParameter("xla", self.xla, f"must be one of {XLA_CHOICES}")
        if self.on_divergence not in DIVERGENCE_CHOICES:
            raise InvalidParameter("on_divergence", self.on_divergence, f"must be one of {DIVERGENCE_CHOICES}")
        if self.max_rewinds < 0:
            raise InvalidParameter("max_rewinds", self.max_rewinds, "must be 0 or a positive whole number")
        if self.hub_repo_id:
            check_repo_id("hub_repo_id", self.hub_repo_id)


@dataclass
class TrainingPlan:
    """What the checks before training settled: data, model config and the run's shape."""

    manifest: dict[str, Any]
    eval_manifest: dict[str, Any] | None
    config: Any
    tokenizer: Any
    shape: RunShape
    checkpoint_identity: dict[str, Any]
    init_from: str = ""  # the base model, at the commit the tokenizer step pinned: what the weights are loaded from

    @property
    def total_steps(self) -> int:
        return self.shape.steps

    @property
    def global_batch_size(self) -> int:
        return self.shape.global_batch_size

    @property
    def accumulation(self) -> int:
        return self.shape.accumulation

    @property
    def micro_batch_size(self) -> int:
        return self.shape.micro_batch_size


def plan_training(
    arguments: TrainingSettings,
    num_replicas: int,
    tpu: TpuType | None = None,
    input_pipelines: int = 1,
    on_tpu: bool = False,
    batch_settled: bool = True,
) -> TrainingPlan:
    """Every check that can fail before the accelerator is used: tokenizer, shards, config, batch arithmetic.
    ``input_pipelines``: the hosts that each read a share of the shard files (``tpu``'s, when given). The batch's
    zeros are made the accelerator's default here: a TPU's with ``tpu`` or ``on_tpu``, else a device's.
    ``batch_settled`` False: the accelerator the training will find is not known here (preflight without a TPU
    type), so its global batch is not checked against the checkpoints'; the train step checks it."""
    input_pipelines = tpu.hosts if tpu is not None else input_pipelines
    arguments.resolve_batch(num_replicas if tpu is not None or on_tpu else None)
    tokenizer, tokenizer_fingerprint = load_tokenizer(arguments.tokenizer)
    manifest = read_manifest(arguments.train_shards, "train_shards")
    # the saved model's tokenizer tells its users (sentence-transformers' max_seq_length, pipelines' truncation) the
    # length it was trained on, which the tokenizer step could not know
    tokenizer.model_max_length = manifest["max_length"]
    eval_manifest = read_manifest(arguments.eval_shards, "eval_shards") if arguments.eval_shards else None
    for parameter, shards in (("train_shards", manifest), ("eval_shards", eval_manifest)):
        if shards is None:
            continue
        verify_files(getattr(arguments, parameter), shards, parameter)
        if parameter == "train_shards":  # validation shards of fewer files than hosts are read by record
            check_shares(getattr(arguments, parameter), shards, parameter, input_pipelines)
        if shards["tokenizer_fingerprint"] != tokenizer_fingerprint:
            raise InvalidParameter(
                parameter,
                getattr(arguments, parameter),
                f"were made with another tokenizer ({shards['tokenizer_fingerprint']}) than --tokenizer "
                f"({tokenizer_fingerprint})",
            )
        if shards["max_length"] != manifest["max_length"]:
            raise InvalidParameter(
                parameter,
                getattr(arguments, parameter),
                f"have max_length {shards['max_length']}, the training shards {manifest['max_length']}",
            )
    base = pinned_by_tokenizer(arguments.init_from, arguments.tokenizer)  # the commit the tokenizer step checked
    if base:
        # preflight names the Hub token's secret (a step on Vertex AI); the train step reads HF_TOKEN where set
        token = base_model_token(base, getattr(arguments, "hf_token_secret", ""))
        config = base_model_config(base, arguments.tokenizer, tokenizer, manifest["max_length"], token)
    else:
        config = model_config(arguments.model_config, manifest)
    pretraining_config(config, arguments.dropout)  # a dropout the config cannot take is refused here
    shape = settings_shape(
        vars(arguments),
        replicas=num_replicas,
        tpu=tpu,
        max_length=manifest["max_length"],
        samples=manifest["num_records"],
        config=config,
    )
    if arguments.rehearse_restart and arguments.checkpoint_every_steps >= shape.steps:
        raise InvalidParameter(
            "rehearse_restart",
            True,
            f"needs a checkpoint before the end to restart from: checkpoint_every_steps "
            f"({arguments.checkpoint_every_steps}) must be below the training's {shape.steps} steps",
        )
    if eval_manifest is not None and shape.micro_batch_size > eval_manifest["num_records"]:
        raise InvalidParameter(
            "eval_shards",
            arguments.eval_shards,
            f"hold {eval_manifest['num_records']} samples, fewer than one batch of {shape.micro_batch_size}",
        )
    knobs = {knob: getattr(arguments, knob) for knob in KNOBS}
    identity = checkpoint_identity(config, tokenizer_fingerprint, {"recipe": arguments.recipe, **knobs})
    if base:  # the same architecture from other weights is another model's training
        identity["init_from"] = base
    # a resume at another global batch would change the steps and the schedule half-way (the micro-batches making it
    # may change, unless a batch warm-up's stages follow them)
    if batch_settled:
        identity["global_batch_size"] = shape.global_batch_size
    if len(shape.batch_stages) > 1:  # where they are follows the steps and micro-batches, which a resume may change
        identity["batch_stages"] = [list(stage) for stage in shape.batch_stages]
    if arguments.checkpoint_dir:  # unset: the train step's default folder, under its fresh output
        check_checkpoints_match(arguments.checkpoint_dir, identity)
    return TrainingPlan(manifest, eval_manifest, config, tokenizer, shape, identity, base)


def base_model_config(init_from: str, tokenizer_uri: str, tokenizer: Any, max_length: int, token: str = "") -> Any:
    """The config of the base model ``init_from``, checked against the run's tokenizer (the base's own, which the
    shards were made with) and sample length."""
    base = check_base_model(init_from, token=token)
    if base.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise InvalidParameter(
            "tokenizer",
            tokenizer_uri,
            f"is not {init_from}'s tokenizer: make the shards with the base model's own (the tokenizer step saves it "
            "when given init_from)",
        )
    check_positions(init_from, base.config, max_length)
    return base.config


def check_shares(uri: str, manifest: dict[str, Any], parameter: str, input_pipelines: int) -> None:
    """Refuses a shard set of fewer files than the hosts that each read a share of them (input_pipeline.input_share)."""
    files = len(manifest["files"])
    if files < input_pipelines:
        most = max(1, manifest["num_records"] // input_pipelines)
        raise InvalidParameter(
            parameter,
            uri,
            f"hold {files} shard file(s), fewer than the {input_pipelines} hosts that each read a share of them; "
            f"write the shards again with --records_per_shard {most} or fewer (or with more --num_parts)",
        )


def checkpoint_identity(config: Any, tokenizer_fingerprint: str, recipe: dict[str, Any]) -> dict[str, Any]:
    """What checkpoints must share to be resumed: the model's architecture, the tokenizer and the recipe's knobs
    (a resume under other knobs would change the schedule, the optimizer or the masking half-way)."""
    architecture = {k: v for k, v in config.to_dict().items() if k not in NOT_ARCHITECTURE}
    identity = {"model_config": architecture, "tokenizer_fingerprint": tokenizer_fingerprint, "recipe": recipe}
    return json.loads(json.dumps(identity))


def identity_before_data(model_config_name: str, vocab_size: int, max_length: int, recipe: Recipe) -> dict[str, Any]:
    """The checkpoint identity as far as a run's parameters settle it before its data exists (``submit --resume``'s):
    the architecture of ``model_config_name`` at the run's vocabulary and sample length, with the ids the tokenizer
    step gives the special tokens (their place in ``SPECIAL_TOKENS``), and the recipe's knobs. It has no tokenizer
    fingerprint, which tells ``check_checkpoints_match`` to leave what only the data settles."""
    special = {role: SPECIAL_TOKENS.index(token) for role, token in SPECIAL_TOKEN_ROLES.items()}
    config = model_config(
        model_config_name, {"vocab_size": vocab_size, "max_length": max_length, "special_tokens": special}
    )
    knobs = {knob: getattr(recipe, knob) for knob in KNOBS}
    identity = checkpoint_identity(config, "", {"recipe": recipe.recipe, **knobs})
    del identity["tokenizer_fingerprint"]
    return identity


def check_checkpoints_match(checkpoint_dir: str, identity: dict[str, Any]) -> None:
    """Refuses a checkpoint folder that holds checkpoints of another model, tokenizer or recipe (a stable
    ``--checkpoint_dir`` reused by mistake, a resume with other parameters) before any accelerator time is spent.
    An ``identity_before_data`` (submit's) is checked for what the parameters settle: what only the data steps do
    (the tokenizer, the vocabulary's size, which a small corpus may leave below the one asked for, and a batch
    warm-up's stages, which follow the data's size) is left to preflight and the train step, and so is a global
    batch the identity does not settle (submit's and a preflight's without a TPU type)."""
    uri = storage.join(checkpoint_dir, CHECKPOINT_IDENTITY_FILE)
    if not storage.exists(uri):
        return
    existing = json.loads(storage.read_text(uri))
    before_data = "tokenizer_fingerprint" not in identity
    settled = [key for key in identity["model_config"] if not (before_data and key in DATA_SETTLED)]
    differing = sorted(key for key in settled if existing["model_config"].get(key) != identity["model_config"][key])
    trained_base, base = existing.get("init_from", ""), identity.get("init_from", "")
    if before_data:  # submit's: the tokenizer step pins a Hub model's revision later, its name is what is settled
        trained_base, base = model_name(trained_base), model_name(base)
    if trained_base != base:
        differing.append("init_from")
    if not before_data and existing["tokenizer_fingerprint"] != identity["tokenizer_fingerprint"]:
        differing.append("tokenizer")
    if differing:
        raise InvalidParameter(
            "checkpoint_dir",
            checkpoint_dir,
            f"holds checkpoints of another model ({', '.join(differing)} differ); resume with the same model "
            "config and tokenizer, or use an empty folder",
        )
    trained = existing.get("recipe", identity["recipe"])  # checkpoints from before recipes were recorded: unknown
    if trained.get("recipe") in RECIPES:  # a knob newer than the checkpoints: they trained at their recipe's value
        trained = {
            **trained,
            **{knob: value for knob, value in RECIPES[trained["recipe"]].items() if knob not in trained},
        }
    changed = {knob: value for knob, value in trained.items() if identity["recipe"].get(knob) != value}
    if changed:
        flags = " ".join(f"--{knob} {value}" for knob, value in changed.items())
        raise InvalidParameter(
            "checkpoint_dir",
            checkpoint_dir,
            f"holds checkpoints trained with other recipe knobs; resume them with {flags}, or use an empty folder",
        )
    trained_batch = existing.get("global_batch_size")  # unknown in checkpoints from before it was recorded
    if trained_batch and identity.get("global_batch_size", trained_batch) != trained_batch:
        raise InvalidParameter(
            "checkpoint_dir",
            checkpoint_dir,
            f"holds checkpoints trained at a global batch of {trained_batch:,}, and these settings make "
            f"{identity['global_batch_size']:,}: resume with a per_replica_batch_size x replicas x "
            "gradient_accumulation_steps that makes it, or use an empty folder",
        )
    if not before_data and existing.get("batch_stages") != identity.get("batch_stages"):
        raise InvalidParameter(
            "checkpoint_dir",
            checkpoint_dir,
            f"holds checkpoints of batch warm-up stages (first step, micro-batches) {existing.get('batch_stages')}, "
            f"and these settings make {identity.get('batch_stages')}: resume with the max_steps and micro-batches "
            "that made them, or use an empty folder",
        )
