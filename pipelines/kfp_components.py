"""The pipeline's component functions, one a step, written by ``make components`` from the steps'
arguments dataclasses (``pipelines.component_source``); ``tests/test_parameters.py`` fails when this
file differs from what the dataclasses give. Do not edit by hand."""

from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, HTML, Input, Markdown, Metrics, Model, Output


def tokenizer_step(
    tokenizer: Output[Artifact],
    output_root: str = '',
    init_from: str = '',
    hf_token_secret: str = '',
    corpus: str = 'embedded',
    text_column: str = 'text',
    limit: int = 0,
    max_non_utf8_fraction: float = 0.001,
    vocab_size: int = 25000,
    lowercase: bool = False,
    sample_bytes: int = 2000000000,
):
    """The tokenizer step: components.tokenizer.

    Args:
        init_from: Continue pre-training this model instead of starting from scratch: hf:NAME[@REVISION] (a public Hub model; a private or gated one only for a run on this machine, through HF_TOKEN) or a model folder (local or gs://) with TensorFlow weights (tf_model.h5) or PyTorch's (model.safetensors), and a fast tokenizer. Its tokenizer is used as it is (the tokenizer step trains none) and its config replaces model_config. Empty: from scratch.
        hf_token_secret: Secret Manager secret holding the Hub token (projects/P/secrets/NAME); else HF_TOKEN.
        corpus: 'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated .txt/.jsonl/.parquet paths or globs (local or gs://); .txt and .jsonl also as .gz, .zst, .bz2 or .xz.
        text_column: Column holding the text (Hub, JSON lines, Parquet).
        limit: Read at most this many texts; 0: all. With parts, per part: N parts read up to N x limit.
        max_non_utf8_fraction: Refuse a corpus file when more than this share of its bytes are not UTF-8; fewer are replaced with U+FFFD and counted (a warning, and non_utf8_bytes in the manifest).
        vocab_size: Target vocabulary size, special tokens included (with init_from: the base's own).
        lowercase: Lowercase all text before training (with init_from: as the base's tokenizer does).
        sample_bytes: Train on about this many bytes of text, spread evenly over the whole corpus and the same in every run (0: all of it). The Unigram trainer holds its input in memory: about 10 bytes a byte of sample at worst (measured in docs/benchmarks.md).
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_tokenizer

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_tokenizer(**values)



def shards_step(
    tokenizer: Input[Artifact],
    shards: Output[Dataset],
    output_root: str = '',
    validation_corpus: str = '',
    hf_token_secret: str = '',
    corpus: str = 'embedded',
    text_column: str = 'text',
    limit: int = 0,
    max_non_utf8_fraction: float = 0.001,
    max_length: int = 128,
    split: str = 'train',
    records_per_shard: int = 10000,
    num_parts: int = 1,
    part: int = 0,
    holdout_fraction: float = 0.0,
    batch_size: int = 1000,
    overwrite: bool = False,
):
    """The shards step: components.shards.

    Args:
        tokenizer: Tokenizer folder made by components.tokenizer (local or gs://).
        hf_token_secret: Secret Manager secret holding the Hub token (projects/P/secrets/NAME); else HF_TOKEN.
        corpus: 'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or comma-separated .txt/.jsonl/.parquet paths or globs (local or gs://); .txt and .jsonl also as .gz, .zst, .bz2 or .xz.
        text_column: Column holding the text (Hub, JSON lines, Parquet).
        limit: Read at most this many texts; 0: all. With parts, per part: N parts read up to N x limit.
        max_non_utf8_fraction: Refuse a corpus file when more than this share of its bytes are not UTF-8; fewer are replaced with U+FFFD and counted (a warning, and non_utf8_bytes in the manifest).
        max_length: Tokens per sample, from 8 to 8192 (the reference recipe's 128); a model continued (init_from) takes at most its positions (roberta-base's: 512).
        split: Name of the split written (letters, digits, _).
        records_per_shard: Samples per TFRecord file.
        num_parts: Number of parts the corpus is split into.
        part: Which part this run writes (0 .. num_parts-1).
        holdout_fraction: Fraction of texts held out (chosen by content hash), for a corpus without a validation split. 0 keeps every text.
        batch_size: Texts tokenized per batch.
        overwrite: Replace a complete shard set made with other settings.
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_shards

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_shards(**values)



def preflight_step(
    tokenizer: Input[Artifact],
    train_shards: Input[Dataset],
    eval_shards: Input[Dataset],
    report: Output[Artifact],
    output_root: str = '',
    tasks: str = 'word-order',
    text_columns: str = 'text',
    label_column: str = 'label',
    hf_token_secret: str = '',
    init_from: str = '',
    model_config: str = 'roberta-base',
    per_replica_batch_size: int = 0,
    gradient_accumulation_steps: int = 0,
    num_epochs: int = 1,
    max_steps: int = 0,
    recipe: str = '',
    mlm_probability: float = -1.0,
    final_mlm_probability: float = -1.0,
    batch_warmup_fraction: float = -1.0,
    learning_rate: float = -1.0,
    adam_beta2: float = -1.0,
    adam_epsilon: float = -1.0,
    clip_norm: float = -1.0,
    warmup_fraction: float = -1.0,
    warmup_steps: int = -1,
    lr_schedule: str = '',
    decay_fraction: float = -1.0,
    weight_decay: float = -1.0,
    dropout: float = -1.0,
    bf16: bool = False,
    steps_per_execution: int = 50,
    xla: str = 'auto',
    shuffle_buffer: int = 10000,
    seed: int = 42,
    checkpoint_every_steps: int = 1000,
    log_every_steps: int = 100,
    eval_batches: int = 20,
    on_divergence: str = 'stop',
    max_rewinds: int = 3,
    rehearse_restart: bool = False,
    accelerator: str = 'auto',
    replicas: int = 0,
    tpu: str = 'local',
    peak_tflops: float = 0.0,
    price_per_hour: float = 0.0,
    hub_repo_id: str = '',
    hub_private: bool = True,
    checkpoint_dir: str = '',
    tpu_type: str = '',
    tpu_job_timeout_hours: float = 0.0,
    tpu_max_queued_hours: float = 24.0,
    vertex_tensorboard: str = '',
    tpu_provisioning: str = 'STANDARD',
    allow_tight_memory: bool = False,
) -> NamedTuple('TpuJob', [('timeout', str), ('max_wait_duration', str)]):
    """The preflight step: components.preflight.

    Args:
        tokenizer: Tokenizer folder (local or gs://).
        train_shards: Training shard folder with manifest.json.
        eval_shards: Validation shards: loss logged at each checkpoint.
        tasks: The downstream probe's tasks, comma-separated: word-order (built in, no network: windows of words from Python's docstrings, which the embedded corpus does not hold, as written or reversed), hf:NAME[:CONFIG[:SPLIT]] (scored on SPLIT, validation by default; GLUE's by their conventions: hf:nyu-mll/glue:sst2, ...), or folders (local or gs://) of train and validation .jsonl/.csv/.parquet files.
        text_columns: Text column, or two comma-separated for sentence pairs, of tasks that are not GLUE's (text, as the corpus's).
        label_column: Label column of tasks that are not GLUE's.
        hf_token_secret: Secret Manager secret holding the Hub token (projects/P/secrets/NAME); else HF_TOKEN.
        init_from: Continue pre-training this model instead of starting from scratch: hf:NAME[@REVISION] (a public Hub model; a private or gated one only for a run on this machine, through HF_TOKEN) or a model folder (local or gs://) with TensorFlow weights (tf_model.h5) or PyTorch's (model.safetensors), and a fast tokenizer. Its tokenizer is used as it is (the tokenizer step trains none) and its config replaces model_config. Empty: from scratch.
        model_config: Preset ['mini', 'roberta-base', 'roberta-large', 'tiny'], a config.json path/URI, or a Hub model name (a config only: its weights are init_from's); ignored with init_from, whose config the model keeps (but by submit --dry_run and the smoke test, which size the run by it: give the base's).
        per_replica_batch_size: Samples per replica and micro-batch: what must fit a replica's memory. 0: the accelerator's (128 on a TPU, less on a slice of more than 16 replicas; 8 elsewhere).
        gradient_accumulation_steps: Micro-batches summed into each optimizer step: the global batch is per_replica_batch_size x replicas x this. The global batch is the hyperparameter; the micro-batch is a memory setting. 0: the accelerator's (on a TPU as many as make the recipe's global batch of 2048 at the TPU's micro-batch, whatever micro-batch is given: 2 on a v3-8, 16 on a v5e-1; 1 elsewhere).
        num_epochs: Passes over the training shards.
        max_steps: Total optimizer steps; overrides num_epochs when > 0.
        recipe: The recipe whose values the knobs left at -1 take, one of ['dapt-2020', 'hf-2023', 'roberta-2019', 'roberta-2019-mask-decay', 'roberta-2019-mask-decay-clip']; empty: roberta-2019-mask-decay-clip from scratch, dapt-2020 with init_from. hf-2023 is the 2023 reference run's, roberta-2019 fairseq's RoBERTa, dapt-2020 Don't Stop Pretraining's (docs/recipes.md).
        mlm_probability: Share of tokens masked in training (at the start); -1: the recipe's.
        final_mlm_probability: The masking share at the end, reached linearly from mlm_probability; 0: constant; -1: the recipe's. Validation masks a fixed share (0.15) whatever this is.
        batch_warmup_fraction: Share of the steps over which the global batch grows to its full size: those steps sum fewer micro-batches (1, 2, 4, ... below gradient_accumulation_steps, an equal share each), at a learning rate scaled by the square root of their batch over the full one; needs gradient_accumulation_steps above 1. 0: none; -1: the recipe's.
        learning_rate: Peak learning rate; -1: the recipe's.
        adam_beta2: Adam's beta2; -1: the recipe's.
        adam_epsilon: Adam's epsilon; -1: the recipe's.
        clip_norm: Clip each optimizer step's gradient (summed over micro-batches and replicas) to this global norm; 0: no clipping; -1: the recipe's.
        warmup_fraction: Share of the steps of linear warmup; -1: the recipe's.
        warmup_steps: Steps of linear warmup, above 0 instead of warmup_fraction (0: use warmup_fraction, which is 0 for no warmup); -1: the recipe's.
        lr_schedule: linear: warmup then linear decay to 0; wsd: warmup, stable, then linear decay to 0 over the last decay_fraction of the steps; empty: the recipe's.
        decay_fraction: wsd: share of the steps of the final decay; -1: the recipe's.
        weight_decay: Decoupled weight decay rate; -1: the recipe's.
        dropout: Hidden and attention dropout while pre-training (0: none); the saved model keeps its config's for fine-tuning. -1: the recipe's, which for every recipe here is the model config's (roberta-base: 0.1).
        bf16: Mixed bfloat16 precision (TPUs, recent GPUs).
        steps_per_execution: Steps run per call into the graph.
        xla: XLA-compile the replica step on GPU/CPU: on, off, auto (off). Never nested on a TPU, which compiles the whole step anyway.
        shuffle_buffer: Samples in the shuffle buffer.
        seed: Seed of initialization, shuffling and masking.
        checkpoint_every_steps: Steps between checkpoints.
        log_every_steps: Steps between log lines and TensorBoard points.
        eval_batches: Validation batches at each checkpoint.
        on_divergence: When the loss or the gradient norm is not finite (checked at every call into the graph, at least every log point): stop (exit 4, nothing written from those weights), or rewind to the last checkpoint, skip the batches that followed it and go on, lowering nothing, at most max_rewinds times.
        max_rewinds: With on_divergence rewind: the most rewinds in a run before it stops.
        rehearse_restart: Once, at the first checkpoint of a training that starts from nothing, exit as a preempted job does, so that Vertex AI's restart resumes from that checkpoint: what a first run proves before a long run meets its first preemption. Only inside the TPU job the pipeline's launcher created (where Vertex AI restarts the worker); nothing elsewhere.
        accelerator: auto, tpu, gpu or cpu; tpu and gpu fail when absent rather than train on the host's CPU.
        replicas: Replicas: 0 for every device of the accelerator. A TPU or the GPUs found must have exactly this many; on the CPU, N > 1 splits it into N logical devices (rehearse a v3-8 with 8).
        tpu: TPU name for TPUClusterResolver ('local' on TPU VMs).
        peak_tflops: Peak TFLOP/s of one replica, for MFU where it is not known (0: look it up).
        price_per_hour: Price of the accelerator per hour (Vertex AI pricing, your region): the log lines show the cost so far and projected.
        hub_repo_id: Push each checkpoint to this Hub repository (HF_TOKEN); off when empty.
        hub_private: Create the checkpoint repository as private (--no_hub_private: public).
        checkpoint_dir: A fixed folder for the checkpoints: a rerun resumes from them instead of training again. Default: $AIP_CHECKPOINT_DIR, else the model folder's checkpoints/.
        tpu_type: The TPU the train step will get, ['v3-8', 'v5e-1', 'v5e-4', 'v5e-8', 'v5e-16', 'v5e-32']: its replicas and memory.
        tpu_job_timeout_hours: Hard limit of the TPU training job, in hours; 0: twice the estimated training time plus an hour (at least 2 h, at most 168 h). A limit below the estimate is refused.
        tpu_max_queued_hours: How long the TPU job may wait queued or pending (no capacity, no quota) before it is cancelled and the train task fails, in hours (Spot capacity can take longer).
        vertex_tensorboard: A Vertex AI TensorBoard instance (projects/P/locations/REGION/tensorboards/ID) the TPU job streams its training logs to; its service account then needs roles/storage.admin and roles/aiplatform.user (Vertex AI's requirement). Empty: the logs only in ROOT/tensorboard/RUN.
        tpu_provisioning: How Vertex AI gets the TPU (the custom job's scheduling strategy): STANDARD (on demand), SPOT (about a quarter of the price; preempted with 30 s notice, the train step then checkpoints and its job is run again).
        allow_tight_memory: Start a run whose memory estimate is tight (its high end above the TPU's memory) instead of refusing it: XLA may fit it, or the job may die of out-of-memory at compile.
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_preflight

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_preflight(**values)



def train_step(
    tokenizer: Input[Artifact],
    train_shards: Input[Dataset],
    eval_shards: Input[Dataset],
    model: Output[Model],
    output_root: str = '',
    pipeline_root: str = '',
    run_name: str = '',
    tpu_type: str = '',
    tpu_provisioning: str = 'STANDARD',
    init_from: str = '',
    model_config: str = 'roberta-base',
    per_replica_batch_size: int = 0,
    gradient_accumulation_steps: int = 0,
    num_epochs: int = 1,
    max_steps: int = 0,
    recipe: str = '',
    mlm_probability: float = -1.0,
    final_mlm_probability: float = -1.0,
    batch_warmup_fraction: float = -1.0,
    learning_rate: float = -1.0,
    adam_beta2: float = -1.0,
    adam_epsilon: float = -1.0,
    clip_norm: float = -1.0,
    warmup_fraction: float = -1.0,
    warmup_steps: int = -1,
    lr_schedule: str = '',
    decay_fraction: float = -1.0,
    weight_decay: float = -1.0,
    dropout: float = -1.0,
    bf16: bool = False,
    steps_per_execution: int = 50,
    xla: str = 'auto',
    shuffle_buffer: int = 10000,
    seed: int = 42,
    checkpoint_every_steps: int = 1000,
    log_every_steps: int = 100,
    eval_batches: int = 20,
    on_divergence: str = 'stop',
    max_rewinds: int = 3,
    rehearse_restart: bool = False,
    accelerator: str = 'auto',
    replicas: int = 0,
    tpu: str = 'local',
    peak_tflops: float = 0.0,
    price_per_hour: float = 0.0,
    hub_repo_id: str = '',
    hub_private: bool = True,
    checkpoint_dir: str = '',
    tensorboard_dir: str = '',
    start_minutes: float = 20.0,
    lease_seconds: float = 300.0,
):
    """The train step: components.train.

    Args:
        tokenizer: Tokenizer folder (local or gs://).
        train_shards: Training shard folder with manifest.json.
        eval_shards: Validation shards: loss logged at each checkpoint.
        init_from: Continue pre-training this model instead of starting from scratch: hf:NAME[@REVISION] (a public Hub model; a private or gated one only for a run on this machine, through HF_TOKEN) or a model folder (local or gs://) with TensorFlow weights (tf_model.h5) or PyTorch's (model.safetensors), and a fast tokenizer. Its tokenizer is used as it is (the tokenizer step trains none) and its config replaces model_config. Empty: from scratch.
        model_config: Preset ['mini', 'roberta-base', 'roberta-large', 'tiny'], a config.json path/URI, or a Hub model name (a config only: its weights are init_from's); ignored with init_from, whose config the model keeps (but by submit --dry_run and the smoke test, which size the run by it: give the base's).
        per_replica_batch_size: Samples per replica and micro-batch: what must fit a replica's memory. 0: the accelerator's (128 on a TPU, less on a slice of more than 16 replicas; 8 elsewhere).
        gradient_accumulation_steps: Micro-batches summed into each optimizer step: the global batch is per_replica_batch_size x replicas x this. The global batch is the hyperparameter; the micro-batch is a memory setting. 0: the accelerator's (on a TPU as many as make the recipe's global batch of 2048 at the TPU's micro-batch, whatever micro-batch is given: 2 on a v3-8, 16 on a v5e-1; 1 elsewhere).
        num_epochs: Passes over the training shards.
        max_steps: Total optimizer steps; overrides num_epochs when > 0.
        recipe: The recipe whose values the knobs left at -1 take, one of ['dapt-2020', 'hf-2023', 'roberta-2019', 'roberta-2019-mask-decay', 'roberta-2019-mask-decay-clip']; empty: roberta-2019-mask-decay-clip from scratch, dapt-2020 with init_from. hf-2023 is the 2023 reference run's, roberta-2019 fairseq's RoBERTa, dapt-2020 Don't Stop Pretraining's (docs/recipes.md).
        mlm_probability: Share of tokens masked in training (at the start); -1: the recipe's.
        final_mlm_probability: The masking share at the end, reached linearly from mlm_probability; 0: constant; -1: the recipe's. Validation masks a fixed share (0.15) whatever this is.
        batch_warmup_fraction: Share of the steps over which the global batch grows to its full size: those steps sum fewer micro-batches (1, 2, 4, ... below gradient_accumulation_steps, an equal share each), at a learning rate scaled by the square root of their batch over the full one; needs gradient_accumulation_steps above 1. 0: none; -1: the recipe's.
        learning_rate: Peak learning rate; -1: the recipe's.
        adam_beta2: Adam's beta2; -1: the recipe's.
        adam_epsilon: Adam's epsilon; -1: the recipe's.
        clip_norm: Clip each optimizer step's gradient (summed over micro-batches and replicas) to this global norm; 0: no clipping; -1: the recipe's.
        warmup_fraction: Share of the steps of linear warmup; -1: the recipe's.
        warmup_steps: Steps of linear warmup, above 0 instead of warmup_fraction (0: use warmup_fraction, which is 0 for no warmup); -1: the recipe's.
        lr_schedule: linear: warmup then linear decay to 0; wsd: warmup, stable, then linear decay to 0 over the last decay_fraction of the steps; empty: the recipe's.
        decay_fraction: wsd: share of the steps of the final decay; -1: the recipe's.
        weight_decay: Decoupled weight decay rate; -1: the recipe's.
        dropout: Hidden and attention dropout while pre-training (0: none); the saved model keeps its config's for fine-tuning. -1: the recipe's, which for every recipe here is the model config's (roberta-base: 0.1).
        bf16: Mixed bfloat16 precision (TPUs, recent GPUs).
        steps_per_execution: Steps run per call into the graph.
        xla: XLA-compile the replica step on GPU/CPU: on, off, auto (off). Never nested on a TPU, which compiles the whole step anyway.
        shuffle_buffer: Samples in the shuffle buffer.
        seed: Seed of initialization, shuffling and masking.
        checkpoint_every_steps: Steps between checkpoints.
        log_every_steps: Steps between log lines and TensorBoard points.
        eval_batches: Validation batches at each checkpoint.
        on_divergence: When the loss or the gradient norm is not finite (checked at every call into the graph, at least every log point): stop (exit 4, nothing written from those weights), or rewind to the last checkpoint, skip the batches that followed it and go on, lowering nothing, at most max_rewinds times.
        max_rewinds: With on_divergence rewind: the most rewinds in a run before it stops.
        rehearse_restart: Once, at the first checkpoint of a training that starts from nothing, exit as a preempted job does, so that Vertex AI's restart resumes from that checkpoint: what a first run proves before a long run meets its first preemption. Only inside the TPU job the pipeline's launcher created (where Vertex AI restarts the worker); nothing elsewhere.
        accelerator: auto, tpu, gpu or cpu; tpu and gpu fail when absent rather than train on the host's CPU.
        replicas: Replicas: 0 for every device of the accelerator. A TPU or the GPUs found must have exactly this many; on the CPU, N > 1 splits it into N logical devices (rehearse a v3-8 with 8).
        tpu: TPU name for TPUClusterResolver ('local' on TPU VMs).
        peak_tflops: Peak TFLOP/s of one replica, for MFU where it is not known (0: look it up).
        price_per_hour: Price of the accelerator per hour (Vertex AI pricing, your region): the log lines show the cost so far and projected.
        hub_repo_id: Push each checkpoint to this Hub repository (HF_TOKEN); off when empty.
        hub_private: Create the checkpoint repository as private (--no_hub_private: public).
        checkpoint_dir: A fixed folder for the checkpoints: a rerun resumes from them instead of training again. Default: $AIP_CHECKPOINT_DIR, else the model folder's checkpoints/.
        tensorboard_dir: Defaults to $AIP_TENSORBOARD_LOG_DIR or OUTPUT/logs.
        start_minutes: The accelerator must be ready (the TPU initialised) within this many minutes: a start that hangs is a failed attempt, not a wait until the job's timeout that every restart and retry would pay again.
        lease_seconds: One training per checkpoint folder: the step holds its lease (lease.json there), renewed 5 times within this many seconds; a lease not renewed for this long is a dead training's. A start that finds another training's lease waits up to this long: renewed, it is refused; not, it takes the lease over.
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_train

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_train(**values)



def evaluate_step(
    model: Input[Model],
    shards: Input[Dataset],
    train_shards: Input[Dataset],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    output_root: str = '',
    batch_size: int = 64,
    max_batches: int = 150,
    eval_mlm_probability: float = 0.15,
    seed: int = 0,
    fill_mask: str = 'The history of the <mask> begins in the early twentieth century. | The function returns a <mask> of values. | In 1990 the band released their first <mask>.',
    top_k: int = 5,
    accelerator: str = 'auto',
    replicas: int = 0,
):
    """The evaluate step: components.evaluate.

    Args:
        model: Model folder from components.train (local or gs://).
        shards: Shard folder with manifest.json to evaluate on.
        train_shards: The training shards: their token counts give the unigram baseline.
        batch_size: Samples per evaluation batch.
        max_batches: Evaluate at most this many batches (the first ones, the same in every run, read 16 files at a time from across the shard set); 0: all. The default scores 9,600 samples: minutes for roberta-base on 8 vCPUs. The loss's standard error is reported, over these samples as if drawn independently from the set: neighbouring samples of one document are not, and a file's first samples stand for it, so the loss of the whole set is less certain than it says.
        eval_mlm_probability: Share of tokens masked; keep the default to compare runs (whatever their training masked).
        seed: Masking seed; keep it fixed to compare runs and models.
        fill_mask: Sentences for fill-mask examples, separated by ' | ', each with <mask>.
        top_k: Predictions shown per fill-mask sentence.
        accelerator: auto, tpu, gpu or cpu, as for training.
        replicas: Replicas, as for training (0: all devices; CPU: 1).
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_evaluate

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_evaluate(**values)



def downstream_step(
    model: Input[Model],
    downstream_results: Output[Artifact],
    metrics: Output[Metrics],
    report: Output[Markdown],
    output_root: str = '',
    tasks: str = 'word-order',
    text_columns: str = 'text',
    label_column: str = 'label',
    hf_token_secret: str = '',
    epochs: int = 3,
    min_steps: int = 100,
    max_steps: int = 0,
    max_train_samples: int = 0,
    max_eval_samples: int = 0,
    batch_size: int = 32,
    learning_rates: str = '2e-5,1e-4,1e-3',
    random_init_learning_rates: str = '',
    dev_fraction: float = 0.2,
    warmup_fraction: float = 0.06,
    weight_decay: float = 0.1,
    max_length: int = 0,
    seeds: str = '1',
):
    """The downstream step: components.downstream.

    Args:
        model: Model folder from components.train (local or gs://).
        tasks: The downstream probe's tasks, comma-separated: word-order (built in, no network: windows of words from Python's docstrings, which the embedded corpus does not hold, as written or reversed), hf:NAME[:CONFIG[:SPLIT]] (scored on SPLIT, validation by default; GLUE's by their conventions: hf:nyu-mll/glue:sst2, ...), or folders (local or gs://) of train and validation .jsonl/.csv/.parquet files.
        text_columns: Text column, or two comma-separated for sentence pairs, of tasks that are not GLUE's (text, as the corpus's).
        label_column: Label column of tasks that are not GLUE's.
        hf_token_secret: Secret Manager secret holding the Hub token (projects/P/secrets/NAME); else HF_TOKEN.
        epochs: Passes over each task's training split.
        min_steps: Optimizer steps per task and seed at least, however few epochs that is.
        max_steps: Optimizer steps per task and seed; overrides epochs if > 0.
        max_train_samples: Fine-tune on at most this many samples; 0: all.
        max_eval_samples: Score at most this many samples; 0: all.
        batch_size: Samples per fine-tuning step.
        learning_rates: Peak learning rates of fine-tuning, comma-separated: each model's is the one of them that scores best on a development split carved from the task's training split, never on the scored split (roberta-base learns at 1e-5 to 3e-5, a small model at about 1e-3).
        random_init_learning_rates: The random twin's rates to choose from; empty: learning_rates. A model trained from scratch often wants a higher rate than a pre-trained one: a rate too low for it overstates the gain.
        dev_fraction: Share of each task's training split set aside as the development split the rates are chosen on (none with one rate each).
        warmup_fraction: Share of the steps of linear warmup.
        weight_decay: Decoupled weight decay (RoBERTa's GLUE runs: 0.1).
        max_length: Tokens per sample; 0: the length the model trained at.
        seeds: Comma-separated seeds; each model fine-tunes once a seed.
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_downstream

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_downstream(**values)



def push_step(
    model: Input[Model],
    evaluation: Input[Artifact],
    downstream_results: Input[Artifact],
    repo_id: str,
    hf_token_secret: str = '',
    private: bool = True,
    license: str = '',
    commit_message: str = 'Upload masked language model pre-trained with tpu-mlm-pipeline',
    retries: int = 4,
) -> str:
    """The push step: components.push.

    Args:
        model: Model folder from components.train (local or gs://).
        evaluation: Folder with metrics.json from components.evaluate.
        hf_token_secret: Secret Manager secret holding the Hub token (projects/P/secrets/NAME); else HF_TOKEN.
        repo_id: Hub repository 'namespace/name'.
        private: Create the repository as private (--no_private: public; an existing one keeps its visibility).
        license: The model card's license, a Hub license id (apache-2.0, mit, cc-by-4.0, other, ...); if empty, none stated (a model continued with init_from: its base card's).
        retries: Tries again after transient Hub errors (1, 2, 4 ... s apart).
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_push

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_push(**values)



def report_step(
    model: Input[Model],
    evaluation: Input[Artifact],
    downstream_results: Input[Artifact],
    report: Output[HTML],
):
    """The report step: components.report.

    Args:
        model: Model folder from components.train.
        evaluation: Folder with metrics.json from components.evaluate.
    """
    values = dict(locals())
    from components.lib.job_runner import job_exit_status
    from pipelines.runners import run_report

    with job_exit_status(values.values()):  # status 2 and one line for bad input, as the job's command
        return run_report(**values)
