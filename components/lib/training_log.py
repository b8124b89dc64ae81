"""What the training loop reports as it goes: a log point for each window of steps (loss, global gradient norm,
learning rate, samples and tokens a second, MFU where the accelerator's peak is known, time left and, with a price,
the cost so far and projected), as a log line and as TensorBoard scalars."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.training_plan import TrainingPlan


@dataclass
class LogWindow:
    """The steps since the last log point, and what the next point reports of them: loss, throughput, MFU
    where the peak is known, time left and, with a price, the cost so far and projected."""

    plan: TrainingPlan
    peak_tflops: float | None
    replicas: int
    price_per_hour: float
    run_started: float = field(default_factory=time.perf_counter)
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    norm_sum: float = 0.0

    def add(self, steps: int, samples: int, loss: float, gradient_norm: float) -> None:
        self.steps += steps
        self.samples += samples
        self.loss_sum += loss * steps
        self.norm_sum += gradient_norm * steps

    def restart(self) -> None:
        """Forgets the steps since the last point (a rewind goes back before them)."""
        self.started, self.steps, self.samples, self.loss_sum, self.norm_sum = time.perf_counter(), 0, 0, 0.0, 0.0

    def point(self, step: int, learning_rate: float, mlm_probability: float) -> dict[str, float]:
        shape = self.plan.shape
        seconds = time.perf_counter() - self.started
        samples_per_second = self.samples / seconds
        flops_per_second = shape.model_flops_per_sample * samples_per_second
        point = {
            "step": step,
            "samples": shape.samples_before(step),  # read by the run's steps so far (fewer in a batch warm-up)
            "loss": self.loss_sum / self.steps,
            "gradient_norm": self.norm_sum / self.steps,
            "learning_rate": learning_rate,
            "mlm_probability": mlm_probability,
            "samples_per_second": samples_per_second,
            "tokens_per_second": samples_per_second * shape.max_length,
            "model_tflops_per_second": flops_per_second / 1e12,
            "eta_seconds": (shape.samples - shape.samples_before(step)) / samples_per_second,
        }
        if self.peak_tflops:
            point["mfu"] = flops_per_second / (self.peak_tflops * 1e12 * self.replicas)
        if self.price_per_hour:
            elapsed = time.perf_counter() - self.run_started
            point["cost_so_far"] = self.price_per_hour * elapsed / 3600
            point["projected_cost"] = self.price_per_hour * (elapsed + point["eta_seconds"]) / 3600
        self.restart()
        return point


def write_summaries(writer: Any, point: dict[str, float]) -> None:
    import tensorflow as tf

    with writer.as_default(step=int(point["step"])):
        for name, value in point.items():
            if name != "step":
                tf.summary.scalar(f"train/{name}", value)


def last_step_in_tensorboard(folder: str, tag: str = "train/loss") -> int:
    """The last step of ``tag``'s points in the event files under ``folder`` (0 without any): what a resumed training
    must not write again, since TensorBoard keeps both points of a step written twice. Points a killed process
    wrote but never flushed are not there, and are written again."""
    import tensorflow as tf

    last = 0
    for events in storage.glob(storage.join(folder, "events.out.tfevents.*")):
        try:
            for event in tf.compat.v1.train.summary_iterator(events):
                if any(value.tag == tag for value in event.summary.value):
                    last = max(last, event.step)
        except tf.errors.DataLossError:  # the record a killed process was writing: the ones before it count
            continue
    return last


def format_point(point: dict[str, float], total_steps: int) -> str:
    line = (
        f"step {int(point['step'])}/{total_steps}: loss {point['loss']:.4f}, "
        f"gradient norm {point['gradient_norm']:.3g}, lr {point['learning_rate']:.2e}, "
        f"masking {point['mlm_probability']:.1%}, "
        f"{point['samples_per_second']:,.1f} samples/s, {point['tokens_per_second']:,.0f} tokens/s"
    )
    if "mfu" in point:
        line += f", MFU {point['mfu']:.1%}"
    eta = int(point["eta_seconds"])
    line += f", ETA {eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}"
    if "cost_so_far" in point:
        line += f", ${point['cost_so_far']:,.2f} so far of about ${point['projected_cost']:,.2f}"
    return line
