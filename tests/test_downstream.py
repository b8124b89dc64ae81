"""The downstream probe: its tasks (the built-in one, labelled files, bad specs refused in one line), its scores,
and a fine-tuning of the trained model against its randomly initialised twin through the command."""

import json
import math
import random
import re
import shutil
import zlib

import pytest
from conftest import run_module

from components.downstream import DownstreamArguments, scores
from components.lib.downstream_tasks import GLUE_TASKS, TaskSpec, parse_tasks, word_order_task
from components.lib.errors import InvalidParameter
from components.lib.probe_baselines import baseline_predictions
from components.lib.results import downstream_table, shown_score


def test_scores_are_accuracy_f1_of_the_positive_class_and_matthews_correlation():
    labels = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    predicted = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]
    tp, fn, fp, tn = 3, 1, 1, 5
    got = scores(predicted, labels, 2)
    assert got["accuracy"] == pytest.approx(0.8)
    assert got["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert got["mcc"] == pytest.approx((tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    assert scores(labels, labels, 2) == {"accuracy": 1.0, "f1": 1.0, "mcc": 1.0}
    assert scores([0] * 10, labels, 2)["mcc"] == 0.0  # one class always: no correlation, not a division by zero
    three = scores([0, 1, 2, 2], [0, 1, 2, 1], 3)
    assert three["accuracy"] == 0.75 and three["f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    # a class neither in the labels nor predicted does not count in the mean (scikit-learn's macro F1: 0.733)
    assert scores([0, 1, 1, 0], [0, 1, 0, 0], 3)["f1"] == pytest.approx((0.8 + 2 / 3) / 2)


def test_the_word_order_task_is_windows_of_held_out_text_that_no_trivial_baseline_tells_apart():
    from components.lib.corpus.embedded import embedded_lines
    from components.lib.downstream_tasks import (
        WORD_ORDER_TRAIN_WINDOWS,
        WORD_ORDER_VALIDATION_SHARE,
        WORD_ORDER_WINDOW,
        docstring_sentences,
        normalised,
    )

    task = word_order_task()
    assert task == word_order_task() and task.label_names == ("reordered", "original")
    assert len(task.train.labels) == WORD_ORDER_TRAIN_WINDOWS and len(task.validation.labels) > 500
    # text the embedded corpus (make run's pre-training text) does not hold, each sentence in one split
    sentences = set(docstring_sentences())
    assert sentences and not sentences & {normalised(line) for line in embedded_lines()}
    running = {
        validation: " ".join(
            sentence
            for sentence in docstring_sentences()
            if (zlib.crc32(sentence.encode()) % WORD_ORDER_VALIDATION_SHARE == 0) == validation
        )
        for validation in (False, True)
    }
    for split, validation in ((task.train, False), (task.validation, True)):
        assert 0.4 < sum(split.labels) / len(split.labels) < 0.6
        for (text,), label in zip(split.texts, split.labels, strict=True):
            words = text.split()
            original = " ".join(words if label == 1 else words[::-1])  # a reordered window: its words last first
            assert len(words) == WORD_ORDER_WINDOW and original in running[validation]
    # its words, its first and last word and its length: near chance, trained on the training windows
    vocabulary: dict[str, int] = {}

    def ids(split):
        return [[vocabulary.setdefault(word, len(vocabulary)) for word in text.split()] for (text,) in split.texts]

    predicted = baseline_predictions(ids(task.train), task.train.labels, ids(task.validation), 2)
    for name, guesses in predicted.items():
        accuracy = scores(guesses, task.validation.labels, 2)["accuracy"]
        assert abs(accuracy - 0.5) < 0.06, (name, accuracy)


def test_the_held_out_sentences_are_kept_in_the_cache_folder_and_read_back_as_parsed(tmp_path, monkeypatch):
    """Every command that estimates a run reads the built-in task: a second process reads the sentences from the
    user's cache folder instead of parsing the standard library again; an unwritable one is no error."""
    from components.lib.downstream_tasks import docstring_sentences, parsed_docstring_sentences

    sources = ("json",)  # one small package: the same code as the whole list's, parsed in a moment
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    docstring_sentences.cache_clear()  # the process's own copy: each case below reads the folder
    parsed = parsed_docstring_sentences(sources)
    assert len(parsed) > 5 and docstring_sentences(sources) == parsed
    (kept,) = (tmp_path / "cache" / "tpu-mlm").glob("docstrings-*.json")
    kept.write_text(json.dumps(parsed[:5]))  # what is read is the file, not a parse
    docstring_sentences.cache_clear()
    assert docstring_sentences(sources) == parsed[:5]
    (tmp_path / "unwritable").write_text("a file where the folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "unwritable"))
    docstring_sentences.cache_clear()
    assert docstring_sentences(sources) == parsed
    docstring_sentences.cache_clear()


def test_a_folder_of_labelled_files_gives_its_splits_with_text_labels_numbered_in_order(tmp_path):
    rows = [("a fine film", "pos"), ("dull and long", "neg"), ("loved it", "pos")]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"review": t, "stars": s}) + "\n" for t, s in rows))
    (tmp_path / "validation.jsonl").write_text(json.dumps({"review": "not good", "stars": "neg"}) + "\n")
    (spec,) = parse_tasks(str(tmp_path), "review", "stars")
    task = spec.load()
    assert task.label_names == ("neg", "pos") and task.train.labels == [1, 0, 1] and task.validation.labels == [0]
    assert task.train.texts[0] == ("a fine film",) and task.metric == "accuracy"
    # sentence pairs from CSV
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for split in ("train", "validation"):
        (pairs / f"{split}.csv").write_text(
            "first,second,label\nIt rains.,The street is wet.,1\nIt rains.,Cats fly.,0\n"
        )
    pair_task = parse_tasks(str(pairs), "first,second")[0].load()
    assert pair_task.train.texts[0] == ("It rains.", "The street is wet.") and pair_task.label_names == ("0", "1")
    # ratings 1 to 5 as classes 0 to 4, stored as numbers however the format keeps them (1.0 from a CSV with gaps)
    ratings = tmp_path / "ratings"
    ratings.mkdir()
    (ratings / "train.jsonl").write_text(
        "".join(json.dumps({"t": f"r{r}", "y": float(r)}) + "\n" for r in (1, 3, 5, 3))
    )
    (ratings / "validation.jsonl").write_text(json.dumps({"t": "x", "y": 5}) + "\n")
    rated = parse_tasks(str(ratings), "t", "y")[0].load()
    assert (
        rated.label_names == ("1", "3", "5") and rated.train.labels == [0, 1, 2, 1] and rated.validation.labels == [2]
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("no validation file", "holds no validation file"),
        ("a missing column", "its train split has no column 'stars'"),
        ("a label column of text", "its labels take 150 values in 150 rows: a text column, not classes?"),
        ("validation labels unseen", "its validation labels ['meh'] are not among training's"),
        ("one label", "its training labels take 1 value(s): nothing to learn"),
        ("empty cells", "its train split has 2 empty 'review' cell(s), the first in row 3"),
    ],
)
def test_a_bad_task_is_refused_in_one_line_naming_it(tmp_path, case, message):
    train = [{"review": f"text {i}", "stars": "pos" if i % 2 else "neg"} for i in range(10)]
    validation = [{"review": "x", "stars": "pos"}]
    if case == "a missing column":
        train = [{"review": row["review"], "rating": row["stars"]} for row in train]
    if case == "a label column of text":
        train = [{"review": f"text {i}", "stars": f"label {i}"} for i in range(150)]
    if case == "validation labels unseen":
        validation = [{"review": "x", "stars": "meh"}]
    if case == "one label":
        train = [{"review": row["review"], "stars": "pos"} for row in train]
    if case == "empty cells":
        train[3]["review"] = train[7]["review"] = None
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in train))
    if case != "no validation file":
        (tmp_path / "validation.jsonl").write_text("".join(json.dumps(row) + "\n" for row in validation))
    with pytest.raises(InvalidParameter) as refused:
        parse_tasks(str(tmp_path), "review", "stars")[0].load()
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_task_specs_and_the_probe_s_settings_are_checked_before_anything_loads():
    for tasks, message in (
        ("hf:", "a Hub dataset task is written hf:NAME[:CONFIG[:SPLIT]]"),
        ("hf:glue:sst2:dev:x", "a Hub dataset task is written hf:NAME[:CONFIG[:SPLIT]]"),
        ("hf:user/reviews::dev", "a Hub dataset task is written hf:NAME[:CONFIG[:SPLIT]]"),
        ("hf:glue:sst2:train", "is scored on the split it fine-tunes on: name another split"),
        (",", "name at least one task"),
        ("word-ordr", "is no built-in task (word-order), no hf:NAME dataset and no folder here"),
    ):
        with pytest.raises(InvalidParameter, match=re.escape(message)):
            DownstreamArguments(model="m", output="o", tasks=tasks)
    with pytest.raises(InvalidParameter, match="names one text column, or two for sentence pairs"):
        parse_tasks("gs://bucket/folder", "a,b,c")
    with pytest.raises(InvalidParameter, match=re.escape("--seeds='1;2': must be comma-separated whole numbers")):
        DownstreamArguments(model="m", output="o", seeds="1;2")
    assert DownstreamArguments(model="m", output="o", seeds="1, 2,3").seed_list == [1, 2, 3]
    for name, value, message in (
        ("learning_rates", "1e-3,fast", "--learning-rates='1e-3,fast': must be distinct rates between 0 and 1"),
        ("random_init_learning_rates", "0", "--random-init-learning-rates='0': must be distinct rates"),
        ("dev_fraction", 1.0, "--dev-fraction=1.0: must be above 0 and below 1"),
    ):
        with pytest.raises(InvalidParameter, match=re.escape(message)):
            DownstreamArguments(model="m", output="o", **{name: value})
    grids = DownstreamArguments(model="m", output="o", learning_rates="1e-4, 1e-3").grids
    # the twin's: the same unless given; a continued model's base, pre-trained too, the model's
    assert grids == {"pre-trained": [1e-4, 1e-3], "random init": [1e-4, 1e-3], "base as it was": [1e-4, 1e-3]}
    # GLUE's tasks name their columns and metric themselves; another Hub dataset needs its text column named
    assert GLUE_TASKS["mrpc"][:2] == (("sentence1", "sentence2"), "f1") and GLUE_TASKS["cola"][1] == "mcc"
    assert TaskSpec("hf:glue:sst2").name == "hf:glue:sst2"
    assert DownstreamArguments(model="m", output="o").text_columns == "text"  # the corpus's column, by default


@pytest.mark.xdist_group("trained")  # reads the tiny model, made once
@pytest.mark.slow
def test_the_probe_fine_tunes_the_model_and_its_random_twin_and_reports_both(tmp_path, tiny_model):
    """Each model at the rate of its grid that scores best on a development split carved from training (the twin
    given one rate here: no search, the same samples), scored on the validation split beside the baselines."""
    output = tmp_path / "downstream"
    done = run_module(
        "components.downstream",
        *("--model", str(tiny_model), "--output", str(output), "--max_steps", "20"),
        *("--learning_rates", "1e-7,5e-4", "--random_init_learning_rates", "5e-4"),
        *("--max_train_samples", "256", "--max_eval_samples", "128", "--max_length", "32"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((output / "downstream.json").read_text())
    (task,) = results["tasks"]
    assert task["task"] == "word-order" and task["validation_samples"] == 128
    assert task["dev_samples"] == round(0.2 * 256) and task["train_samples"] == 256 - task["dev_samples"]
    search = task["pre-trained"]["learning_rate_search"]
    assert [point["learning_rate"] for point in search] == [1e-7, 5e-4]
    best = max(search, key=lambda point: point["dev_score"])
    (pre_trained_run,) = task["pre-trained"]["runs"]
    assert task["pre-trained"]["learning_rate"] == best["learning_rate"] == pre_trained_run["learning_rate"]
    assert pre_trained_run["dev_score"] == best["dev_score"]  # the search's run at that rate is the one reported
    assert task["random init"]["learning_rate_search"] == [] and task["random init"]["learning_rate"] == 5e-4
    for model in ("pre-trained", "random init"):
        (run,) = task[model]["runs"]
        assert run["steps"] == 20 and 0 <= run["accuracy"] <= 1 and math.isfinite(run["mean_train_loss"])
    assert task["gain"] == pytest.approx(task["pre-trained"]["score"] - task["random init"]["score"])
    assert set(task["baselines"]) == {"majority class", "bag of words", "first token", "last token", "length"}
    assert 0.5 <= task["majority_class"] <= 1 and all(0 <= score <= 1 for score in task["baselines"].values())
    for model in ("pre-trained", "random init"):
        figures = task[model]
        accuracy = figures["score"]
        assert figures["standard_error"] == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / 128))  # binomial
        assert figures["seed_scores"] == [accuracy] and figures["seed_std"] == 0.0
        assert figures["signal"] == (accuracy - task["one_class"] > figures["standard_error"])
    # always answering one class: at best the scored split's majority share, whatever the training split's majority
    assert task["one_class"] == task["majority_class"]
    report = (output / "report.md").read_text()
    assert f"| `word-order` | accuracy | {shown_score(task['pre-trained'])} | " in report
    assert f"| {task['baselines']['majority class']:.4f} | {task['baselines']['bag of words']:.4f} |" in report
    assert f"each the best on {task['dev_samples']} development samples carved from training" in report
    assert "word-order: accuracy" in done.stdout and "trivial baselines: majority class" in done.stdout
    refused = run_module(
        "components.downstream", "--model", str(tiny_model), "--output", str(tmp_path / "x"), "--tasks", "hf:"
    )
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("error: --tasks='hf:'")
    assert not (tmp_path / "x").exists()


def test_roberta_base_s_published_score_is_a_landmark_beside_glue_tasks_only_where_the_metric_is_the_probe_s():
    from components.lib.downstream_tasks import published_score
    from components.lib.results import downstream_table

    assert published_score("hf:nyu-mll/glue:sst2") == 0.948 and published_score("hf:glue:cola") == 0.636
    assert published_score("hf:nyu-mll/glue:mrpc") is None  # published as accuracy, the probe's MRPC metric is F1
    assert published_score("hf:glue:sst2:test") is None and published_score("word-order") is None
    model = {"score": 0.8, "accuracy": 0.8, "f1": 0.8, "mcc": 0.6, "runs": [], "learning_rate": 2e-5}
    model["learning_rate_search"] = []
    row = {"metric": "accuracy", "pre-trained": model, "random init": model, "gain": 0.0, "train_samples": 10}
    row |= {"validation_samples": 5, "validation_split": "validation"}
    tasks = [
        {**row, "task": "hf:nyu-mll/glue:sst2", "published": 0.948},
        {**row, "task": "word-order", "published": None},
    ]
    table = downstream_table({"tasks": tasks, "average": {"pre-trained": 0.8, "random init": 0.8}})
    assert table[0].endswith("| published roberta-base² |") and table[2].endswith("| 5 (validation) | 0.948 |")
    assert table[3].endswith("| 5 (validation) | |") and "not comparable with this probe's short budget" in table[-1]
    alone = downstream_table({"tasks": tasks[1:], "average": {"pre-trained": 0.8, "random init": 0.8}})
    assert "published" not in "\n".join(alone)  # no column where no task has a published figure


def test_the_trivial_baselines_find_the_cue_a_task_leaves_and_only_it():
    """Count classifiers over each sample's tokens: a label given away by the first token is found by the first-token
    baseline alone, one given away by a word anywhere by the bag of words, one given away by order by none."""
    draw = random.Random(0)
    words = list(range(10, 60))
    samples = [draw.sample(words, 8) for _ in range(400)]
    labels = [draw.randrange(2) for _ in samples]
    by_first = [[5 + label, *sample] for sample, label in zip(samples, labels, strict=True)]
    by_word = [[*sample[:4], 7 + label, *sample[4:]] for sample, label in zip(samples, labels, strict=True)]
    by_order = [sample[::-1] if label else sample for sample, label in zip(samples, labels, strict=True)]
    for tokens, solved in ((by_first, {"first token", "bag of words"}), (by_word, {"bag of words"}), (by_order, set())):
        predicted = baseline_predictions(tokens[:300], labels[:300], tokens[300:], 2)
        accuracy = {name: scores(guess, labels[300:], 2)["accuracy"] for name, guess in predicted.items()}
        assert {name for name, value in accuracy.items() if value == 1.0} == solved, accuracy
        assert all(value < 0.7 for name, value in accuracy.items() if name not in solved), accuracy
    assert len(set(predicted["majority class"])) == 1


def test_a_model_no_better_than_the_majority_class_is_no_signal_in_the_report_and_not_on_the_hub():
    """A score within its error of always answering one class is the model's no more than that answer's: the report
    says "no signal", the card's model-index leaves it out."""
    from components.lib.model_card import probe_results

    model = {"score": 0.62, "standard_error": 0.03, "signal": False, "seed_scores": [0.62], "seed_std": 0.0}
    model |= {"learning_rate": 1e-3, "learning_rate_search": [{"learning_rate": 1e-3, "dev_score": 0.6}]}
    task = {
        "task": "hf:user/sport-or-cooking",
        "metric": "accuracy",
        "train_samples": 240,
        "dev_samples": 60,
        "validation_samples": 100,
        "validation_split": "validation",
        "published": None,
        "majority_class": 0.633,
        "baselines": {
            "majority class": 0.633,
            "bag of words": 0.9,
            "first token": 0.6,
            "last token": 0.55,
            "length": 0.58,
        },
        "pre-trained": model,
        "random init": {**model, "score": 0.61},
        "gain": 0.01,
    }
    probe = {"tasks": [task], "average": {"pre-trained": 0.62, "random init": 0.61}, "arguments": {"seeds": "1"}}
    (row,) = [line for line in downstream_table(probe) if line.startswith("| `")]
    assert row.startswith(
        "| `hf:user/sport-or-cooking` | accuracy | no signal (0.6200) | no signal (0.6100) | +0.0100 |"
    )
    assert "| 0.6330 | 0.9000 | 0.6000 (first token) |" in row
    assert probe_results(probe, "user/model") is None
    # with a signal: a Hub dataset's task goes into model-index as scored, the built-in task into the table alone
    signal = {**model, "score": 0.9, "signal": True}
    sst2 = {**task, "task": "hf:nyu-mll/glue:sst2", "pre-trained": signal, "validation_samples": 500}
    probe["tasks"] = [sst2, {**task, "task": "word-order", "pre-trained": signal}]
    (result,) = probe_results(probe, "user/model")
    assert (result.dataset_type, result.dataset_name, result.dataset_config, result.dataset_split) == (
        "nyu-mll/glue",
        "glue sst2",
        "sst2",
        "validation",
    )
    assert result.dataset_args == {"scored_samples": 500} and result.metric_value == 0.9
    assert result.metric_name == "accuracy (short fine-tune, 1 seed(s))"  # no twin's score in a metric's name
    assert result.source_url == "https://huggingface.co/user/model"
    assert shown_score({"score": 0.8, "standard_error": 0.02, "signal": True}) == "0.8000 ± 0.0200"


@pytest.mark.parametrize("metric, one_class", [("accuracy", 0.7), ("f1", 2 * 0.7 / 1.7), ("mcc", 0.0)])
def test_no_signal_is_judged_against_the_best_one_class_answer_on_the_scored_split(metric, one_class):
    """A balanced training split's majority class baseline answers class 0, which is 0.3 of the scored split: a model
    must beat answering class 1 every time (0.7 of it; in F1, always the positive class; in MCC, 0), not that."""
    from components.downstream import EncodedTask, ScoredSplit, task_result
    from components.lib.downstream_tasks import Examples, Task

    train, validation = Examples([("a",)] * 6, [0, 0, 0, 1, 1, 1]), Examples([("a",)] * 10, [1] * 7 + [0] * 3)
    task = Task("t", metric, ("x", "y"), train, validation)
    encoded = EncodedTask(
        task, Examples([], []), {}, [[5]] * 6, {"validation": ScoredSplit(validation, {}, [[5]] * 10)}
    )

    def run(score: float) -> dict:
        figures = {"accuracy": score, "f1": score, "mcc": score, "standard_error": 0.05}
        return {"learning_rate": 1e-3, "steps": 1, "scored": {"validation": figures}}

    tuned = {"pre-trained": ([run(one_class + 0.04)], []), "random init": ([run(one_class + 0.06)], [])}
    result = task_result(encoded, tuned, "validation")
    assert result["one_class"] == pytest.approx(one_class) and result["majority_class"] == 0.7
    assert result["baselines"]["majority class"] == scores([0] * 10, validation.labels, 2)[metric]
    assert not result["pre-trained"]["signal"] and result["random init"]["signal"]


@pytest.mark.xdist_group("trained")  # reads the tiny model, made once
@pytest.mark.slow
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_seed_s_fine_tuning_is_the_same_after_another_s_as_alone(tmp_path, tiny_model, dropout):
    """A seed's run is the one it would be on its own, whatever ran before it: without dropout the seeds share one
    compiled model (one trace), each run setting the weights and the optimizer's state anew; with it (its masks
    drawn in the traced function) each seed has its own."""
    from components.downstream import encode_for_probe, fine_tune

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    (model / "config.json").write_text(json.dumps(config))
    arguments = DownstreamArguments(
        model=str(model), output="unused", max_steps=5, max_train_samples=64, max_eval_samples=64, max_length=32
    )
    (task,) = [spec.load(arguments.max_train_samples, arguments.max_eval_samples) for spec in arguments.task_specs()]
    encoded = encode_for_probe(model, task, arguments)
    # the random twin: each seed draws its weights too (the pre-trained model's are read; its head is drawn)
    first, after_first = fine_tune(model, encoded, arguments, [1, 2], "random init", 1e-3)
    (alone,) = fine_tune(model, encoded, arguments, [2], "random init", 1e-3)
    for run in (first, after_first, alone):
        run.pop("seconds")
    assert after_first == alone
    assert after_first["mean_train_loss"] != first["mean_train_loss"]  # the seeds' runs differ
