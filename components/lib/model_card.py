"""The model card a pushed model's repository gets as its README.md: the metadata Hub users filter by, what was
trained on what and how, the evaluation, and how to use the model, transformers 5 (PyTorch) first.

The usage section's code blocks run as they are (the tests run each in its environment against a Hub stand-in).
"""

from __future__ import annotations

import re
from typing import Any

from components.lib.base_model import hub_name
from components.lib.corpus import HUB_PREFIX, parse_hub_name
from components.lib.errors import redact
from components.lib.recipe import KNOBS, MODEL_DROPOUT
from components.lib.results import BASE_MODEL, downstream_table, loss_summary, metrics_table

USAGE_HEADING = "## How to use"


def model_card(
    repo_id: str,
    summary: dict[str, Any],
    config: dict[str, Any],
    metrics: dict | None,
    license_id: str = "",
    probe: dict | None = None,
    base_license: dict[str, str] | None = None,
) -> str:
    """The repository's README.md: metadata the Hub filters by, what was trained on what, how, with which
    results, and how to use it: transformers 5 (PyTorch) first, then TF with the transformers 4.57 it needs.
    ``base_license``: a continued model's base's (``base_model.base_license``), the card's where ``license_id``
    is not given."""
    from huggingface_hub import ModelCardData

    summary, probe = public_summary(summary), public_probe(probe)  # what the card shows is published
    train_arguments = summary["arguments"]
    hyperparameters = {
        key: train_arguments[key] for key in CARD_HYPERPARAMETERS if key in train_arguments
    }  # older runs had fewer
    init_from = train_arguments.get("init_from", "")  # published: a Hub name, or a folder's last name
    if init_from:  # the base model's config is the model's: model_config was not used
        del hyperparameters["model_config"]
        hyperparameters = {"init_from": init_from, **hyperparameters}
    else:
        hyperparameters["model_config"] = public_name(hyperparameters["model_config"])
    if "dropout" in hyperparameters:  # config.json holds the config's, for fine-tuning, whatever pre-training had
        own = config.get("hidden_dropout_prob")
        pretraining = hyperparameters["dropout"]
        hyperparameters["dropout"] = (
            f"the config's ({own})"
            if pretraining == MODEL_DROPOUT
            else f"{pretraining} while pre-training (config.json: {own}, for fine-tuning)"
        )
    hyperparameters.update(global_batch_size=summary["global_batch_size"], total_steps=summary["total_steps"])
    source = summary["corpus"]["source"]
    base_license = base_license or {}
    terms = {"license": license_id} if license_id else base_license
    metadata = ModelCardData(
        library_name="transformers",
        pipeline_tag="fill-mask",
        license=terms.get("license"),
        license_name=terms.get("license_name"),
        license_link=terms.get("license_link"),
        datasets=[hub_dataset_name(source)] if source.startswith(HUB_PREFIX) else None,
        tags=[
            config.get("model_type", "roberta"),
            "masked-language-modeling",
            "safetensors",
            "pytorch",
            "tensorflow",
            "tpu-mlm-pipeline",
        ],
        model_name=repo_id.split("/")[-1],
        eval_results=probe_results(probe, repo_id),
        base_model=hub_name(init_from)[0] if init_from.startswith(HUB_PREFIX) else None,  # the Hub's family tree
    )
    base = f"`{init_from}`" if init_from != LEFT_OUT else "a model folder (its place left out)"
    if "@" in summary.get("base_model", ""):  # the commit a Hub revision was pinned to
        base += f" at commit `{summary['base_model'].rpartition('@')[2]}`"
    origin = (
        f"continued from the weights of {base} (domain-adaptive pre-training, with its tokenizer)"
        if init_from
        else "pre-trained from scratch"
    )
    lines = [
        "---",
        metadata.to_yaml(),
        "---",
        "",
        f"# {repo_id.split('/')[-1]}",
        "",
        f"A {config.get('model_type', 'roberta')} masked language model {origin} with tpu-mlm-pipeline "
        "(Kubeflow Pipelines on Vertex AI, TensorFlow on TPUs). The repository holds the weights "
        "twice: `model.safetensors` for PyTorch (transformers 5, sentence-transformers, ONNX exporters) and "
        "`tf_model.h5` for TensorFlow; they are the same float32 numbers.",
        "",
        "## Model",
        "",
        f"- hidden size {config['hidden_size']}, {config['num_hidden_layers']} layers, "
        f"{config['num_attention_heads']} attention heads, intermediate size {config['intermediate_size']}",
        f"- {summary['num_parameters']:,} parameters, vocabulary of {config['vocab_size']:,} "
        + ("tokens (the base model's tokenizer)" if init_from else "Unigram pieces"),
        f"- tokenizer fingerprint `{summary['tokenizer_fingerprint']}`",
        f"- license: {license_line(license_id, base_license)}",
        "",
        "## Training",
        "",
        f"- {summary['total_steps']:,} steps, {summary['samples']:,} samples, {summary['tokens']:,} tokens on "
        f"{summary['replicas']} {summary['accelerator'].upper()} replica(s)",
        f"- samples of {summary['tokens'] // summary['samples']} tokens: the tokenizer's `model_max_length`, the "
        "length the model was trained on (longer inputs meet position embeddings that training never used)",
        f"- training corpus: `{public_name(source)}`",
        f"- training loss: {loss_summary(summary)}",
        "",
        "| hyperparameter | value |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in hyperparameters.items()],
    ]
    if metrics:
        lines += ["", f"## Evaluation on `{metrics['split']}`", "", *metrics_table(metrics)]
    if probe:
        lines += ["", "## Downstream probe", ""]
        if not probe.get("failed"):
            note = PROBE_NOTE.format(seeds=probe["arguments"]["seeds"])
            lines += [note + (BASE_PROBE_NOTE if BASE_MODEL in probe["average"] else ""), ""]
        lines += downstream_table(probe)
    lines += ["", *usage_section(repo_id)]
    return "\n".join(lines) + "\n"


def license_line(license_id: str, base_license: dict[str, str]) -> str:
    """The license as the card states it: the one given, else the base model's, beside the base's where they differ
    (a model continued from another is bound by its terms too)."""
    base = base_license.get("license_name") or base_license.get("license", "")
    if not license_id and "unread" in base_license:
        return "not stated by the publisher (the base model's card could not be read at the push)"
    if not license_id:
        return f"{base} (the base model's, as its card states it)" if base else "not stated by the publisher"
    return license_id + (f"; the base model's card states {base}" if base and base != license_id else "")


PROBE_NOTE = (
    "Each task fine-tuned from this model and from a randomly initialised model of the same config, with the same "
    "short budget and seeds ({seeds}), scored on its validation split: what pre-training gained. A short probe's "
    "scores are not comparable with published full fine-tunings."
)
BASE_PROBE_NOTE = (
    " The base model this one continued from is fine-tuned the same way, as it was: the adaptation gain is what "
    "continuing its pre-training on this corpus gained."
)


# The Hub's metric ids (the `evaluate` library's names) for the probe's metrics that are named otherwise here
HUB_METRIC_IDS = {"mcc": "matthews_correlation"}


def probe_results(probe: dict | None, repo_id: str) -> list | None:
    """The probe's scores of the pre-trained model as the Hub's ``model-index`` results (the model page shows them):
    only tasks that are Hub datasets (the Hub's ``dataset.type`` is a dataset id; the built-in task and files go
    into the card's table alone), only scores with a signal, the split as scored (its samples when the probe
    scored fewer than the split holds are in ``dataset.args``), the probe named as their source; None when there is
    none of them (a failed or absent probe too)."""
    from huggingface_hub import EvalResult

    if not probe or probe.get("failed"):
        return None
    results = []
    seeds = len(str(probe["arguments"]["seeds"]).split(","))
    for task in probe["tasks"]:
        if not task["task"].startswith(HUB_PREFIX) or not task["pre-trained"].get("signal", True):
            continue
        dataset, config = parse_hub_name(task["task"])[:2]
        results.append(
            EvalResult(
                task_type="text-classification",
                dataset_type=dataset,
                dataset_name=" ".join([dataset.rsplit("/", 1)[-1], *([config] if config else [])]),
                dataset_config=config,
                dataset_split=task["validation_split"],
                dataset_args={"scored_samples": task["validation_samples"]},
                metric_type=HUB_METRIC_IDS.get(task["metric"], task["metric"]),
                metric_value=round(task["pre-trained"]["score"], 4),
                metric_name=f"{task['metric']} (short fine-tune, {seeds} seed(s))",
                source_name="tpu-mlm downstream probe of this model's run",
                source_url=f"https://huggingface.co/{repo_id}",
            )
        )
    return results or None  # an empty list would still write a model-index, of no results


CARD_HYPERPARAMETERS = (
    "model_config",
    "per_replica_batch_size",
    "gradient_accumulation_steps",
    "recipe",
    *KNOBS,
    "bf16",
    "seed",
)
# The card's code: each block runs as it is, in its own environment (the tests run them against a Hub stand-in).
PYTORCH_FILL_MASK = """from transformers import pipeline

fill = pipeline("fill-mask", model="{repo_id}")
print(fill("The history of the <mask> begins in the early twentieth century."))"""
PYTORCH_EMBEDDINGS = """import torch
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
model = AutoModel.from_pretrained("{repo_id}", add_pooling_layer=False)  # the encoder; MLM training has no pooler
batch = tokenizer(["A first sentence.", "And a second, longer one."], padding=True, return_tensors="pt")
with torch.no_grad():
    hidden = model(**batch).last_hidden_state
mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
embeddings = (hidden * mask).sum(dim=1) / mask.sum(dim=1)  # mean over the real tokens: one vector a sentence
print(embeddings.shape)"""
TF_FILL_MASK = """import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # transformers' TF models need Keras 2 (tf-keras)
from transformers import pipeline

# use_safetensors=False: model.safetensors holds the PyTorch weights, which transformers 4.57's TF loading cannot
# read; dtype=None: its default dtype is looked up on torch, which a TF-only setup lacks
fill = pipeline(
    "fill-mask", model="{repo_id}", framework="tf", dtype=None, model_kwargs={{"use_safetensors": False}}
)
print(fill("The history of the <mask> begins in the early twentieth century."))"""


def public_name(source: str) -> str:
    """What a card shows of a corpus or config: a Hub name as it is, of files (local or in a bucket) only their
    names, so that a published card names no folder or bucket (a folder: not even its own name)."""
    if source.startswith(HUB_PREFIX):
        return source

    def shown(part: str) -> str:
        name = part.rstrip("/").rsplit("/", 1)[-1]
        if not (part.startswith(("/", ".", "~", "gs://")) or "." in name or "*" in name):
            return part  # a Hub model name (namespace/name) stays whole
        return public_location(part)

    return ",".join(shown(part) for part in source.split(","))


LEFT_OUT = "(left out)"
# a location in free text (an error's line): a gs:// URI, or a path from the root or the home folder
LOCATION = re.compile(r"gs://[^\s'\"`,;()]*|(?<![\w:/.~-])~?/[^\s'\"`,;()]+")
# a Google Cloud resource's name: projects/NUMBER-OR-ID/...
RESOURCE = re.compile(r"\bprojects/[^\s'\"`,;()]+")


def public_location(location: str) -> str:
    """A file's own name (with its suffix: ``corpus-*.txt``, ``config.json``); a folder, ``LEFT_OUT``."""
    name = location.rstrip("/").rsplit("/", 1)[-1]
    return name if "." in name.lstrip(".") or "*" in name else LEFT_OUT


def public_text(text: str) -> str:
    """Free text (an error's line) as published: no location but a file's name, no resource name, no credential."""
    text = RESOURCE.sub("projects/" + LEFT_OUT, redact(text))
    return LOCATION.sub(lambda match: public_location(match.group(0)), text)


# The training arguments published with the model (training_summary.json in its repository): the settings, as numbers,
# switches and named choices; every other string (the tokenizer's, shards', checkpoint and TensorBoard folders, the
# model folder, the TPU's address, the Hub repository checkpoints went to, any secret) is left out, and listed.
PUBLIC_TEXT_ARGUMENTS = (
    "model_config",
    "init_from",
    "recipe",
    "lr_schedule",
    "xla",
    "on_divergence",
    "accelerator",
    "price_source",
)


# how an argument naming a model is published: a config's file name or Hub name; a base model's Hub name, a folder's
# (local or a bucket's, however named) left out
PUBLISHED_AS = {
    "model_config": public_name,
    "init_from": lambda value: value if value.startswith(HUB_PREFIX) or not value else LEFT_OUT,
}


def public_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The copy of a training summary a Hub repository gets: the run's figures and settings; no bucket, project, path
    or secret (``left_out``: the arguments not published). What the model card is written from, too."""
    arguments = summary.get("arguments", {})
    kept: dict[str, Any] = {}
    for key, value in arguments.items():
        if value is None or isinstance(value, bool | int | float):
            kept[key] = value
        elif key in PUBLIC_TEXT_ARGUMENTS and isinstance(value, str):
            kept[key] = PUBLISHED_AS.get(key, public_text)(value)
    left_out = set(summary.get("left_out", [])) | (set(arguments) - set(kept))  # a public copy's, again
    published = {**summary, "arguments": kept, "left_out": sorted(left_out)}
    if isinstance(summary.get("corpus"), dict):
        corpus = summary["corpus"]
        published["corpus"] = {**corpus, "source": public_name(str(corpus.get("source", "")))}
    if "base_model" in summary:
        published["base_model"] = PUBLISHED_AS["init_from"](summary["base_model"])
    if summary.get("hub_push_failures"):  # which checkpoint pushes failed; their errors name the repository
        published["hub_push_failures"] = [str(failure).split(": ", 1)[0] for failure in summary["hub_push_failures"]]
    return published_values(published)


def published_values(value: Any) -> Any:
    """``value`` with every string in it as ``public_text`` has it: the last guard of what is published."""
    if isinstance(value, dict):
        return {key: published_values(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [published_values(item) for item in value]
    return public_text(value) if isinstance(value, str) else value


def public_probe(probe: dict | None) -> dict | None:
    """The downstream probe's results as a card shows them: a task of files named by its file's name, a failure's
    line without locations; only what the card reads."""
    if not probe:
        return probe
    if probe.get("failed"):
        return {**probe, "failed": public_text(str(probe["failed"]))}
    tasks = [{**task, "task": public_task(task["task"])} for task in probe["tasks"]]
    return {**probe, "tasks": tasks}


def public_task(name: str) -> str:
    """A probe task's name as published: a Hub dataset's or the built-in task's as it is; of files, a file's name."""
    return name if name.startswith(HUB_PREFIX) or "/" not in name else public_location(name)


def hub_dataset_name(source: str) -> str:
    """The Hub dataset an ``hf:NAME[:CONFIG[:SPLIT]]`` corpus names, as the card's ``datasets`` lists it."""
    return parse_hub_name(source)[0]


def usage_section(repo_id: str) -> list[str]:
    def block(code: str) -> list[str]:
        return ["```python", code.format(repo_id=repo_id), "```"]

    return [
        USAGE_HEADING,
        "",
        "With transformers 5 and PyTorch (`pip install transformers torch`; without a GPU, "
        "`pip install torch --index-url https://download.pytorch.org/whl/cpu` first avoids the CUDA packages). "
        "A private repository needs a token first (`hf auth login`, or `HF_TOKEN`).",
        "",
        *block(PYTORCH_FILL_MASK),
        "",
        "Sentence embeddings (mean pooling of the encoder's last hidden states; a pre-trained encoder's embeddings "
        "are a starting point for fine-tuning, for example with sentence-transformers, more than an end). "
        "sentence-transformers loads the repository as it is and mean-pools the same way; an embeddings server "
        "needs mean pooling named (text-embeddings-inference: `--pooling mean`):",
        "",
        *block(PYTORCH_EMBEDDINGS),
        "",
        "With TensorFlow, which only transformers 4.57 and older have "
        "(`pip install transformers==4.57.6 tensorflow==2.20.0 tf-keras==2.20.1`):",
        "",
        *block(TF_FILL_MASK),
    ]
