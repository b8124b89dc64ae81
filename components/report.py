"""The run report: evaluation metrics, the training loss curve, throughput and fill-mask examples, as one
self-contained HTML page (the plot embedded), which the Vertex AI console shows as the run's HTML artifact.

    python -m components.report --model /tmp/model --evaluation /tmp/eval --output /tmp/report.html
"""

import base64
import html
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.job_runner import run_job
from components.lib.results import (
    BASE_MODEL,
    METRICS_FILE,
    PROBE_MODELS,
    SUMMARY_FILE,
    baselines_line,
    display_token,
    loss_summary,
    probed_models,
    read_downstream,
    shown_score,
)
from components.lib.run_shape import describe_batch_stages


@dataclass
class ReportArguments:
    model: str = field(metadata={"help": "Model folder from components.train."})
    evaluation: str = field(metadata={"help": "Folder with metrics.json from components.evaluate."})
    output: str = field(metadata={"help": "HTML file to write (local or gs://)."})
    downstream: str = field(
        default="", metadata={"help": "Folder with downstream.json from components.downstream; none if empty."}
    )


def png_bytes(figure: Any) -> bytes:
    """A matplotlib figure as PNG bytes, the figure closed."""
    from matplotlib import pyplot

    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    pyplot.close(figure)
    return buffer.getvalue()


def loss_curve_png(history: list[dict[str, float]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, loss_axis = pyplot.subplots(figsize=(7, 3.5), dpi=110)
    steps = [point["step"] for point in history]
    loss_axis.plot(steps, [point["loss"] for point in history], color="tab:blue", label="training loss")
    validated = [point for point in history if "eval_loss" in point]
    if validated:  # at each checkpoint, on 15% masks whatever the training masked
        loss_axis.plot(
            [point["step"] for point in validated],
            [point["eval_loss"] for point in validated],
            color="tab:orange",
            marker="o",
            label="validation loss",
        )
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("masked-LM loss")
    rate_axis = loss_axis.twinx()
    rate_axis.plot(
        steps, [point["learning_rate"] for point in history], color="tab:gray", linestyle="--", label="learning rate"
    )
    rate_axis.set_ylabel("learning rate")
    figure.legend(loc="upper right")
    return png_bytes(figure)


def probe_png(results: dict[str, Any]) -> bytes:
    """Each task's score fine-tuned from the pre-trained model, from its random twin and from a continued model's
    base as it was, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    tasks = results["tasks"]
    figure, axis = pyplot.subplots(figsize=(7, 0.6 + 0.5 * len(tasks)), dpi=110)
    rows = range(len(tasks))
    models = probed_models(results["average"])
    height = 0.8 / len(models)
    for index, (model, color) in enumerate(zip(models, ("tab:blue", "tab:gray", "tab:orange"), strict=False)):
        offset = (index - (len(models) - 1) / 2) * height
        axis.barh(
            [row + offset for row in rows], [task[model]["score"] for task in tasks], height, color=color, label=model
        )
    axis.set_yticks(list(rows), [f"{task['task']} ({task['metric']})" for task in tasks])
    axis.invert_yaxis()
    axis.set_xlabel("validation score")
    axis.legend(loc="lower right")
    return png_bytes(figure)


def probe_section(results: dict[str, Any] | None) -> str:
    """The downstream probe's table and plot; a failed probe's error."""
    if results is None:
        return ""
    if results.get("failed"):
        return f"<h2>Downstream probe</h2><p>The probe failed: {html.escape(results['failed'])}</p>"
    adapted = BASE_MODEL in results["average"]
    rows = "".join(
        f"<tr><td><code>{html.escape(task['task'])}</code></td><td>{task['metric']}</td>"
        f"<td>{shown_score(task[PROBE_MODELS[0]])}</td><td>{shown_score(task[PROBE_MODELS[1]])}</td>"
        f"<td>{task['gain']:+.4f}</td>"
        + (f"<td>{shown_score(task[BASE_MODEL])}</td><td>{task['adaptation_gain']:+.4f}</td>" if adapted else "")
        + f"<td>{html.escape(baselines_line(task))}</td>"
        f"<td>{task['train_samples']:,}</td><td>{task['validation_samples']:,}</td></tr>"
        for task in results["tasks"]
    )
    seeds = results["arguments"]["seeds"]
    plot = base64.b64encode(probe_png(results)).decode()
    return (
        "<h2>Downstream probe</h2><p>Each task fine-tuned from the pre-trained model and from a randomly initialised "
        f"twin (same config, budget and seeds: {html.escape(seeds)})"
        + (", and from the base model it continued, as it was" if adapted else "")
        + ", scored on its validation split.</p><table>"
        "<tr><th>task</th><th>metric</th><th>pre-trained</th><th>random init</th><th>gain</th>"
        + (f"<th>{BASE_MODEL}</th><th>adaptation gain</th>" if adapted else "")
        + f"<th>trivial baselines</th><th>fine-tuned on</th><th>scored on</th></tr>{rows}</table>"
        f'<img alt="downstream scores" src="data:image/png;base64,{plot}">'
    )


def build_report(summary: dict[str, Any], metrics: dict[str, Any], probe: dict[str, Any] | None = None) -> str:
    history = summary["history"]
    rows = [
        ("evaluation loss (masked tokens)", f"{metrics['loss']:.4f}"),
        ("perplexity", f"{metrics['perplexity']:.2f}"),
        (
            "unigram baseline perplexity",
            f"{metrics['unigram_perplexity']:.2f} (each masked token predicted by its frequency in training)"
            if metrics.get("unigram_perplexity") is not None
            else "not computed (no training shards' token counts)",
        ),
        ("masked-token accuracy", f"{metrics['masked_accuracy']:.2%}"),
        ("masked tokens evaluated", f"{metrics['masked_tokens']:,}"),
        ("training steps", f"{summary['total_steps']:,} (global batch {summary['global_batch_size']})"),
        (
            "batch warm-up",
            describe_batch_stages(summary.get("batch_stages", ()), summary["global_batch_size"]) or "none",
        ),
        ("training loss", loss_summary(summary)),
        (
            "throughput (last log)",
            f"{history[-1]['samples_per_second']:,.1f} samples/s, {history[-1]['tokens_per_second']:,.0f} tokens/s"
            if history
            else "n/a",
        ),
        ("accelerator", f"{summary['replicas']} x {summary['accelerator']}"),
        (
            "cost of this run's training",
            f"${summary['cost_this_run']:,.2f} at ${summary['arguments']['price_per_hour']:,.2f} an hour "
            f"({summary.get('price_source', '--price_per_hour')})"
            if "cost_this_run" in summary
            else "no price given",
        ),
        ("parameters", f"{summary['num_parameters']:,}"),
    ]
    if history and "mfu" in history[-1]:
        rows.append(("model FLOPs utilization", f"{history[-1]['mfu']:.1%}"))
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    plot = ""
    if history:
        encoded = base64.b64encode(loss_curve_png(history)).decode()
        plot = f'<h2>Training loss</h2><img alt="training loss curve" src="data:image/png;base64,{encoded}">'
    examples = ""
    for example in metrics.get("fill_mask", []):
        items = "".join(
            f"<li><code>{html.escape(display_token(p['token']))}</code> {p['score']:.3f}</li>"
            for p in example["predictions"]
        )
        examples += f"<p>{html.escape(example['sentence'])}</p><ol>{items}</ol>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tpu-mlm run report</title><style>"
        "body{font-family:sans-serif;max-width:52em;margin:2em auto}th{text-align:left;padding-right:2em}"
        "</style></head><body><h1>Masked language model pre-training</h1>"
        f"<table>{table}</table>{plot}<h2>Fill-mask examples</h2>{examples or '<p>none</p>'}{probe_section(probe)}"
        "</body></html>\n"
    )


def write_report(arguments: ReportArguments) -> dict[str, Any]:
    summary = json.loads(storage.read_text(storage.join(arguments.model, SUMMARY_FILE)))
    metrics = json.loads(storage.read_text(storage.join(arguments.evaluation, METRICS_FILE)))
    probe = read_downstream(arguments.downstream)
    storage.write_text_atomic(arguments.output, build_report(summary, metrics, probe))
    return {"report": arguments.output}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(ReportArguments, write_report, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
