"""A run's shape: its replicas and batch, the steps it takes and the samples and tokens it reads. Pure arithmetic
(no TensorFlow, no I/O), built by ``run_shape`` alone: the train step, preflight, the estimate, submit and the
smoke test read it, so that no two of them can count a run differently."""

from __future__ import annotations

from dataclasses import dataclass

from components.lib.errors import InvalidParameter


@dataclass(frozen=True)
class RunShape:
    replicas: int
    per_replica_batch_size: int  # samples per replica per micro-batch
    accumulation: int  # micro-batches per optimizer step
    max_length: int  # tokens per sample
    steps: int  # optimizer steps

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step."""
        return self.per_replica_batch_size * self.replicas * self.accumulation

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch over all replicas: what the input streams batch."""
        return self.per_replica_batch_size * self.replicas

    @property
    def samples(self) -> int:
        """Samples the run reads (an epoch's remainder that fills no global batch is not read)."""
        return self.steps * self.global_batch_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.max_length

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step


def run_shape(
    replicas: int,
    per_replica_batch_size: int,
    accumulation: int,
    max_length: int,
    samples: int | None,
    num_epochs: int,
    max_steps: int,
) -> RunShape:
    """The shape of a run of ``max_steps`` steps, else of ``num_epochs`` over ``samples`` training samples (None:
    not known, with ``max_steps`` given); a global batch larger than the data is refused."""
    shape = RunShape(replicas, per_replica_batch_size, accumulation, max_length, max_steps)
    if samples is not None and shape.global_batch_size > samples:
        raise InvalidParameter(
            "per_replica_batch_size",
            per_replica_batch_size,
            f"x {replicas} replica(s)"
            + (f" x {accumulation} micro-batches" if accumulation > 1 else "")
            + f" = global batch {shape.global_batch_size}, more than the {samples:,} training samples",
        )
    if max_steps:
        return shape
    return RunShape(
        replicas, per_replica_batch_size, accumulation, max_length, num_epochs * (samples // shape.global_batch_size)
    )
