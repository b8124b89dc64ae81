"""Merge the part manifests of a sharded run (``--num_parts N``) into the folder's ``manifest.json``.

Checks that all N parts are there, made with the same settings, and that every file they list exists.
With ``--parts``, the parts were written to folders of their own (one per pipeline task) and are copied
into ``--output`` first, as the pipeline's merge step does.

    python -m components.merge_shards --output gs://bucket/shards/train
    python -m components.merge_shards --parts gs://b/part-0,gs://b/part-1 --output gs://bucket/shards/train
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib.job_runner import run_job
from components.lib.shard_set import gather_parts, manifest_for_people, merge_manifests


@dataclass
class MergeArguments:
    output: str = field(metadata={"help": "The shard folder that the parts wrote into (or are copied into)."})
    parts: str = field(default="", metadata={"help": "Comma-separated folders of parts written separately."})


def merge(arguments: MergeArguments) -> dict[str, Any]:
    if arguments.parts:
        return gather_parts([folder for folder in arguments.parts.split(",") if folder], arguments.output)
    return merge_manifests(arguments.output)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(MergeArguments, merge, argv, description=__doc__, for_people=manifest_for_people)


if __name__ == "__main__":
    sys.exit(main())
