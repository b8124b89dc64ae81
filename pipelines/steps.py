"""The pipeline's KFP components: thin wrappers that build a job's arguments and call its module.

Each step is a lightweight Python component whose body imports the ``components`` package (installed in the
project's image) and calls the job's function with artifact URIs: a local path under ``kfp.local``, a
``gs://`` URI on Vertex AI, which the jobs read and write through ``tf.io.gfile``. With ``output_root`` set, a
step stores its data outputs there instead and hands on that URI (``kfp.local`` keeps its own bookkeeping in a
local folder, the data can still live in a bucket). ``make_steps`` binds the steps to the images chosen at
compile time.
"""

from dataclasses import dataclass
from typing import Any

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Model, Output


def tokenizer_step(
    corpus: str,
    vocab_size: int,
    text_column: str,
    limit: int,
    lowercase: bool,
    sample_bytes: int,
    hf_token_secret: str,
    output_root: str,
    tokenizer: Output[Artifact],
):
    from components.storage import relocate
    from components.tokenizer import TokenizerArguments, train_tokenizer

    tokenizer.uri = relocate(tokenizer.uri, output_root)

    summary = train_tokenizer(
        TokenizerArguments(
            output=tokenizer.uri,
            corpus=corpus,
            vocab_size=vocab_size,
            text_column=text_column,
            limit=limit or None,
            lowercase=lowercase,
            sample_bytes=sample_bytes,
            hf_token_secret=hf_token_secret,
        )
    )
    tokenizer.metadata.update({key: summary[key] for key in ("vocab_size", "fingerprint", "texts_read", "bytes_read")})


def part_indices(num_parts: int) -> list:
    from components.errors import InvalidParameter

    if num_parts < 1:
        raise InvalidParameter("num_parts", num_parts, "must be a positive whole number")
    return list(range(num_parts))


def shards_step(
    split: str,
    corpus: str,
    validation_corpus: str,
    holdout_fraction: float,
    text_column: str,
    limit: int,
    max_length: int,
    records_per_shard: int,
    num_parts: int,
    part: int,
    hf_token_secret: str,
    output_root: str,
    tokenizer: Input[Artifact],
    shards: Output[Dataset],
):
    from components.shards import ShardArguments, corpus_for_split, write_shards
    from components.storage import relocate

    shards.uri = relocate(shards.uri, output_root)

    source, fraction, holdout = corpus_for_split(split, corpus, validation_corpus, holdout_fraction)
    manifest = write_shards(
        ShardArguments(
            output=shards.uri,
            tokenizer=tokenizer.uri,
            corpus=source,
            split=split,
            max_length=max_length,
            records_per_shard=records_per_shard,
            num_parts=num_parts,
            part=part,
            holdout_fraction=fraction,
            holdout=holdout,
            text_column=text_column,
            limit=limit or None,
            hf_token_secret=hf_token_secret,
        )
    )
    shards.metadata.update(
        {"split": split, "part": part, "num_records": manifest["num_records"], "bytes_read": manifest["bytes_read"]}
    )


def merge_shards_step(output_root: str, parts: Input[list[Dataset]], shards: Output[Dataset]):
    from components.shards import gather_parts
    from components.storage import relocate

    shards.uri = relocate(shards.uri, output_root)

    manifest = gather_parts([part.uri for part in parts], shards.uri)
    shards.metadata.update({"split": manifest["split"], "num_records": manifest["num_records"]})


def preflight_step(
    tpu_type: str,
    hub_repo_id: str,
    hf_token_secret: str,
    model_config: str,
    per_replica_batch_size: int,
    num_epochs: int,
    max_steps: int,
    learning_rate: float,
    warmup_fraction: float,
    weight_decay: float,
    mlm_probability: float,
    bf16: bool,
    steps_per_execution: int,
    shuffle_buffer: int,
    seed: int,
    checkpoint_every_steps: int,
    log_every_steps: int,
    accelerator: str,
    replicas: int,
    price_per_hour: float,
    checkpoint_dir: str,
    output_root: str,
    tokenizer: Input[Artifact],
    train_shards: Input[Dataset],
    eval_shards: Input[Dataset],
    report: Output[Artifact],
):
    from components.preflight import PreflightArguments, preflight
    from components.storage import relocate

    report.uri = relocate(report.uri, output_root)

    preflight(
        PreflightArguments(
            tokenizer=tokenizer.uri,
            train_shards=train_shards.uri,
            eval_shards=eval_shards.uri,
            output=report.uri,
            tpu_type=tpu_type,
            hub_repo_id=hub_repo_id,
            hf_token_secret=hf_token_secret,
            model_config=model_config,
            per_replica_batch_size=per_replica_batch_size,
            num_epochs=num_epochs,
            max_steps=max_steps,
            learning_rate=learning_rate,
            warmup_fraction=warmup_fraction,
            weight_decay=weight_decay,
            mlm_probability=mlm_probability,
            bf16=bf16,
            steps_per_execution=steps_per_execution,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            checkpoint_every_steps=checkpoint_every_steps,
            log_every_steps=log_every_steps,
            accelerator=accelerator,
            replicas=replicas,
            price_per_hour=price_per_hour,
            checkpoint_dir=checkpoint_dir,
        )
    )


def train_step(
    model_config: str,
    per_replica_batch_size: int,
    num_epochs: int,
    max_steps: int,
    learning_rate: float,
    warmup_fraction: float,
    weight_decay: float,
    mlm_probability: float,
    bf16: bool,
    steps_per_execution: int,
    shuffle_buffer: int,
    seed: int,
    checkpoint_every_steps: int,
    log_every_steps: int,
    accelerator: str,
    replicas: int,
    price_per_hour: float,
    peak_tflops: float,
    checkpoint_dir: str,
    output_root: str,
    tokenizer: Input[Artifact],
    train_shards: Input[Dataset],
    eval_shards: Input[Dataset],
    model: Output[Model],
):
    from components.storage import relocate
    from components.train import TrainArguments, train

    model.uri = relocate(model.uri, output_root)

    summary = train(
        TrainArguments(
            tokenizer=tokenizer.uri,
            train_shards=train_shards.uri,
            eval_shards=eval_shards.uri,
            output=model.uri,
            model_config=model_config,
            per_replica_batch_size=per_replica_batch_size,
            num_epochs=num_epochs,
            max_steps=max_steps,
            learning_rate=learning_rate,
            warmup_fraction=warmup_fraction,
            weight_decay=weight_decay,
            mlm_probability=mlm_probability,
            bf16=bf16,
            steps_per_execution=steps_per_execution,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            checkpoint_every_steps=checkpoint_every_steps,
            log_every_steps=log_every_steps,
            accelerator=accelerator,
            replicas=replicas,
            price_per_hour=price_per_hour,
            peak_tflops=peak_tflops or None,
            checkpoint_dir=checkpoint_dir or model.uri + "/checkpoints",
            tensorboard_dir=model.uri + "/logs",
        )
    )
    model.metadata.update(
        {key: summary[key] for key in ("total_steps", "samples", "tokens", "first_loss", "last_loss", "accelerator")}
    )


def evaluate_step(
    mlm_probability: float,
    seed: int,
    batch_size: int,
    output_root: str,
    model: Input[Model],
    shards: Input[Dataset],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
):
    from pathlib import Path

    from components import storage
    from components.evaluate import REPORT_FILE, EvaluateArguments, evaluate

    evaluation.uri = storage.relocate(evaluation.uri, output_root)

    results = evaluate(
        EvaluateArguments(
            model=model.uri,
            shards=shards.uri,
            output=evaluation.uri,
            batch_size=batch_size,
            mlm_probability=mlm_probability,
            seed=seed,
        )
    )
    for name in ("loss", "perplexity", "masked_accuracy", "masked_tokens"):
        metrics.log_metric(name, results[name])
    Path(report.path).write_text(storage.read_text(storage.join(evaluation.uri, REPORT_FILE)))


def push_step(
    repo_id: str, private: bool, hf_token_secret: str, model: Input[Model], evaluation: Input[Artifact]
) -> str:
    from components.push import PushArguments, push

    result = push(
        PushArguments(
            model=model.uri,
            evaluation=evaluation.uri,
            repo_id=repo_id,
            private=private,
            hf_token_secret=hf_token_secret,
        )
    )
    return result["commit_url"]


def report_step(model: Input[Model], evaluation: Input[Artifact], report: Output[HTML]):
    from components.report import ReportArguments, write_report

    write_report(ReportArguments(model=model.uri, evaluation=evaluation.uri, output=report.path))


@dataclass
class Steps:
    tokenizer: Any
    part_indices: Any
    shards: Any
    merge_shards: Any
    preflight: Any
    train: Any
    evaluate: Any
    push: Any
    report: Any


def make_steps(cpu_image: str, train_image: str) -> Steps:
    """The components, bound to the images (the project's package and kfp are installed in both)."""

    def component(function: Any, image: str) -> Any:
        return dsl.component(function, base_image=image, install_kfp_package=False)

    return Steps(
        tokenizer=component(tokenizer_step, cpu_image),
        part_indices=component(part_indices, cpu_image),
        shards=component(shards_step, cpu_image),
        merge_shards=component(merge_shards_step, cpu_image),
        preflight=component(preflight_step, cpu_image),
        train=component(train_step, train_image),
        evaluate=component(evaluate_step, cpu_image),
        push=component(push_step, cpu_image),
        report=component(report_step, cpu_image),
    )
