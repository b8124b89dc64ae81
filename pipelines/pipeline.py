"""The pre-training pipeline: tokenizer -> train and validation shards -> train -> evaluate -> Hub push.

The training shards fan out over ``num_parts`` tasks (``dsl.ParallelFor``) whose outputs a merge step
gathers; the validation shards are an independent task. The push runs only when ``hub_repo_id`` is set;
its token comes from ``HF_TOKEN`` locally and from the Secret Manager secret ``hf_token_secret`` on Vertex AI,
so no secret value is ever a pipeline parameter. Every hand-over is an artifact URI under the pipeline root
(``gs://`` on Vertex AI), or under ``output_root`` when it is set. ``build_pipeline`` makes the pipeline for a
target:

* ``local``: every step a plain component, for ``kfp.local``;
* ``vertex``: the train step runs as a Vertex AI custom job on a TPU (see ``TPU_TYPES``), with the defaults a
  TPU run wants: ``accelerator=tpu`` (a TPU that does not start fails the step, never a CPU run), ``bf16``, the
  TPU's replica count checked by preflight and by the train step, and its peak for MFU.
"""

from typing import Any

from kfp import compiler, dsl

from components.accelerators import TPU_TYPES, TpuType
from components.errors import InvalidParameter
from components.tokenizer import DEFAULT_SAMPLE_BYTES
from pipelines.steps import make_steps

PIPELINE_NAME = "tpu-mlm-pretraining"
DEFAULT_CPU_IMAGE = "tpu-mlm-cpu:latest"
TARGETS = ("local", "vertex")
# CPU and memory requests on Vertex AI for the CPU steps (tokenizing uses every core).
CPU_RESOURCES = {
    "tokenizer": ("8", "32G"),
    "shards": ("8", "32G"),
    "evaluate": ("8", "32G"),
    "push": ("2", "8G"),
    "report": ("2", "8G"),
    "preflight": ("2", "8G"),
}


def check_target(target: str, tpu_type: str) -> None:
    if target not in TARGETS:
        raise InvalidParameter("target", target, f"must be one of {TARGETS}")
    if tpu_type not in TPU_TYPES:
        raise InvalidParameter("tpu_type", tpu_type, f"must be one of {sorted(TPU_TYPES)}")


def tpu_training_job(train_component: Any, tpu: TpuType) -> Any:
    """The train component as a Vertex AI custom job on the TPU ``tpu``.

    * ``restart_job_on_worker_restart``: when Vertex AI restarts the worker (VM maintenance, a crash), the whole
      job restarts, and training resumes from its last checkpoint; it does not retry a job that failed.
    * No ``disk_spec``: a TPU VM brings its own boot disk (Cloud TPU supports balanced persistent disks for
      v2-v5e), while the helper's default ``pd-ssd`` is not among them.
    * The job runs as the pipeline run's service account (resolved by Vertex AI at run time), not as Vertex
      AI's custom-code service agent, so it has the run's access to the bucket and Secret Manager."""
    from google_cloud_pipeline_components._placeholders import SERVICE_ACCOUNT_PLACEHOLDER
    from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component

    job = create_custom_training_job_from_component(
        train_component,
        display_name="train",
        machine_type=tpu.machine_type,
        accelerator_type=tpu.accelerator_type,
        accelerator_count=tpu.accelerator_count or 1,
        boot_disk_type="",
        restart_job_on_worker_restart=True,
        service_account=SERVICE_ACCOUNT_PLACEHOLDER,
    )
    # TPU v5e takes machine type + topology, no accelerator fields, which the helper cannot say
    job.component_spec.inputs["worker_pool_specs"].default[0]["machine_spec"] = tpu.machine_spec
    return job


def build_pipeline(
    target: str = "local", cpu_image: str = DEFAULT_CPU_IMAGE, tpu_image: str = "", tpu_type: str = "v3-8"
) -> Any:
    check_target(target, tpu_type)
    vertex = target == "vertex"
    tpu = TPU_TYPES[tpu_type]
    steps = make_steps(cpu_image, tpu_image or cpu_image)
    train_component = tpu_training_job(steps.train, tpu) if vertex else steps.train

    def resources(task: Any, step: str) -> Any:
        if target == "vertex":
            cpu, memory = CPU_RESOURCES[step]
            task.set_cpu_limit(cpu).set_memory_limit(memory)
        return task

    @dsl.pipeline(name=PIPELINE_NAME, description="Pre-train a RoBERTa-style masked language model from scratch.")
    def pretraining(
        corpus: str = "embedded",
        validation_corpus: str = "",
        holdout_fraction: float = 0.05,
        text_column: str = "text",
        limit: int = 0,
        vocab_size: int = 25_000,
        lowercase: bool = False,
        tokenizer_sample_bytes: int = DEFAULT_SAMPLE_BYTES,
        max_length: int = 128,
        records_per_shard: int = 10_000,
        num_parts: int = 1,
        model_config: str = "roberta-base",
        per_replica_batch_size: int = 256,
        num_epochs: int = 1,
        max_steps: int = 0,
        learning_rate: float = 1e-4,
        warmup_fraction: float = 0.05,
        weight_decay: float = 1e-3,
        mlm_probability: float = 0.15,
        bf16: bool = vertex,
        steps_per_execution: int = 50,
        shuffle_buffer: int = 10_000,
        seed: int = 42,
        checkpoint_every_steps: int = 1_000,
        log_every_steps: int = 100,
        accelerator: str = "tpu" if vertex else "auto",
        replicas: int = tpu.replicas if vertex else 0,
        eval_batch_size: int = 64,
        tpu_price_per_hour: float = 0.0,
        hub_repo_id: str = "",
        hub_private: bool = False,
        hf_token_secret: str = "",
        output_root: str = "",
        checkpoint_dir: str = "",
    ):
        tokenizer = resources(
            steps.tokenizer(
                corpus=corpus,
                vocab_size=vocab_size,
                text_column=text_column,
                limit=limit,
                lowercase=lowercase,
                sample_bytes=tokenizer_sample_bytes,
                hf_token_secret=hf_token_secret,
                output_root=output_root,
            ),
            "tokenizer",
        ).set_display_name("tokenizer")
        common = {
            "corpus": corpus,
            "validation_corpus": validation_corpus,
            "holdout_fraction": holdout_fraction,
            "text_column": text_column,
            "limit": limit,
            "max_length": max_length,
            "records_per_shard": records_per_shard,
            "hf_token_secret": hf_token_secret,
            "output_root": output_root,
            "tokenizer": tokenizer.outputs["tokenizer"],
        }
        validation = resources(steps.shards(split="validation", num_parts=1, part=0, **common), "shards")
        validation.set_display_name("validation shards")
        parts = steps.part_indices(num_parts=num_parts).set_display_name("plan parts")
        with dsl.ParallelFor(items=parts.output, name="train-parts") as part:
            train_part = resources(steps.shards(split="train", num_parts=num_parts, part=part, **common), "shards")
            train_part.set_display_name("train shards part")
        train_shards = steps.merge_shards(output_root=output_root, parts=dsl.Collected(train_part.outputs["shards"]))
        train_shards.set_display_name("merge train shards")
        training = {  # what preflight checks is what training gets
            "model_config": model_config,
            "per_replica_batch_size": per_replica_batch_size,
            "num_epochs": num_epochs,
            "max_steps": max_steps,
            "learning_rate": learning_rate,
            "warmup_fraction": warmup_fraction,
            "weight_decay": weight_decay,
            "mlm_probability": mlm_probability,
            "bf16": bf16,
            "steps_per_execution": steps_per_execution,
            "shuffle_buffer": shuffle_buffer,
            "seed": seed,
            "checkpoint_every_steps": checkpoint_every_steps,
            "log_every_steps": log_every_steps,
            "accelerator": accelerator,
            "replicas": replicas,
            "price_per_hour": tpu_price_per_hour,
            "checkpoint_dir": checkpoint_dir,
            "output_root": output_root,
            "tokenizer": tokenizer.outputs["tokenizer"],
            "train_shards": train_shards.outputs["shards"],
            "eval_shards": validation.outputs["shards"],
        }
        checked = resources(
            steps.preflight(
                tpu_type=tpu.name if vertex else "",
                hub_repo_id=hub_repo_id,
                hf_token_secret=hf_token_secret,
                **training,
            ),
            "preflight",
        ).set_display_name("preflight")
        checked.set_caching_options(False)  # the token and the storage are checked anew on every run
        # the TPU's peak for MFU, known here whatever the TPU VM's environment says
        trained = train_component(peak_tflops=tpu.peak_tflops_per_replica if vertex else 0.0, **training)
        trained.set_display_name("train")
        trained.after(checked)
        trained.set_caching_options(False)
        evaluation = resources(
            steps.evaluate(
                mlm_probability=mlm_probability,
                seed=0,
                batch_size=eval_batch_size,
                output_root=output_root,
                model=trained.outputs["model"],
                shards=validation.outputs["shards"],
            ),
            "evaluate",
        ).set_display_name("evaluate")
        resources(
            steps.report(model=trained.outputs["model"], evaluation=evaluation.outputs["evaluation"]), "report"
        ).set_display_name("run report")
        with dsl.If(hub_repo_id != "", name="push-requested"):
            pushed = resources(
                steps.push(
                    repo_id=hub_repo_id,
                    private=hub_private,
                    hf_token_secret=hf_token_secret,
                    model=trained.outputs["model"],
                    evaluation=evaluation.outputs["evaluation"],
                ),
                "push",
            ).set_display_name("push to the Hub")
            pushed.set_caching_options(False)

    return pretraining


def compile_pipeline(path: str, **kwargs: Any) -> str:
    compiler.Compiler().compile(build_pipeline(**kwargs), package_path=path)
    return path
