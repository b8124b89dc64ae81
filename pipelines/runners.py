"""What each pipeline component runs in its container: the step's runner builds the step's arguments dataclass
from the component's values (so the step's own checks run), places the output under ``output_root`` when one is
given, calls the step and records what KFP shows (artifact metadata, metrics). The component functions
(``pipelines/kfp_components.py``) import their runner from here."""

import json
import logging
import os
from pathlib import Path
from typing import Any

from components.downstream import DownstreamArguments, downstream
from components.evaluate import EvaluateArguments, evaluate
from components.lib import storage, verdict
from components.lib.errors import InvalidParameter, first_line
from components.lib.results import (
    BASE_MODEL,
    DOWNSTREAM_FILE,
    PROBE_MODELS,
    REPORT_FILE,
    downstream_table,
    probed_models,
)
from components.lib.tpu_catalogue import TPU_TYPES
from components.preflight import PreflightArguments, preflight
from components.push import PushArguments, push
from components.report import ReportArguments, write_report
from components.shards import ShardArguments, corpus_for_split, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer
from components.train import TrainArguments, train
from pipelines.run_folders import run_checkpoint_folder, run_root, tensorboard_folder


def split_source(settings: dict[str, Any], validation_corpus: str) -> dict[str, Any]:
    """The shards settings of a pipeline split: its corpus and hold-out (``corpus_for_split``)."""
    corpus, holdout_fraction, holdout = corpus_for_split(
        settings["split"], settings["corpus"], validation_corpus, settings["holdout_fraction"]
    )
    return {**settings, "corpus": corpus, "holdout_fraction": holdout_fraction, "holdout": holdout}


def run_tokenizer(tokenizer: Any, output_root: str, **settings: Any) -> None:
    tokenizer.uri = storage.relocate(tokenizer.uri, output_root)
    summary = train_tokenizer(TokenizerArguments(output=tokenizer.uri, **settings))
    tokenizer.metadata.update({key: summary[key] for key in ("vocab_size", "fingerprint", "texts_read", "bytes_read")})


def run_shards(tokenizer: Any, shards: Any, output_root: str, validation_corpus: str, **settings: Any) -> None:
    shards.uri = storage.relocate(shards.uri, output_root)
    settings = split_source(settings, validation_corpus)
    manifest = write_shards(ShardArguments(output=shards.uri, tokenizer=tokenizer.uri, **settings))
    shards.metadata.update({key: manifest[key] for key in ("split", "num_records", "bytes_read")})


def run_preflight(
    tokenizer: Any, train_shards: Any, eval_shards: Any, report: Any, output_root: str, **settings: Any
) -> tuple[str, str]:
    """Returns the TPU job's hard limit and how long it may stay queued, as the custom job takes durations ("7200s");
    the limit is "" without a TPU type."""
    report.uri = storage.relocate(report.uri, output_root)
    checked = preflight(
        PreflightArguments(
            tokenizer=tokenizer.uri,
            train_shards=train_shards.uri,
            eval_shards=eval_shards.uri,
            output=report.uri,
            **settings,
        )
    )
    timeout = f"{checked['tpu_job_timeout_seconds']}s" if "tpu_job_timeout_seconds" in checked else ""
    return timeout, f"{round(settings['tpu_max_queued_hours'] * 3600)}s"


def run_train(
    tokenizer: Any,
    train_shards: Any,
    eval_shards: Any,
    model: Any,
    output_root: str,
    pipeline_root: str,
    run_name: str,
    tpu_type: str,
    tpu_provisioning: str,
    **settings: Any,
) -> None:
    model.uri = storage.relocate(model.uri, output_root)
    if not settings["price_per_hour"] and tpu_type:  # the TPU's list price for its provisioning
        tpu = TPU_TYPES[tpu_type]
        settings["price_per_hour"] = tpu.list_price(tpu_provisioning)
        settings["price_source"] = f"{tpu.list_price_source(tpu_provisioning)}, set tpu_price_per_hour"
    if run_name:
        for name, value in (("pipeline_root", pipeline_root), ("run_name", run_name)):
            if "{{" in value:  # a placeholder the backend did not fill: the run's folders would go astray
                raise InvalidParameter(name, value, "was not resolved by the pipeline's backend; set checkpoint_dir")
        # one folder for the pipeline run, whichever attempt of the task or restart of its job trains: a retried
        # task resumes (its model artifact may be a new folder)
        folders = {"checkpoint_dir": settings["checkpoint_dir"], "output_root": output_root}
        settings["checkpoint_dir"] = run_checkpoint_folder(folders, pipeline_root, run_name)
        if not os.environ.get("AIP_TENSORBOARD_LOG_DIR"):  # Vertex AI's, where a TensorBoard is attached
            # beside every other run's: tensorboard --logdir ROOT/tensorboard compares them
            settings["tensorboard_dir"] = tensorboard_folder(run_root(folders, pipeline_root), run_name)
    summary = train(
        TrainArguments(
            tokenizer=tokenizer.uri,
            train_shards=train_shards.uri,
            eval_shards=eval_shards.uri,
            output=model.uri,
            **settings,
        ),
        run=run_name,
    )
    keys = ("total_steps", "samples", "tokens", "first_loss", "last_loss", "accelerator")
    model.metadata.update({key: summary[key] for key in keys})
    # in the TPU job: the launcher tells a finished training from a job that ended without a word
    resumed = summary["resumed_from_step"]
    resumed_from = f", resumed from the checkpoint of step {resumed}" if resumed else ""
    verdict.record(0, f"trained to step {summary['total_steps']}{resumed_from}", summary["total_steps"], resumed)


def run_evaluate(
    model: Any,
    shards: Any,
    train_shards: Any,
    evaluation: Any,
    metrics: Any,
    report: Any,
    output_root: str,
    **settings: Any,
) -> None:
    evaluation.uri = storage.relocate(evaluation.uri, output_root)
    results = evaluate(
        EvaluateArguments(
            model=model.uri, shards=shards.uri, train_shards=train_shards.uri, output=evaluation.uri, **settings
        )
    )
    for name in ("loss", "perplexity", "unigram_perplexity", "masked_accuracy", "masked_tokens"):
        if results[name] is not None:
            metrics.log_metric(name, results[name])
    Path(report.path).write_text(storage.read_text(storage.join(evaluation.uri, REPORT_FILE)))


def run_downstream(
    model: Any, downstream_results: Any, metrics: Any, report: Any, output_root: str, **settings: Any
) -> None:
    """The probe on the trained model. Its failure fails no later step: the model is pushed whatever the probe does,
    with the failure in the results (the report and the model card say it), its traceback in this step's log."""
    downstream_results.uri = storage.relocate(downstream_results.uri, output_root)
    arguments = DownstreamArguments(model=model.uri, output=downstream_results.uri, **settings)
    try:
        results = downstream(arguments)
    except Exception as error:  # a fine-tuning that diverged, ran out of memory, a dataset gone from the Hub ...
        logging.getLogger("tpu_mlm.downstream").exception("the downstream probe failed; the pipeline goes on")
        failed = {"failed": f"{type(error).__name__}: {first_line(error)}"}
        storage.write_text_atomic(storage.join(arguments.output, DOWNSTREAM_FILE), json.dumps(failed))
        metrics.log_metric("downstream_failed", 1)
        Path(report.path).write_text("\n".join(downstream_table(failed)) + "\n")
        return
    average = results["average"]
    downstream_results.metadata["gain"] = average[PROBE_MODELS[0]] - average[PROBE_MODELS[1]]
    if BASE_MODEL in average:
        downstream_results.metadata["adaptation_gain"] = average[PROBE_MODELS[0]] - average[BASE_MODEL]
    for result in results["tasks"]:
        for model_name in probed_models(result):
            metrics.log_metric(f"{result['task']} {result['metric']} ({model_name})", result[model_name]["score"])
        metrics.log_metric(f"{result['task']} gain", result["gain"])
        if "adaptation_gain" in result:
            metrics.log_metric(f"{result['task']} adaptation gain", result["adaptation_gain"])
    Path(report.path).write_text(storage.read_text(storage.join(arguments.output, REPORT_FILE)))


def run_push(model: Any, evaluation: Any, downstream_results: Any, **settings: Any) -> str:
    return push(
        PushArguments(model=model.uri, evaluation=evaluation.uri, downstream=downstream_results.uri, **settings)
    )["commit_url"]


def run_report(model: Any, evaluation: Any, downstream_results: Any, report: Any, **settings: Any) -> None:
    write_report(
        ReportArguments(
            model=model.uri,
            evaluation=evaluation.uri,
            downstream=downstream_results.uri,
            output=report.path,
            **settings,
        )
    )
