import json

import pytest
from conftest import run_module

from components import estimate
from components.lib.errors import InvalidParameter
from components.lib.estimates import (
    CPU_TASK_START_HOURS,
    EstimateArguments,
    cpu_wall_hours,
    data_size,
    estimate_run,
    estimate_table,
)
from components.lib.shard_set import read_manifest
from components.lib.tpu_catalogue import TPU_TYPES, BatchSettings
from pipelines.pipeline import pipeline_parameters, target_defaults


def test_roberta_base_counts_as_the_readme_says():
    result = estimate_run(EstimateArguments(model_config="roberta-base", max_steps=1, vocab_size=25_000))
    # 105,268,648 parameters with a 25,000-piece vocabulary; 6 FLOPs per parameter and token (forward and
    # backward matmuls) plus attention's 12 x layers x hidden x length, at length 128
    assert result["parameters"] == 105_268_648
    assert result["model_flops_per_token"] == 6 * 105_268_648 + 12 * 12 * 768 * 128 == 645_767_664


def test_an_epoch_of_the_shards_on_a_v3_8(embedded_shards):
    samples = read_manifest(embedded_shards["train"])["num_records"]
    arguments = EstimateArguments(
        train_shards=embedded_shards["train"],
        model_config="tiny",
        per_replica_batch_size=8,
        gradient_accumulation_steps=1,  # else a v3-8's 2
        price_per_hour=8.0,
    )
    result = estimate_run(arguments)
    assert result["global_batch_size"] == 64 and result["steps"] == samples // 64
    assert result["tokens"] == result["steps"] * 64 * 128
    peak = 8 * 61.5e12  # a v3-8: 8 cores of 61.5 bf16 TFLOP/s
    assert result["hours"] == pytest.approx(result["model_flops"] / (0.4 * peak) / 3600)
    assert result["cost"] == pytest.approx(8.0 * result["hours"])
    assert result["memory"]["verdict"] == "fits"
    table = estimate_table(result)
    assert "manifest.json" in table and "40% MFU (assumed, not measured)" in table and "$" in table


@pytest.mark.parametrize("tpu", sorted(TPU_TYPES))
def test_the_tpu_defaults_fit_every_tpu_type_at_the_recipe_s_global_batch(tpu):
    result = estimate_run(EstimateArguments(model_config="roberta-base", tpu_type=tpu, max_steps=100))
    assert result["memory"]["verdict"] == "fits" and result["global_batch_size"] == 2048
    # what a compiled Vertex pipeline trains with: its defaults, as the train step reads them on the TPU
    compiled = {p.name: p.default for p in pipeline_parameters(target_defaults("vertex", TPU_TYPES[tpu]))}
    trained = BatchSettings(
        per_replica_batch_size=compiled["per_replica_batch_size"],
        gradient_accumulation_steps=compiled["gradient_accumulation_steps"],
    )
    trained.resolve_batch(compiled["replicas"])
    micro_batch = 64 if TPU_TYPES[tpu].replicas == 32 else 128  # a v5e-32's 32 x 64 is the batch, unaccumulated
    assert trained.per_replica_batch_size == result["per_replica_batch_size"] == micro_batch
    assert trained.gradient_accumulation_steps == result["gradient_accumulation_steps"]
    assert f"micro-batch(es) of {micro_batch}" in estimate_table(result)


def test_a_slice_is_priced_on_demand_only():
    result = estimate_run(EstimateArguments(model_config="roberta-base", tpu_type="v5e-16", max_steps=650))
    assert result["cost"] == pytest.approx(19.20 * result["hours"]) and "spot_cost" not in result
    assert "$19.20 an hour on demand (Vertex AI has no Spot for TPU slices of several hosts)" in estimate_table(result)


@pytest.mark.parametrize(("tpu", "on_demand", "spot"), [("v3-8", 8.00, 2.04), ("v5e-8", 9.60, 1.959)])
def test_without_a_price_the_run_is_priced_at_list_prices_on_demand_and_spot(tpu, on_demand, spot):
    result = estimate_run(EstimateArguments(model_config="roberta-base", tpu_type=tpu, max_steps=650))
    assert result["cost"] == pytest.approx(on_demand * result["hours"])
    assert result["spot_cost"] == pytest.approx(spot * result["hours"])
    table = estimate_table(result)
    assert f"${on_demand:,.2f} an hour on demand" in table and f"${spot:,.2f} Spot" in table
    assert "Cloud TPU list prices, us-central1" in table and "Vertex AI's own rates differ" in table
    given = estimate_run(EstimateArguments(model_config="roberta-base", tpu_type=tpu, max_steps=650, price_per_hour=3))
    assert given["cost"] == pytest.approx(3 * result["hours"]) and "spot_cost" not in given


def test_a_corpus_without_shards_is_sized_by_its_bytes_and_measured_tokens_per_byte(
    tmp_path, embedded_tokenizer, embedded_shards
):
    from components.lib.corpus import embedded_lines

    (tmp_path / "corpus.txt").write_text("\n".join(embedded_lines()) + "\n")
    size = (tmp_path / "corpus.txt").stat().st_size
    result = estimate_run(
        EstimateArguments(
            corpus=str(tmp_path / "corpus.txt"),
            tokenizer=embedded_tokenizer,
            model_config="tiny",
            per_replica_batch_size=8,
            gradient_accumulation_steps=1,
        )
    )
    data = result["data"]
    assert data["corpus_bytes"] == size and 0.15 < data["tokens_per_byte"] < 0.5
    assert data["samples"] == int(size * data["tokens_per_byte"] // 128)
    # the CPU steps: those that make the data from the corpus, then the evaluation and the run report, each priced
    steps = {step["step"]: step for step in result["cpu_steps"]}
    data_steps = ["tokenizer", "train shards", "validation shards", "merge shards", "preflight"]
    assert list(steps) == [*data_steps, "evaluate", "run report"]
    assert all(step["cost"] > 0 for step in steps.values()) and "Vertex AI's n1-standard-4 rate" in estimate_table(
        result
    )
    # a corpus 1,000 times larger, in 4 parts: the training and the validation shards each in 4 tasks side by side
    # (as many machine hours, a start each, a quarter of the time), the validation's reading the corpus all through
    bigger = estimate_run(EstimateArguments(corpus=str(tmp_path / "corpus.txt"), corpus_bytes=1000 * size, num_parts=4))
    big = {step["step"]: step for step in bigger["cpu_steps"]}
    start = CPU_TASK_START_HOURS
    for split in ("train shards", "validation shards"):
        parts = big[split]
        assert parts["tasks"] == 4 and parts["wall_hours"] - start == pytest.approx((parts["hours"] - 4 * start) / 4)
    assert big["validation shards"]["hours"] - 4 * start == pytest.approx(
        1000 * (steps["validation shards"]["hours"] - start)
    )
    # how long the CPU steps hold the run up: the tokenizer, the slower split's parts, the merges and preflight
    # before the training; the evaluation after it (the probe beside it, in a dry run), then the run report
    before, after = cpu_wall_hours(bigger["cpu_steps"])
    slower = max(big["train shards"]["wall_hours"], big["validation shards"]["wall_hours"])
    assert before == pytest.approx(
        big["tokenizer"]["wall_hours"] + slower + big["merge shards"]["wall_hours"] + big["preflight"]["wall_hours"]
    )
    assert after == big["evaluate"]["wall_hours"] + big["run report"]["wall_hours"]
    assert "run time" in estimate_table(bigger)
    # with shards made, only the evaluation: 150 batches of 64 by default, forward only at the CPU rate measured
    made = estimate_run(
        EstimateArguments(
            train_shards=embedded_shards["train"],
            model_config="tiny",
            per_replica_batch_size=8,
            gradient_accumulation_steps=1,
        )
    )
    evaluation, report = made["cpu_steps"]
    assert report["step"] == "run report" and report["hours"] == start
    assert evaluation["step"] == "evaluate" and evaluation["samples"] == 150 * 64
    flops = 150 * 64 * 128 * made["model_flops_per_token"] / 3
    assert evaluation["hours"] == pytest.approx(flops / 343e9 / 3600 + start)


def test_a_dry_run_s_estimate_reads_nothing_and_takes_a_compressed_corpus_s_size_as_stored():
    offline = {"corpus": "gs://bucket/corpus/*.jsonl.gz", "offline": True, "model_config": "tiny"}
    with pytest.raises(InvalidParameter, match=r"--corpus-bytes=0: the size of gs://bucket/corpus/.* is not read here"):
        estimate_run(EstimateArguments(**offline))  # no bucket is reached: there is none
    data = estimate_run(EstimateArguments(**offline, corpus_bytes=10**9, holdout_fraction=0.05))["data"]
    assert data["corpus_bytes"] == 3.1 * 10**9  # the text in 1 GB of compressed files, as measured on WikiText-2
    assert data["validation_samples"] == int(3.1e9 * 0.312 / 128 * 0.05)
    assert "3.10 bytes of text per stored byte, assumed" in data["source"]


@pytest.mark.parametrize(
    "values, message",
    [
        ({}, "--train-shards='': name the training shards, or a --corpus, or give --max_steps"),
        ({"max_steps": 10, "mfu": 1.5}, "--mfu=1.5: must be above 0 and at most 1"),
        ({"max_steps": 10, "tpu_type": "v9-8"}, "--tpu-type='v9-8': must be one of"),
        ({"max_steps": 10, "price_per_hour": -1.0}, "--price-per-hour=-1.0: must be 0 (unknown) or positive"),
        ({"corpus": "hf:wikitext:wikitext-103-raw-v1"}, "--corpus-bytes=0: the size of hf:wikitext"),
    ],
)
def test_bad_estimate_input_is_named(values, message):
    with pytest.raises(InvalidParameter, match=message.replace("(", r"\(").replace(")", r"\)")):
        estimate_run(EstimateArguments(**values))


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_the_cli_prints_a_table_for_people_and_json_for_scripts(embedded_shards, capsys):
    common = ["--train_shards", embedded_shards["train"], "--model_config", "tiny"]
    common += ["--per_replica_batch_size", "8", "--gradient_accumulation_steps", "1"]
    people = run_module("components.estimate", *common)
    assert people.returncode == 0, people.stderr
    assert "model FLOPs per token" in people.stdout and "{" not in people.stdout
    capsys.readouterr()
    assert estimate.main([*common, "--json"]) == 0  # the same job in this process
    scripts = capsys.readouterr()
    assert "model FLOPs per token" not in scripts.out + scripts.err and json.loads(scripts.out)["steps"] > 0


ISSUE_44_PLAN = ["--model_config", "roberta-base", "--tpu_type", "v5e-8"]
A_CORPUS = ["--corpus", "gs://b/c/*.jsonl.gz", "--corpus_bytes", "20000000000"]


def test_a_run_planned_from_a_corpus_counts_the_evaluation_and_the_probe_as_submit_s_dry_run(template, capsys):
    """``tpu-mlm estimate`` from a corpus (nothing held out: a validation corpus, its size not known here) counts the
    evaluation's batches as a run planned by its steps does, and shows the downstream probe's row, the same as
    ``submit --dry_run`` shows for the same run."""
    from pipelines.submit import SubmitArguments, submit

    def planned(*arguments: str) -> dict:
        assert estimate.main([*ISSUE_44_PLAN, *arguments, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    from_corpus, by_steps = planned(*A_CORPUS), planned("--max_steps", "1000")
    steps = {step["step"]: step for step in from_corpus["cpu_steps"]}
    assert steps["evaluate"] == {step["step"]: step for step in by_steps["cpu_steps"]}["evaluate"]
    assert steps["evaluate"]["samples"] == 150 * 64 and steps["evaluate"]["wall_hours"] > 0.2  # not a start alone
    # the probe: the pipeline's default settings, the row submit --dry_run prints for a run of this corpus
    dry_run = SubmitArguments(
        project="my-project",
        pipeline_root="gs://bucket/root",
        template=template,
        dry_run=True,
        corpus_bytes=20_000_000_000,
        parameters=json.dumps({"corpus": "gs://b/c/*.jsonl.gz"}),
    )
    submitted = submit(dry_run)["estimate"]
    assert steps["downstream probe"] == submitted["probe"] and steps["downstream probe"]["hours"] > 0
    submit_rows = capsys.readouterr().err.splitlines()
    assert estimate.main([*ISSUE_44_PLAN, *A_CORPUS]) == 0
    cli_rows = capsys.readouterr().out.splitlines()
    (probe_row,) = [row for row in cli_rows if row.startswith("  downstream probe")]
    assert probe_row in submit_rows
    (evaluate_row,) = [row for row in cli_rows if row.startswith("  evaluate")]
    assert "(9,600 samples)" in evaluate_row


def test_a_limited_run_counts_the_texts_its_data_steps_read(tmp_path, embedded_tokenizer):
    """With ``limit`` (a first run), each data task reads at most that many texts: the estimate counts the sample
    (texts of an assumed length where the corpus is not read, their measured mean where it is), never more than
    the corpus."""
    from components.lib.estimates import ASSUMED_TEXT_BYTES

    offline = {"corpus": "gs://b/c/*.jsonl.gz", "corpus_bytes": 20_000_000_000, "offline": True, "max_steps": 100}
    whole = estimate_run(EstimateArguments(**offline, num_parts=4, holdout_fraction=0.2))
    sample = estimate_run(EstimateArguments(**offline, num_parts=4, holdout_fraction=0.2, limit=50_000))
    assert sample["data"]["text_bytes"] == ASSUMED_TEXT_BYTES
    read = 4 * 50_000 * ASSUMED_TEXT_BYTES  # four parts of 50,000 texts, of the corpus's 62 GB of text
    share = read / whole["data"]["corpus_bytes"]
    assert sample["data"]["samples"] == int(read * 0.312 / 128 * 0.8)
    start = CPU_TASK_START_HOURS
    by_step = [{step["step"]: step for step in run["cpu_steps"]} for run in (whole, sample)]
    for split in ("train shards", "validation shards"):  # four tasks each, each reading its 50,000 texts
        work = [steps[split]["hours"] - 4 * start for steps in by_step]
        assert work[1] == pytest.approx(work[0] * share)
    # the tokenizer, one task: 50,000 texts of its sample, where the long run's reads its whole 2 GB sample
    tokenizer = [steps["tokenizer"]["hours"] - start for steps in by_step]
    assert tokenizer[1] == pytest.approx(tokenizer[0] * 50_000 * ASSUMED_TEXT_BYTES / 2e9)
    assert f"at most 50,000 texts a part read (limit): {read:,} bytes" in sample["data"]["source"]
    # a corpus smaller than the limit: all of it, once
    small = estimate_run(EstimateArguments(**{**offline, "corpus_bytes": 1_000_000}, limit=50_000))
    assert small["data"]["samples"] == int(3.1e6 * 0.312 / 128)
    # a corpus that is read (a tokenizer given): its texts' mean length, measured
    from components.lib.corpus import embedded_lines

    lines = embedded_lines()
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    lines = [line for line in lines if line.strip()]  # a blank line is no text
    measured = data_size(
        EstimateArguments(corpus=str(tmp_path / "corpus.txt"), tokenizer=embedded_tokenizer, limit=10, max_steps=1)
    )
    assert measured["text_bytes"] == pytest.approx(sum(len(line.encode()) + 1 for line in lines) / len(lines))
    assert measured["samples"] == int(10 * measured["text_bytes"] * measured["tokens_per_byte"] / 128)


def test_the_probe_counts_a_fine_tuning_a_rate_of_each_grid_then_one_for_every_other_seed():
    """A grid of rates costs one fine-tuning a rate (the first seed's, scored on the development split carved from
    training), then one for each other seed at the chosen rate, for each model; one rate, one a seed."""
    from types import SimpleNamespace

    from components.lib.downstream_tasks import word_order_task
    from components.lib.estimates import DEFAULT_PROBE, fine_tuning_steps, probe_estimate
    from components.lib.modeling import PRESETS
    from components.lib.run_shape import run_shape

    config = SimpleNamespace(**PRESETS["mini"], vocab_size=1000)
    shape = run_shape(per_replica_batch_size=32, max_length=128, samples=None, max_steps=1, replicas=1, config=config)
    probe = {**DEFAULT_PROBE, "max_steps": 0, "epochs": 3, "seeds": "1,2"}
    one_rate = probe_estimate(shape, {**probe, "learning_rates": "1e-3"})
    grids = probe_estimate(shape, {**probe, "learning_rates": "1e-4,1e-3,1e-2", "random_init_learning_rates": "1e-3"})
    assert one_rate["fine_tunings"] == 2 * 2 and grids["fine_tunings"] == (3 + 2 - 1) + 2
    train = len(word_order_task().train.labels)
    fitted = train - round(0.2 * train)  # the development split is carved once, for both models
    ratio = (grids["hours"] - CPU_TASK_START_HOURS) / (one_rate["hours"] - CPU_TASK_START_HOURS)
    steps = fine_tuning_steps(fitted, 32, 3, 0, 100) / fine_tuning_steps(train, 32, 3, 0, 100)
    assert ratio == pytest.approx(6 / 4 * steps, rel=0.05)  # six fine-tunings on 80% of the lines, against four
    with pytest.raises(InvalidParameter, match=r"--learning-rates='1e-3,1e-3': must be distinct rates"):
        probe_estimate(shape, {**probe, "learning_rates": "1e-3,1e-3"})
