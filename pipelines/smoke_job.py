"""A short run of the real train step on this machine's accelerator, before the first real run on a TPU type or
image: what runtime and TPU it found, its replicas, compile time, step time, samples/s, MFU, peak memory per
replica, a write to the bucket read back, and a verdict.

It needs no data: it trains a tokenizer on the embedded corpus (padded with unused pieces to ``--vocab_size``,
so the model has the run's shape), writes training shards of that corpus repeated until they hold a few global
batches, and trains ``--steps`` steps at the given model config, batch and precision, all under ``--scratch``
(a ``gs://`` folder on Vertex AI: the shards stream from it as a real run's do). ``smoke.json`` there holds the
report, written also when a stage fails. ``tpu-mlm smoke`` runs this as a Vertex AI custom job on a TPU.

    python -m pipelines.smoke_job --scratch gs://my-bucket/smoke/try-1 --tpu_type v5e-8
    python -m pipelines.smoke_job --scratch /tmp/smoke --accelerator cpu --replicas 2 --model_config mini \\
        --per_replica_batch_size 8 --steps 9 --vocab_size 2000
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.corpus import EMBEDDED, embedded_lines
from components.lib.devices import ACCELERATORS, check_accelerator, prepare_runtime, slice_or, tpu_devices
from components.lib.errors import InvalidParameter
from components.lib.job_runner import run_job
from components.lib.memory_model import GIB, MemoryEstimate
from components.lib.modeling import SampleLength, model_config
from components.lib.preemption import last_words
from components.lib.recipe import RECIPE_VALUE, Recipe, resolve_recipe
from components.lib.results import SUMMARY_FILE
from components.lib.run_shape import settings_shape
from components.lib.shard_set import read_manifest
from components.lib.slice_hosts import ENDPOINTS_VARIABLE, HOSTS_FOLDER
from components.lib.tpu_catalogue import TPU_RUNTIME_VARIABLES, TPU_TYPES, BatchSettings, tpu_type

log = logging.getLogger("tpu_mlm.smoke")

REPORT_FILE = "smoke.json"
# Tokens per byte of the embedded corpus, on the low side (0.3 measured at 6,000 pieces), for how many copies
# of it the shards need
TOKENS_PER_BYTE_LOW = 0.2
GLOBAL_BATCHES_OF_DATA = 2  # shards of at least this many global batches (the stream repeats them)
# The smoke test and its probe train at the run's full batch, whatever its batch warm-up: what must fit, what a step
# costs and the peak are the full batch's (a warm-up's stages sum fewer of the same micro-batches)
FULL_BATCH = {"batch_warmup_fraction": 0.0}
PROBE_WINDOWS = 20  # log windows of the peak probe: 5 in its warmup, 15 at the peak
# The peak probe's verdict: at the peak, the loss must go on falling, and no window's loss rise above the lowest
# before it by more than this share (a spike the run might not come back from)
PROBE_LOSS_RISE = 0.05
PROBE_NORM_SPIKE = 10  # a gradient norm this many times the peak's median is a warning


@dataclass(kw_only=True)
class SmokeRun(SampleLength, BatchSettings, Recipe):
    """The run to try: the real run's TPU, model, batch, precision and recipe; its data, made in the job, or the
    run's own shards; and the peak probe, if asked for."""

    tpu_type: str = field(
        default="",
        metadata={"help": f"The TPU expected, one of {list(TPU_TYPES)}: its replicas, peak, memory and batch."},
    )
    model_config: str = field(default="roberta-base", metadata={"help": "The real run's model config."})
    vocab_size: int = field(default=25_000, metadata={"help": "The real run's vocabulary size."})
    bf16: bool = field(default=True, metadata={"help": "Mixed bfloat16 precision, as TPU runs train."})
    steps: int = field(default=30, metadata={"help": "Optimizer steps: three log windows, the first compiles."})
    train_shards: str = field(
        default="",
        metadata={
            "help": "The run's own training shards (gs:// on Vertex AI), read instead of data the job makes (whose "
            "vocabulary and length are then the shards'); with --tokenizer. What the peak probe should read."
        },
    )
    tokenizer: str = field(default="", metadata={"help": "The tokenizer of --train_shards."})
    peak_probe_steps: int = field(
        default=0,
        metadata={
            "help": "0: no probe. N: after the smoke test, N more steps of a new model that reach the recipe's peak "
            "learning rate in a quarter of them (a harder warmup than a long run's) and stay there, reporting the "
            "loss and gradient norm at the peak (docs/recipes.md). A multiple of 20; a few hundred take minutes."
        },
    )

    def __post_init__(self) -> None:
        self.resolve_batch(tpu_type(self.tpu_type).replicas if self.tpu_type else None)
        self.check_sample_length()
        if self.steps < 3 or self.steps % 3:
            raise InvalidParameter("steps", self.steps, "must be a positive multiple of 3 (three log windows)")
        if bool(self.train_shards) != bool(self.tokenizer):
            given, missing = ("train_shards", "tokenizer") if self.train_shards else ("tokenizer", "train_shards")
            raise InvalidParameter(missing, "", f"must be given with --{given}")
        for parameter in ("train_shards", "tokenizer"):
            if getattr(self, parameter):
                storage.check_uri(parameter, getattr(self, parameter))
        if self.peak_probe_steps < 0 or self.peak_probe_steps % PROBE_WINDOWS:
            raise InvalidParameter(
                "peak_probe_steps", self.peak_probe_steps, f"must be 0 (no probe) or a multiple of {PROBE_WINDOWS}"
            )
        resolve_recipe(vars(self))  # a knob the train step would refuse, refused before the TPU is taken


def run_settings(run: SmokeRun, settings: type) -> dict[str, Any]:
    """The run's settings (``SmokeRun``'s fields) that the dataclass ``settings`` has, by the same names."""
    names = {setting.name for setting in fields(settings)}
    return {setting.name: getattr(run, setting.name) for setting in fields(SmokeRun) if setting.name in names}


@dataclass(kw_only=True)
class SmokeArguments(SmokeRun):
    """The run to try, where its data and report go, and the accelerator it runs on."""

    scratch: str = field(metadata={"help": "Folder (gs:// on Vertex AI) for the data, model and smoke.json."})
    accelerator: str = field(default="tpu", metadata={"help": "tpu, gpu, cpu or auto.", "choices": ACCELERATORS})
    replicas: int = field(default=0, metadata={"help": "Replicas; 0: the TPU type's, else every device."})
    exit_zero: bool = field(
        default=False,
        metadata={
            "help": "Exit 0 once smoke.json is written, whatever the verdict (the custom job's setting: a failed "
            "exit would have Vertex AI restart the worker, and tpu-mlm smoke reads the verdict from the report)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        storage.check_uri("scratch", self.scratch)
        check_accelerator(self.accelerator, self.replicas)
        if self.tpu_type and self.accelerator == "tpu":
            self.replicas = self.replicas or tpu_type(self.tpu_type).replicas


class Report:
    """The smoke test's findings, stage by stage; ``smoke.json`` is written whatever happens."""

    def __init__(self, arguments: SmokeArguments):
        self.uri = storage.join(arguments.scratch, REPORT_FILE)
        self.values: dict[str, Any] = {"verdict": "fail", "arguments": asdict(arguments), "stages": {}}
        self.stage_running = ""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        started = time.perf_counter()
        found: dict[str, Any] = {}
        self.values["stages"][name] = found
        self.stage_running = name
        try:
            yield found
        except BaseException as error:
            self.values["failed_at"] = name
            self.values["error"] = f"{type(error).__name__}: {error}"
            raise
        finally:
            found["seconds"] = round(time.perf_counter() - started, 1)
            self.stage_running = ""
            self.write()  # stage by stage: a job killed later still leaves what it found

    def last_words(self, why: str) -> None:
        """The report of a process ended where no ``finally`` runs (a TPU start that hung, say)."""
        self.values.update(failed_at=self.stage_running, error=why)
        self.write()

    def write(self) -> None:
        storage.write_text_atomic(self.uri, json.dumps(self.values, indent=2, default=str) + "\n")


class Stopped(Exception):
    """A SIGTERM outside the training loop (which checkpoints and exits on its own): Vertex AI ending the job at
    its timeout, or cancelling it."""


def _stop(signum: int, frame: Any) -> None:
    raise Stopped("SIGTERM: the job was stopped (its timeout, or a cancel)")


def smoke(arguments: SmokeArguments) -> dict[str, Any]:
    """Runs the stages, writes ``smoke.json`` and returns the report; a failed stage is re-raised after, unless
    ``exit_zero`` (the report then says it)."""
    report = Report(arguments)
    signal.signal(signal.SIGTERM, _stop)
    with last_words(report.last_words):
        return _run_stages(arguments, report)


def _run_stages(arguments: SmokeArguments, report: Report) -> dict[str, Any]:
    try:
        with report.stage("runtime") as found:
            found.update(runtime())
            prepare_runtime(arguments.accelerator)
        if os.environ.get(ENDPOINTS_VARIABLE):  # host 0 of a slice, under the slice launcher
            with report.stage("slice") as found:
                found.update(slice_seen(arguments.scratch))
        with report.stage("data") as found:
            tokenizer, shards, validation = make_data(arguments)
            found.update(tokenizer=tokenizer, shards=shards, validation_shards=validation)
        with report.stage("train") as found:
            found.update(run_training(arguments, tokenizer, shards, validation))
        with report.stage("memory") as found:
            found.update(peak_memory(report.values["stages"]["train"]["accelerator"]))
            found.update(memory_estimate(arguments, shards))
        with report.stage("storage") as found:
            model = storage.join(arguments.scratch, "model")
            written = json.loads(storage.read_text(storage.join(model, SUMMARY_FILE)))
            found.update(model=model, read_back=written["total_steps"] == arguments.steps)
        if arguments.peak_probe_steps:
            with report.stage("peak probe") as found:
                found.update(peak_probe(arguments, tokenizer, shards))
        report.values.update(judge(arguments, report.values["stages"]))
    except (Exception, SystemExit):
        if not arguments.exit_zero:
            raise
    finally:
        report.write()
        for line in describe(report.values):
            log.info(line)
    return report.values


def runtime() -> dict[str, Any]:
    """What the job runs on: package versions, the TPU runtime's settings and the TPU devices found."""
    packages = {}
    for name in ("tensorflow-tpu", "tensorflow", "libtpu", "transformers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            packages[name] = metadata.version(name)
    names = (*TPU_RUNTIME_VARIABLES, "TF_XLA_FLAGS", "TPU_ACCELERATOR_TYPE", "TPU_LOAD_LIBRARY")
    return {
        "packages": packages,
        "environment": {name: os.environ[name] for name in names if name in os.environ},
        "tpu_devices": tpu_devices(),
    }


def host_reports(scratch: str) -> list[dict[str, Any]]:
    """What each host's slice launcher wrote under ``scratch`` (its ``--report_dir``), host 0 first, the hosts
    that could not tell their index last, each with the devices its server found (libtpu's chips, on a TPU)
    once it has written them."""
    found = {
        storage.basename(uri): json.loads(storage.read_text(uri))
        for uri in storage.glob(storage.join(scratch, HOSTS_FOLDER, "*.json"))
    }
    hosts = [report for name, report in found.items() if not name.endswith("-server.json")]
    for host in hosts:
        host["server_devices"] = found.get(f"host-{host.get('host')}-server.json", {}).get("devices")
    return sorted(hosts, key=lambda host: host.get("host", len(hosts)))


def slice_seen(scratch: str) -> dict[str, Any]:
    """What each host's launcher found and, connected to every host's server as the train step will be, the
    devices each host serves."""
    import tensorflow as tf
    from tensorflow.python.eager import context  # the devices of the cluster; tf.config lists this process's

    hosts = host_reports(scratch)
    endpoints = slice_or("local")
    started = time.perf_counter()
    tf.config.experimental_connect_to_cluster(tf.distribute.cluster_resolver.TPUClusterResolver(endpoints))
    devices: dict[str, list[str]] = {}
    for name in context.context().devices():
        if "/job:worker/" in name:
            task = name.split("/task:")[1].split("/")[0]
            devices.setdefault(task, []).append(name.rsplit("/device:", 1)[1])
    return {
        "endpoints": endpoints,
        "host_reports": hosts,
        "connect_seconds": round(time.perf_counter() - started, 1),
        "devices_by_host": devices,
    }


def make_data(arguments: SmokeArguments) -> tuple[str, str, str]:
    """A tokenizer of ``vocab_size`` pieces, and training and validation shards holding a few global batches
    each (the same text: the validation is there to be compiled and run, not to measure), under scratch; or the
    run's own tokenizer and shards, where given."""
    if arguments.train_shards:  # the run's own: the validation is there to be compiled and run
        return arguments.tokenizer, arguments.train_shards, arguments.train_shards
    from transformers import PreTrainedTokenizerFast

    from components.shards import ShardArguments, write_shards
    from components.tokenizer import TokenizerArguments, train_tokenizer

    tokenizer_uri = storage.join(arguments.scratch, "tokenizer")
    shards_uri = storage.join(arguments.scratch, "shards")
    with tempfile.TemporaryDirectory() as local:
        folder = Path(local, "tokenizer")
        train_tokenizer(TokenizerArguments(corpus=EMBEDDED, vocab_size=arguments.vocab_size, output=str(folder)))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        # the embedded corpus gives about 6,000 pieces; the model must have the run's embedding table
        tokenizer.add_tokens([f"<unused{index}>" for index in range(len(tokenizer), arguments.vocab_size)])
        tokenizer.save_pretrained(folder)
        storage.upload_folder(folder, tokenizer_uri)
        lines = embedded_lines()
        text_bytes = sum(len(line.encode("utf-8")) + 1 for line in lines)
        shape = settings_shape(
            vars(arguments),
            replicas=max(arguments.replicas, 1),
            samples=None,
            max_steps=GLOBAL_BATCHES_OF_DATA,
            **FULL_BATCH,
        )
        needed_tokens = shape.tokens  # shards of GLOBAL_BATCHES_OF_DATA global batches
        copies = math.ceil(needed_tokens / (TOKENS_PER_BYTE_LOW * text_bytes))
        corpus = Path(local, "corpus.txt")
        corpus.write_text("\n".join(lines * copies) + "\n", encoding="utf-8")
        # on a slice, two files a host: each host reads a share of the files
        hosts = tpu_type(arguments.tpu_type).hosts if arguments.tpu_type else 1
        files = {"records_per_shard": max(1, needed_tokens // arguments.max_length // (2 * hosts))} if hosts > 1 else {}
        for split in ("train", "validation"):
            write_shards(
                ShardArguments(
                    corpus=str(corpus),
                    tokenizer=tokenizer_uri,
                    output=storage.join(shards_uri, split),
                    split=split,
                    max_length=arguments.max_length,
                    **files,
                )
            )
    return tokenizer_uri, storage.join(shards_uri, "train"), storage.join(shards_uri, "validation")


def run_training(arguments: SmokeArguments, tokenizer: str, shards: str, validation: str) -> dict[str, Any]:
    """The train step itself for ``steps`` steps, one checkpoint with its validation, and the model saved."""
    window = arguments.steps // 3
    summary = train_here(
        arguments,
        arguments.scratch,
        tokenizer=tokenizer,
        train_shards=shards,
        eval_shards=validation,
        max_steps=arguments.steps,
        log_every_steps=window,
        checkpoint_every_steps=arguments.steps,
    )
    steady = summary["history"][-1]  # the last window: no compile, no checkpoint in it
    step_seconds = summary["global_batch_size"] / steady["samples_per_second"]
    return {
        "accelerator": summary["accelerator"],
        "replicas": summary["replicas"],
        "global_batch_size": summary["global_batch_size"],
        "num_parameters": summary["num_parameters"],
        "first_loss": summary["first_loss"],
        "last_loss": summary["last_loss"],
        "first_call_seconds": summary["first_call_seconds"],
        # the first call ran one log window's steps after tracing and compiling
        "compile_seconds": max(0.0, summary["first_call_seconds"] - window * step_seconds),
        "step_seconds": step_seconds,
        "samples_per_second": steady["samples_per_second"],
        "tokens_per_second": steady["tokens_per_second"],
        "mfu": steady.get("mfu"),
        "train_seconds": summary["seconds_this_run"],
    }


def train_here(arguments: SmokeArguments, folder: str, **settings: Any) -> dict[str, Any]:
    """The train step on this machine's accelerator with the run's settings and ``settings``, its model, checkpoints
    and logs in ``folder``'s model, checkpoints and logs; returns its summary."""
    from components.train import TrainArguments, train

    tpu = tpu_type(arguments.tpu_type) if arguments.tpu_type else None
    return train(
        TrainArguments(
            **{
                **run_settings(arguments, TrainArguments),
                "output": storage.join(folder, "model"),
                "checkpoint_dir": storage.join(folder, "checkpoints"),
                "tensorboard_dir": storage.join(folder, "logs"),
                "accelerator": arguments.accelerator,
                "replicas": arguments.replicas,
                "peak_tflops": tpu.peak_tflops_per_replica if tpu else 0.0,
                **FULL_BATCH,
                **settings,
            }
        )
    )


def peak_probe(arguments: SmokeArguments, tokenizer: str, shards: str) -> dict[str, Any]:
    """A new model trained ``peak_probe_steps`` steps that reach the recipe's peak learning rate in a quarter of
    them and stay there (``wsd`` without its decay), its masking rate held at the recipe's first (a decaying rate
    lowers the loss by itself): the loss and gradient norm at the peak, in minutes, where a long run gets there
    after hours. Stable: the loss falls at the peak and no window's rises more than ``PROBE_LOSS_RISE`` above the
    lowest before it; a loss that is not finite stops the probe (``Diverged``)."""
    steps = arguments.peak_probe_steps
    summary = train_here(
        arguments,
        storage.join(arguments.scratch, "peak-probe"),
        tokenizer=tokenizer,
        train_shards=shards,
        max_steps=steps,
        log_every_steps=steps // PROBE_WINDOWS,
        checkpoint_every_steps=steps,
        warmup_steps=steps // 4,
        warmup_fraction=float(RECIPE_VALUE),
        lr_schedule="wsd",
        decay_fraction=1 / steps,  # wsd's decay would start after the last step: every step after warmup at the peak
        final_mlm_probability=0.0,
    )
    # each window's learning rate is the one of the step after it: the last warmup window shows the peak
    windows = [
        {key: point[key] for key in ("step", "loss", "gradient_norm", "learning_rate")} for point in summary["history"]
    ]
    at_peak = [window for window in windows if window["step"] > steps // 4]
    losses = [window["loss"] for window in at_peak]
    problems, warnings = [], []
    if losses[-1] >= losses[0]:
        problems.append(f"did not fall at the peak ({losses[0]:.4f} to {losses[-1]:.4f})")
    rises = [(loss / min(losses[:index]) - 1, index) for index, loss in enumerate(losses) if index]
    rise, index = max(rises, default=(0.0, 0))
    if rise > PROBE_LOSS_RISE:
        problems.append(
            f"rose to {losses[index]:.4f} at step {at_peak[index]['step']}, {rise:.0%} above its lowest before"
        )
    norms = sorted(window["gradient_norm"] for window in at_peak)
    if norms[-1] > PROBE_NORM_SPIKE * norms[len(norms) // 2]:
        warnings.append(f"the gradient norm spiked to {norms[-1]:.3g} at the peak, {PROBE_NORM_SPIKE}x its median")
    passes = steps * summary["global_batch_size"] / read_manifest(shards, "train_shards")["num_records"]
    if passes > 1:
        warnings.append(
            f"the probe read its shards {passes:.1f} times: a loss that falls by learning them by heart hides a "
            "spike; give it shards of more samples, or fewer steps"
        )
    return {
        "steps": steps,
        "warmup_steps": steps // 4,
        "peak_learning_rate": summary["arguments"]["learning_rate"],
        "clip_norm": summary["arguments"]["clip_norm"],
        "loss_at_peak": [losses[0], losses[-1]],
        "highest_loss_at_peak": max(losses),
        "gradient_norm_at_peak": [norms[0], norms[-1]],
        "passes_over_the_shards": passes,
        "stable": not problems,
        "problems": problems,
        "warnings": warnings,
        "windows": windows,
    }


def peak_memory(kind: str) -> dict[str, Any]:
    """Each replica's peak memory so far, as the runtime counts it (TPUs and GPUs; the CPU keeps no count)."""
    import tensorflow as tf

    peaks = []
    for device in tf.config.list_logical_devices(kind.upper()):
        try:
            peaks.append(tf.config.experimental.get_memory_info(device.name)["peak"])
        except ValueError as error:  # "Allocator stats not available": the CPU, and allocators without stats
            return {"peak_gib_per_replica": None, "why_not": str(error)}
    if not peaks:
        return {"peak_gib_per_replica": None, "why_not": f"no {kind.upper()} device listed"}
    return {"peak_gib_per_replica": round(max(peaks) / GIB, 2)}


def judge(arguments: SmokeArguments, stages: dict[str, Any]) -> dict[str, Any]:
    """The verdict: the accelerator and replicas asked for, a finite loss, the model read back from storage and,
    where it is measured, peak memory within what the TPU's replicas have."""
    trained = stages["train"]
    tpu = tpu_type(arguments.tpu_type) if arguments.tpu_type else None
    problems = []
    if arguments.accelerator != "auto" and trained["accelerator"] != arguments.accelerator:
        problems.append(f"trained on {trained['accelerator']}, not {arguments.accelerator}")
    if arguments.replicas and trained["replicas"] != arguments.replicas:
        problems.append(f"{trained['replicas']} replicas, not {arguments.replicas}")
    if not all(math.isfinite(trained[name]) for name in ("first_loss", "last_loss")):
        problems.append(f"the loss is not finite ({trained['first_loss']} to {trained['last_loss']})")
    if not stages["storage"]["read_back"]:
        problems.append("the model's training_summary.json read back does not match the run")
    probe = stages.get("peak probe", {})
    if "stable" in probe and not probe["stable"]:
        clip = probe["clip_norm"]
        remedy = f"--clip_norm {clip / 2 if clip else 1.0:g} or a lower --learning_rate"
        problems.append(
            f"at the peak learning rate {probe['peak_learning_rate']:g} the loss {' and '.join(probe['problems'])}: "
            f"try {remedy}, and probe again before the long run (a loss still on the unigram plateau does not fall "
            "either: a longer probe tells them apart)"
        )
    peak = stages["memory"]["peak_gib_per_replica"]
    warnings = []
    if peak is None and trained["accelerator"] != "cpu":
        warnings.append(
            f"peak memory not measured ({stages['memory']['why_not']}): the runtime keeps no count; the estimate "
            "alone stands, and a longer run's memory is not proven by this one"
        )
    if tpu and peak is not None and peak > MemoryEstimate.FITS * tpu.memory_gib_per_replica:
        problems.append(
            f"peak memory {peak:.1f} GiB per replica is above {MemoryEstimate.FITS:.0%} of a {tpu.name} replica's "
            f"{tpu.memory_gib_per_replica:.0f} GiB: a longer run may run out; lower per_replica_batch_size and raise "
            "gradient_accumulation_steps"
        )
    warnings += probe.get("warnings", [])
    return {"verdict": "fail" if problems else "pass", "problems": problems, "warnings": warnings}


def memory_estimate(arguments: SmokeArguments, shards: str) -> dict[str, float]:
    """What preflight's estimate says of this run's memory, to set beside the peak measured."""
    manifest = read_manifest(shards, "train_shards")
    memory = settings_shape(
        vars(arguments),  # with the run's recipe, whose masking rate sizes the LM head
        replicas=max(arguments.replicas, 1),
        samples=None,
        max_steps=arguments.steps,
        max_length=manifest["max_length"],  # the run's own shards' length, where given
        config=model_config(arguments.model_config, manifest),
        **FULL_BATCH,
    ).memory
    return {"estimate_low_gib": memory.low_gib, "estimate_high_gib": memory.high_gib}


def describe(values: dict[str, Any]) -> list[str]:
    """The report as lines for the log (and for ``tpu-mlm smoke`` to print)."""
    stages = values["stages"]
    lines = [f"verdict: {values['verdict'].upper()}"]
    if "failed_at" in values:
        lines.append(f"failed at the {values['failed_at']} stage: {values['error']}")
    lines += [f"problem: {problem}" for problem in values.get("problems", [])]
    lines += [f"warning: {warning}" for warning in values.get("warnings", [])]
    if "runtime" in stages:
        packages = ", ".join(f"{name} {version}" for name, version in stages["runtime"]["packages"].items())
        lines.append(f"runtime: {packages}; TPU devices: {len(stages['runtime']['tpu_devices'])}")
    if "slice" in stages and "devices_by_host" in stages["slice"]:
        seen = stages["slice"]
        sources = sorted({host.get("source", host.get("failed", "?")) for host in seen["host_reports"]})
        lines.append(f"slice: {len(seen['host_reports'])} host report(s), hosts found from {'; '.join(sources)}")
        for task, names in sorted(seen["devices_by_host"].items(), key=lambda item: int(item[0])):
            kinds = sorted({name.rsplit(":", 1)[0] for name in names})
            counts = ", ".join(f"{sum(n.startswith(kind + ':') for n in names)} {kind}" for kind in kinds)
            lines.append(f"  host {task}: {counts}")
    if "train" in stages and "accelerator" in stages["train"]:
        trained = stages["train"]
        mfu = f", MFU {trained['mfu']:.1%}" if trained["mfu"] is not None else ""
        lines += [
            f"trained on: {trained['accelerator']}, {trained['replicas']} replica(s), global batch "
            f"{trained['global_batch_size']}, {trained['num_parameters']:,} parameters",
            f"compile: {trained['compile_seconds']:.1f} s (first call {trained['first_call_seconds']:.1f} s)",
            f"step: {trained['step_seconds']:.3f} s, {trained['samples_per_second']:,.1f} samples/s{mfu}",
            f"loss: {trained['first_loss']:.4f} to {trained['last_loss']:.4f}",
        ]
    if "memory" in stages and "estimate_low_gib" in stages["memory"]:
        memory = stages["memory"]
        measured = memory["peak_gib_per_replica"]
        peak = f"{measured:.2f} GiB" if measured is not None else "not measured here"
        lines.append(
            f"memory per replica: peak {peak}; estimate {memory['estimate_low_gib']}-{memory['estimate_high_gib']} GiB"
        )
    if "peak probe" in stages and "stable" in stages["peak probe"]:
        probe = stages["peak probe"]
        low, high = probe["gradient_norm_at_peak"]
        lines.append(
            f"peak probe: {probe['steps']} steps, at the peak {probe['peak_learning_rate']:g} from step "
            f"{probe['warmup_steps']}: loss {probe['loss_at_peak'][0]:.4f} to {probe['loss_at_peak'][1]:.4f} (highest "
            f"{probe['highest_loss_at_peak']:.4f}), gradient norm {low:.3f} to {high:.3f}: "
            + ("stable" if probe["stable"] else "UNSTABLE")
        )
    if "storage" in stages and "model" in stages["storage"]:
        lines.append(f"storage: model written to and read back from {stages['storage']['model']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(SmokeArguments, smoke, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
