"""Merge the part manifests of a sharded run (``--num_parts N``) into the folder's ``manifest.json``.

Checks that all N parts are there, made with the same settings, and that every file they list exists.

    python -m components.merge_shards --output gs://bucket/shards/train
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.cli import run_job
from components.shards import merge_manifests


@dataclass
class MergeArguments:
    output: str = field(metadata={"help": "The shard folder that the parts wrote into."})


def merge(arguments: MergeArguments) -> dict[str, Any]:
    return merge_manifests(arguments.output)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(MergeArguments, merge, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
