"""The files a run leaves for the steps after it (the evaluation's metrics, the training's summary and
history) and the lines that show them in reports and model cards."""

from __future__ import annotations

from typing import Any

# the evaluate step's output folder
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.md"


def metrics_table(metrics: dict[str, Any]) -> list[str]:
    """The evaluation metrics as Markdown table lines (the report and the model card show the same)."""
    return [
        "| metric | value |",
        "|---|---|",
        f"| loss (mean over masked tokens) | {metrics['loss']:.4f}{standard_error(metrics)} |",
        f"| perplexity | {metrics['perplexity']:.2f} |",
        *unigram_row(metrics),
        f"| masked-token accuracy | {metrics['masked_accuracy']:.2%} |",
        f"| masked tokens | {metrics['masked_tokens']:,} |",
        f"| samples | {metrics['samples']:,}{of_the_set(metrics)} |",
    ]


def standard_error(metrics: dict[str, Any]) -> str:
    """The loss's standard error over the samples scored, as " ± SE" (none for metrics written before it was kept)."""
    error = metrics.get("loss_standard_error")
    return f" ± {error:.4f}" if error is not None and error == error else ""


def of_the_set(metrics: dict[str, Any]) -> str:
    """How many samples the shards hold, where the evaluation scored only a part of them."""
    total = metrics.get("set_samples")
    return f" of {total:,} in the set (max_batches)" if total and total > metrics["samples"] else ""


# the train step's: written last in the model folder
SUMMARY_FILE = "training_summary.json"
WORD_BOUNDARY = "\u2581"  # the Metaspace pre-tokenizer's word-boundary mark, which a bare piece decodes from
# Written beside the checkpoints at each one: the log points so far, so a resumed run reports the whole training.
HISTORY_FILE = "training_history.json"


def loss_summary(summary: dict[str, Any]) -> str:
    """The training loss at the first and last log point, for reports and model cards; a rerun that found
    every step done shows the figures of the runs that trained (kept beside the checkpoints)."""
    if summary["first_loss"] is None:
        return "none logged (the checkpoints came from a run that kept no log)"
    history = summary["history"]
    text = f"{summary['first_loss']:.4f} at step {history[0]['step']:,}, {summary['last_loss']:.4f} at step "
    text += f"{history[-1]['step']:,}"
    if not summary["steps_this_run"]:
        text += f" (this run found all {summary['total_steps']:,} steps done and trained none)"
    return text


def unigram_row(metrics: dict[str, Any]) -> list[str]:
    """The unigram baseline's table row, where the evaluation had the training shards' token counts."""
    if metrics.get("unigram_perplexity") is None:
        return []
    return [f"| unigram baseline perplexity (training-token frequencies) | {metrics['unigram_perplexity']:.2f} |"]


def display_token(token: str) -> str:
    """A fill-mask prediction as people should read it: the bare word-boundary piece decodes to an empty
    string, often a small model's top prediction, which reads like a bug unless it is named."""
    return f"{WORD_BOUNDARY} (word boundary)" if not token.strip() else token


# the downstream step's output folder
DOWNSTREAM_FILE = "downstream.json"
PROBE_MODELS = ("pre-trained", "random init")  # fine-tuned from the trained weights, and from a new model's
# a continued model's third: the model it continued from, as it was (what adapting it gained)
BASE_MODEL = "base as it was"


def probed_models(result: dict[str, Any]) -> tuple[str, ...]:
    """The models a probe's task result (or its average) holds: the trained one and its twin, and a continued
    model's base."""
    return (*PROBE_MODELS, BASE_MODEL) if BASE_MODEL in result else PROBE_MODELS


def read_downstream(folder: str) -> dict[str, Any] | None:
    """The downstream probe's results in ``folder``; None where no folder is given."""
    import json

    from components.lib import storage

    return json.loads(storage.read_text(storage.join(folder, DOWNSTREAM_FILE))) if folder else None


NO_SIGNAL = "no signal"
CUES = ("first token", "last token", "length")


def shown_score(model: dict[str, Any]) -> str:
    """A probe model's score as people read it: with its sampling error, or "no signal" (its score in brackets) when
    it does not beat always answering one class (the best such answer on the scored split) by more than that error:
    no accuracy of the model's."""
    if not model.get("signal", True):
        return f"{NO_SIGNAL} ({model['score']:.4f})"
    error = model.get("standard_error")
    return f"{model['score']:.4f}" + (f" ± {error:.4f}" if error is not None else "")


def baselines_line(task: dict[str, Any]) -> str:
    """A probe task's trivial baselines in one line: each one's score in the task's metric."""
    return ", ".join(f"{name} {score:.4f}" for name, score in task.get("baselines", {}).items())


def rates_line(task: dict[str, Any]) -> str:
    """The peak learning rate each model fine-tuned at on a task, and where the rates were chosen."""
    chosen = ", ".join(f"{task[model]['learning_rate']:g} {model}" for model in probed_models(task))
    searched = {model: task[model]["learning_rate_search"] for model in probed_models(task)}
    if not any(searched.values()):
        return f"`{task['task']}`: fine-tuned at {chosen} (given, not chosen)."
    grids = "; ".join(
        f"{model}: "
        + ", ".join(
            f"{point['learning_rate']:g} → "
            + ("diverged" if point["dev_score"] is None else f"{point['dev_score']:.4f}")
            for point in search
        )
        for model, search in searched.items()
        if search
    )
    return (
        f"`{task['task']}`: fine-tuned at {chosen}, each the best on {task['dev_samples']:,} development samples "
        f"carved from training ({grids})."
    )


def downstream_table(results: dict[str, Any]) -> list[str]:
    """The probe's results as Markdown lines (its report, the model card): a row a task, each model's score on the
    task's scored split with its sampling error (or "no signal"), the gain, the trivial baselines beside them; the
    average where there are several; a failed probe's error."""
    if results.get("failed"):
        return [f"The downstream probe failed: {results['failed']}"]
    published = any(result.get("published") is not None for result in results["tasks"])
    adapted = BASE_MODEL in results["average"]  # a continued model's: its base as it was, and what adapting gained
    lines = [
        "| task | metric | pre-trained | random init | gain | "
        + (f"{BASE_MODEL} | adaptation gain | " if adapted else "")
        + "majority class | bag of words | best cue¹ | fine-tuned on | scored on |"
        + (" published roberta-base² |" if published else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if adapted else "") + ("---|" if published else ""),
    ]
    for result in results["tasks"]:
        baselines = result.get("baselines", {})
        cue = max((baselines[name], name) for name in CUES if name in baselines) if baselines else None
        lines.append(
            f"| `{result['task']}` | {result['metric']} | {shown_score(result['pre-trained'])} | "
            f"{shown_score(result['random init'])} | {result['gain']:+.4f} | "
            + (f"{shown_score(result[BASE_MODEL])} | {result['adaptation_gain']:+.4f} | " if adapted else "")
            + (
                f"{baselines['majority class']:.4f} | {baselines['bag of words']:.4f} | {cue[0]:.4f} ({cue[1]}) | "
                if cue
                else "| | | "
            )
            + f"{result['train_samples']:,} | {result['validation_samples']:,} ({result['validation_split']}) |"
            + (f" {result['published']:.3f} |" if result.get("published") is not None else " |" if published else "")
        )
    average = results["average"]
    if len(results["tasks"]) > 1:
        lines.append(
            f"| average | | {average['pre-trained']:.4f} | {average['random init']:.4f} | "
            f"{average['pre-trained'] - average['random init']:+.4f} | "
            + (f"{average[BASE_MODEL]:.4f} | {average['pre-trained'] - average[BASE_MODEL]:+.4f} | " if adapted else "")
            + "| | | | |"
            + (" |" if published else "")
        )
    by_task = {result["task"]: result for result in results["tasks"]}  # a task scored on two splits: its rates once
    lines += ["", *(rates_line(result) for result in by_task.values())]
    lines += [
        "",
        "Scores are means over the seeds ± the sampling error of the scored split (binomial for accuracy, bootstrap "
        "else); no signal: not above the best score of always answering one class on the scored split by more than "
        "that error (the majority class baseline answers the training split's). ¹ The best of "
        "the first token, the last token and the length alone, each a count classifier like the bag of words "
        "(naive Bayes on the training split).",
    ]
    if published:
        from components.lib.downstream_tasks import PUBLISHED_SOURCE

        lines += ["", f"² {PUBLISHED_SOURCE}; a landmark, not comparable with this probe's short budget."]
    return lines


def fill_mask_line(predictions: list[dict[str, Any]]) -> str:
    return ", ".join(f"{display_token(p['token'])} ({p['score']:.3f})" for p in predictions)
