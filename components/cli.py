"""The project's command line: ``tpu-mlm JOB [ARGS]`` runs the job's module, as ``python -m MODULE [ARGS]``.

Every job module keeps its arguments in a dataclass and calls :func:`run_job`, which parses them, sets up
logging, runs the job and prints its summary as JSON. Bad input exits with status 2 and one line naming
the parameter.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from components.errors import InvalidParameter, ServiceFailed

# job name -> (module, what it does)
JOBS = {
    "run-local": ("pipelines.run_local", "Run the whole pipeline on this machine under kfp.local."),
    "compile": ("pipelines.compile", "Compile the pipeline for Vertex AI (or kfp.local) to YAML."),
    "submit": ("pipelines.submit", "Submit a compiled pipeline to Vertex AI Pipelines (or --dry_run)."),
    "tokenizer": ("components.tokenizer", "Train a Unigram tokenizer on a corpus."),
    "shards": ("components.shards", "Tokenize a corpus into fixed-length TFRecord shards."),
    "merge-shards": ("components.merge_shards", "Merge the part manifests of a sharded run into manifest.json."),
    "estimate": ("components.estimate", "Time, cost and memory fit of a TPU run, before paying for it."),
    "preflight": ("components.preflight", "Check data, config, storage and Hub access before a TPU run."),
    "train": ("components.train", "Pre-train a masked language model on shards (TPU, GPU or CPU)."),
    "evaluate": ("components.evaluate", "Loss, perplexity, masked accuracy and fill-mask examples."),
    "report": ("components.report", "The run report: metrics, loss curve, throughput, fill-mask examples (HTML)."),
    "push": ("components.push", "Push model, tokenizer and model card to the Hugging Face Hub."),
}

Arguments = TypeVar("Arguments")
log = logging.getLogger("tpu_mlm")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # tf.distribute logs each all-reduce it sets up


def parse_arguments(arguments_class: type[Arguments], argv: Sequence[str] | None, description: str) -> Arguments:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(arguments_class, description=description)
    (arguments,) = parser.parse_args_into_dataclasses(args=argv)
    return arguments


def run_job(
    arguments_class: type[Arguments],
    job: Callable[[Arguments], dict[str, Any]],
    argv: Sequence[str] | None = None,
    description: str | None = None,
) -> int:
    """Parses ``argv`` into ``arguments_class``, runs ``job`` and prints its summary. Returns the exit code."""
    setup_logging()
    try:
        arguments = parse_arguments(arguments_class, argv, description or job.__doc__ or "")
        summary = job(arguments)
    except InvalidParameter as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ServiceFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2, default=str))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in JOBS:
        print("usage: tpu-mlm JOB [ARGS]  (tpu-mlm JOB --help for a job's arguments)\n\njobs:")
        for name, (_, summary) in JOBS.items():
            print(f"  {name:<14} {summary}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(JOBS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
