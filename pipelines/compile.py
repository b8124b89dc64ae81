"""Compile the pipeline to a YAML file for Vertex AI Pipelines (``--target vertex``) or kfp.local (``local``).

    python -m pipelines.compile --target vertex --tpu_type v5e-4 --output pipeline.yaml \\
        --cpu_image us-docker.pkg.dev/PROJECT/tpu-mlm/cpu:0.1.0 --tpu_image us-docker.pkg.dev/PROJECT/tpu-mlm/tpu:0.1.0
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib.errors import InvalidParameter
from components.lib.job_runner import run_job
from components.lib.tpu_catalogue import tpu_runtime_env
from pipelines.pipeline import DEFAULT_CPU_IMAGE, DEFAULT_TRAIN_RETRIES, TARGETS, TPU_TYPES, compile_pipeline


@dataclass
class CompileArguments:
    output: str = field(default="pipeline.yaml", metadata={"help": "YAML file to write."})
    target: str = field(default="vertex", metadata={"help": "vertex or local.", "choices": TARGETS})
    tpu_type: str = field(
        default="v3-8", metadata={"help": "TPU of the train step on Vertex.", "choices": list(TPU_TYPES)}
    )
    cpu_image: str = field(default=DEFAULT_CPU_IMAGE, metadata={"help": "Image of the CPU steps."})
    tpu_image: str = field(default="", metadata={"help": "Image of the train step on TPUs (vertex target)."})
    tpu_env: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Changes to the TPU job's environment, KEY=VALUE (KEY= drops one of the job's defaults, and an "
            "image's own value then applies); the defaults are Google's TF TPU CI settings (PJRT runtime, "
            "TF_XLA_FLAGS). No image rebuild needed."
        },
    )

    train_retries: int = field(
        default=-1,
        metadata={
            "help": "Reruns of the TPU task when its job fails for good (a reclaimed Spot TPU), each 10 minutes "
            f"later and resuming from the run's checkpoints (vertex target); -1: {DEFAULT_TRAIN_RETRIES} on one "
            "host, 0 on a slice of several hosts (no Spot there, and a failed start costs every host's chips again)."
        },
    )

    def __post_init__(self) -> None:
        if not -1 <= self.train_retries <= 10:
            raise InvalidParameter("train_retries", self.train_retries, "must be from 0 to 10, or -1 (the default)")
        if self.target == "vertex" and not self.tpu_image:
            raise InvalidParameter("tpu_image", self.tpu_image, "the vertex target needs the TPU image's URI")
        if self.target == "vertex":
            check_image_uri("cpu_image", self.cpu_image)
            check_image_uri("tpu_image", self.tpu_image)
        tpu_runtime_env(self.tpu_env)


def check_image_uri(parameter: str, uri: str) -> None:
    """An image Vertex AI can pull: a registry host first (``us-docker.pkg.dev/…``, ``gcr.io/…``)."""
    host = uri.split("/", 1)[0]
    if "/" not in uri or not ("." in host or ":" in host or host == "localhost"):
        raise InvalidParameter(
            parameter,
            uri,
            "is a local image name; Vertex AI pulls images from a registry: name its URI "
            "(REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG)",
        )


def compile_command(arguments: CompileArguments) -> dict[str, Any]:
    path = compile_pipeline(
        arguments.output,
        target=arguments.target,
        cpu_image=arguments.cpu_image,
        tpu_image=arguments.tpu_image,
        tpu_type=arguments.tpu_type,
        tpu_env=tpu_runtime_env(arguments.tpu_env),
        train_retries=arguments.train_retries,
    )
    return {"compiled": path, "target": arguments.target, "tpu_type": arguments.tpu_type}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(CompileArguments, compile_command, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
