"""Estimate a TPU run before paying for it: samples, tokens, steps, model FLOPs, hours, cost, and memory fit.

The data comes from the training shards' ``manifest.json`` when they exist, else from the corpus's size and
the tokens per byte of a tokenizer, measured on a sample of the corpus. Hours come from the model FLOPs (the
formula the train step logs MFU with) at an assumed model FLOPs utilization, and, with ``--from_run``, from
the throughput a previous run measured (its ``training_summary.json``), scaled to this run. The CPU steps are
counted too: the data steps from a corpus, and the evaluation and the downstream probe at the pipeline's default
settings, as ``submit --dry_run`` counts them. Nothing here is measured on a TPU.

    python -m components.estimate --train_shards gs://b/shards/train --model_config roberta-base --tpu_type v3-8 \\
        --price_per_hour 8.0
"""

import sys
from collections.abc import Sequence
from typing import Any

from components.lib.estimates import DEFAULT_PROBE, EstimateArguments, estimate_run, estimate_table
from components.lib.job_runner import run_job


def estimate(arguments: EstimateArguments) -> dict[str, Any]:
    """The job run as this module (its usage line names it): the estimate, as a table for people; the evaluation
    and the downstream probe at their steps' defaults, the pipeline's."""
    return estimate_run(arguments, probe=DEFAULT_PROBE)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(EstimateArguments, estimate, argv, description=__doc__, for_people=estimate_table)


if __name__ == "__main__":
    sys.exit(main())
