"""The project's command line: ``tpu-mlm JOB [ARGS]`` runs the job's module, as ``python -m MODULE [ARGS]`` (or
``python -m MODULE JOB [ARGS]`` for a module of several jobs).

Every job module keeps its arguments in a dataclass and runs through ``components.lib.job_runner.run_job``.
"""

import importlib
import sys
from collections.abc import Sequence

# job name -> (module, what it does); "MODULE JOB": one of the module's jobs (python -m MODULE JOB ARGS)
JOBS = {
    "run-local": ("pipelines.run_local", "Run the whole pipeline on this machine under kfp.local."),
    "compile": ("pipelines.compile", "Compile the pipeline for Vertex AI (or kfp.local) to YAML."),
    "smoke": ("pipelines.submit_smoke", "Try a TPU type and image in one short custom job before the first real run."),
    "submit": ("pipelines.submit", "Submit a compiled pipeline to Vertex AI Pipelines (or --dry_run)."),
    "status": ("pipelines.runs status", "Where a Vertex AI run stands: tasks, TPU jobs, the training's progress."),
    "logs": ("pipelines.runs logs", "The log lines of a Vertex AI run's TPU job (Cloud Logging)."),
    "cancel": ("pipelines.runs cancel", "Cancel a Vertex AI run and its TPU jobs, and wait until they have ended."),
    "clean": ("pipelines.clean", "Delete a run's artifacts, checkpoints and logs from storage (a dry run first)."),
    "tokenizer": ("components.tokenizer", "Train a Unigram tokenizer on a corpus."),
    "shards": ("components.shards", "Tokenize a corpus into fixed-length TFRecord shards."),
    "merge-shards": ("components.merge_shards", "Merge the part manifests of a sharded run into manifest.json."),
    "estimate": ("components.estimate", "Time, cost and memory fit of a TPU run, before paying for it."),
    "preflight": ("components.preflight", "Check data, config, storage and Hub access before a TPU run."),
    "train": ("components.train", "Pre-train a masked language model on shards (TPU, GPU or CPU)."),
    "evaluate": ("components.evaluate", "Loss, perplexity, masked accuracy and fill-mask examples."),
    "compare": ("components.compare", "Two models' loss on the same masked samples, with a paired error."),
    "downstream": ("components.downstream", "Fine-tune the model and a random twin on labelled tasks: what it gained."),
    "report": ("components.report", "The run report: metrics, loss curve, throughput, fill-mask examples (HTML)."),
    "push": ("components.push", "Push model, tokenizer and model card to the Hugging Face Hub."),
    "export": ("components.export", "Add PyTorch weights (transformers 5) to a model saved with TF weights only."),
    "slice": ("components.slice", "Run a command on a TPU slice's host 0, a TPU worker server on every host."),
    "tpu-worker": ("components.tpu_worker", "Serve this host's TPU chips to the program on a slice's host 0."),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in JOBS:
        print("usage: tpu-mlm JOB [ARGS]  (tpu-mlm JOB --help for a job's arguments)\n\njobs:")
        for name, (_, summary) in JOBS.items():
            print(f"  {name:<14} {summary}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, *job = JOBS[argv[0]][0].split()
    return importlib.import_module(module).main([*job, *argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
