"""The recipe's knobs: the named recipes and what a knob given beside one does, the learning-rate schedules, the
clipping of each optimizer step's gradient, and the masking rate's decay."""

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from transformers import TFAutoModelForMaskedLM, create_optimizer

from components.lib.errors import InvalidParameter
from components.lib.input_pipeline import EVALUATION_MLM_PROBABILITY, Masking, evaluation_dataset, training_dataset
from components.lib.masked_lm import max_predictions
from components.lib.modeling import model_config, pretraining_config
from components.lib.recipe import (
    KNOBS,
    MODEL_DROPOUT,
    RECIPES,
    Recipe,
    learning_rate_schedule,
    resolve_recipe,
)
from components.lib.shard_set import read_manifest
from components.lib.train_function import train_function
from components.lib.training_plan import TrainingSettings, plan_training
from components.lib.training_state import start_or_resume


def test_the_reference_recipe_is_the_settings_the_train_step_had_before_recipes():
    """hf-2023 reproduces the 2023 run: the train step's defaults before the knobs came (commit 29a0c00)."""
    assert resolve_recipe({"recipe": "hf-2023"}) == Recipe(
        recipe="hf-2023",
        learning_rate=1e-4,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        clip_norm=0.0,
        warmup_fraction=0.05,
        warmup_steps=0,
        lr_schedule="linear",
        decay_fraction=0.0,
        weight_decay=1e-3,
        dropout=MODEL_DROPOUT,
        mlm_probability=0.15,
        final_mlm_probability=0.0,
        batch_warmup_fraction=0.0,
    )


def test_roberta_recipes_are_fairseq_s_and_the_default_adds_the_measured_masking_decay_and_clipping():
    """roberta-2019: fairseq's RoBERTa-base pre-training (peak 5e-4, betas 0.9/0.98, epsilon 1e-6, weight decay
    0.01, 10k warmup updates of 125k, linear decay, no clipping, 15%); the default is it with the masking decaying
    from 30% to 15% and each step's gradient clipped to a global norm of 1.0, as benchmarks/recipes.py compared
    them."""
    assert resolve_recipe({"recipe": "roberta-2019"}) == Recipe(
        recipe="roberta-2019",
        learning_rate=5e-4,
        adam_beta2=0.98,
        adam_epsilon=1e-6,
        clip_norm=0.0,
        warmup_fraction=10_000 / 125_000,
        warmup_steps=0,
        lr_schedule="linear",
        decay_fraction=0.0,
        weight_decay=0.01,
        dropout=MODEL_DROPOUT,
        mlm_probability=0.15,
        final_mlm_probability=0.0,
        batch_warmup_fraction=0.0,
    )
    mask_decay = resolve_recipe({"recipe": "roberta-2019-mask-decay"})
    assert mask_decay == replace(
        resolve_recipe({"recipe": "roberta-2019"}),
        recipe="roberta-2019-mask-decay",
        mlm_probability=0.3,
        final_mlm_probability=0.15,
    )
    # the default: that, clipped at a global norm of 1.0 (benchmarks/recipes.py's levers, docs/benchmarks.md)
    default = resolve_recipe({})
    assert default == replace(mask_decay, recipe="roberta-2019-mask-decay-clip", clip_norm=1.0)
    assert resolve_recipe({"recipe": "", "init_from": ""}) == default


def test_continuing_a_model_defaults_to_the_dont_stop_pretraining_command_and_a_named_recipe_wins():
    """dapt-2020: the authors' domain-adaptive pre-training command (5e-4 at 2,048 sequences) with their script's
    defaults (AdamW betas 0.9/0.999, epsilon 1e-8, clipping at 1.0, no warmup, linear decay, no weight decay,
    15%): the recipe of a run given init_from and none named; one named is taken as it is."""
    continued = resolve_recipe({"recipe": "", "init_from": "hf:FacebookAI/roberta-base"})
    assert continued == Recipe(
        recipe="dapt-2020",
        learning_rate=5e-4,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        clip_norm=1.0,
        warmup_fraction=0.0,
        warmup_steps=0,
        lr_schedule="linear",
        decay_fraction=0.0,
        weight_decay=0.0,
        dropout=MODEL_DROPOUT,
        mlm_probability=0.15,
        final_mlm_probability=0.0,
        batch_warmup_fraction=0.0,
    )
    assert resolve_recipe({"recipe": "hf-2023", "init_from": "gs://b/base"}).recipe == "hf-2023"
    # the settings keep the name they trained with (the checkpoint identity's and the card's), not the empty one
    settings = TrainingSettings(train_shards="/s", tokenizer="/t", init_from="hf:a/b")
    assert (settings.recipe, settings.learning_rate, settings.warmup_fraction) == ("dapt-2020", 5e-4, 0.0)
    assert TrainingSettings(train_shards="/s", tokenizer="/t").recipe == "roberta-2019-mask-decay-clip"
    assert TrainingSettings.__dataclass_fields__["recipe"].default == ""


def test_every_named_recipe_sets_every_knob_and_one_left_unset_is_refused(monkeypatch):
    assert all(set(values) == set(KNOBS) for values in RECIPES.values())
    unset = {knob: value for knob, value in RECIPES["hf-2023"].items() if knob != "weight_decay"}
    monkeypatch.setitem(RECIPES, "hf-2023", unset)
    with pytest.raises(InvalidParameter, match="weight-decay"):
        resolve_recipe({"recipe": "hf-2023"})


def test_a_knob_given_beside_the_recipe_overrides_it_and_the_rest_are_the_recipe_s():
    resolved = resolve_recipe({"recipe": "hf-2023", "learning_rate": 5e-4, "adam_beta2": -1, "lr_schedule": ""})
    assert resolved.learning_rate == 5e-4
    assert asdict(resolved) == {**asdict(resolve_recipe({"recipe": "hf-2023"})), "learning_rate": 5e-4}
    # warmup in steps replaces the recipe's fraction; resolving the resolved knobs again changes nothing
    in_steps = resolve_recipe({"warmup_steps": 100})
    assert (in_steps.warmup_steps, in_steps.warmup_fraction) == (100, 0.0)
    assert resolve_recipe({"recipe": "hf-2023", **asdict(in_steps)}) == in_steps


@pytest.mark.parametrize(
    ("values", "parameter"),
    [
        ({"recipe": "bert-1999"}, "recipe"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"adam_beta2": 1.0}, "adam_beta2"),
        ({"adam_epsilon": 0.0}, "adam_epsilon"),
        ({"clip_norm": -0.5}, "clip_norm"),
        ({"warmup_fraction": 1.0}, "warmup_fraction"),
        ({"warmup_steps": -3}, "warmup_steps"),
        ({"lr_schedule": "cosine"}, "lr_schedule"),
        ({"lr_schedule": "wsd", "decay_fraction": 0.0}, "decay_fraction"),
        ({"weight_decay": -0.01}, "weight_decay"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.5}, "dropout"),
        ({"batch_warmup_fraction": 1.0}, "batch_warmup_fraction"),
        ({"mlm_probability": 1.5}, "mlm_probability"),
        ({"final_mlm_probability": 1.0}, "final_mlm_probability"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"clip_norm": float("inf")}, "clip_norm"),
        ({"warmup_steps": 100, "warmup_fraction": 0.1}, "warmup_steps"),
        ({"lr_schedule": "linear", "decay_fraction": 0.2}, "decay_fraction"),
    ],
)
def test_each_knob_is_refused_in_one_line_naming_it(values, parameter):
    with pytest.raises(InvalidParameter) as refused:
        resolve_recipe(values)
    assert refused.value.parameter == parameter and "\n" not in str(refused.value)


def test_the_linear_schedule_is_transformers_create_optimizer_s_at_every_step():
    """The reference recipe's schedule, step for step, as transformers.create_optimizer made it before."""
    settings = resolve_recipe({"recipe": "hf-2023"})
    ours = learning_rate_schedule(settings, 1000)
    _, theirs = create_optimizer(init_lr=1e-4, num_train_steps=1000, num_warmup_steps=50, weight_decay_rate=1e-3)
    steps = tf.range(0, 1001)
    np.testing.assert_allclose(ours(steps).numpy(), [float(theirs(step)) for step in steps], rtol=1e-6, atol=1e-12)


def test_warmup_stable_decay_holds_the_peak_then_decays_to_zero_at_the_end():
    settings = resolve_recipe({"learning_rate": 1e-3, "warmup_steps": 10, "lr_schedule": "wsd", "decay_fraction": 0.2})
    rates = learning_rate_schedule(settings, 100)(tf.range(0, 101)).numpy()
    np.testing.assert_allclose(rates[:11], np.linspace(0, 1e-3, 11), rtol=1e-6)
    np.testing.assert_allclose(rates[10:81], 1e-3, rtol=1e-6)  # stable: a run can be cut or extended here
    np.testing.assert_allclose(rates[80:], np.linspace(1e-3, 0, 21), rtol=1e-5, atol=1e-12)


def test_a_batch_warm_up_s_stages_scale_the_schedule_from_their_first_step():
    settings = resolve_recipe({"learning_rate": 1e-3, "warmup_steps": 10, "lr_schedule": "wsd", "decay_fraction": 0.2})
    plain = learning_rate_schedule(settings, 100)(tf.range(0, 100)).numpy()
    scales = ((0, 0.5), (20, 0.75), (40, 1.0))
    staged = learning_rate_schedule(settings, 100, scales)(tf.range(0, 100)).numpy()
    np.testing.assert_allclose(staged[:20], 0.5 * plain[:20], rtol=1e-6)
    np.testing.assert_allclose(staged[20:40], 0.75 * plain[20:40], rtol=1e-6)
    np.testing.assert_allclose(staged[40:], plain[40:], rtol=1e-6)
    assert resolve_recipe({}).batch_warmup_fraction == 0.0  # no named recipe warms the batch up


def test_the_masking_rate_decays_linearly_and_a_resumed_stream_goes_on_where_it_was():
    decaying = Masking(4, 100, (0, 1, 2), 0.3, final_probability=0.15, decay_batches=30)
    resumed = Masking(4, 100, (0, 1, 2), 0.3, final_probability=0.15, decay_batches=30, first_batch=12)
    rates = [float(decaying.rate(index)) for index in range(40)]
    assert (
        rates[0] == pytest.approx(0.3)
        and rates[15] == pytest.approx(0.225)
        and rates[30:] == [pytest.approx(0.15)] * 10
    )
    assert [float(resumed.rate(index)) for index in range(28)] == pytest.approx(rates[12:40])
    assert float(Masking(4, 100, (0, 1, 2)).rate(10**6)) == pytest.approx(EVALUATION_MLM_PROBABILITY)


def test_a_decaying_stream_masks_about_its_rate_in_each_batch(embedded_shards):
    manifest = read_manifest(embedded_shards["train"])
    masking = Masking.from_manifest(manifest, 0.4, final_probability=0.1, decay_batches=9)
    stream = training_dataset(embedded_shards["train"], manifest, 64, masking, seed=3)
    shares = []
    for batch in stream.take(10):
        chosen = batch["labels"] >= 0
        special = tf.reduce_any(batch["input_ids"][..., None] == list(masking.special_token_ids), axis=-1)
        maskable = (batch["attention_mask"] == 1) & (chosen | ~special)  # what masking may choose
        shares.append(float(tf.reduce_sum(tf.cast(chosen, tf.float32)) / tf.reduce_sum(tf.cast(maskable, tf.float32))))
    assert shares[0] == pytest.approx(0.4, abs=0.03) and shares[-1] == pytest.approx(0.1, abs=0.03), shares
    assert shares[0] > shares[4] > shares[9]


@pytest.mark.slow  # trains in the test
def test_clipping_acts_once_on_the_gradient_summed_over_micro_batches(wikitext_shards):
    """With two micro-batches and a clip norm far below the gradient's, the step moves the weights by the summed
    (mean) gradient scaled to that norm: clipping each micro-batch's gradient would move them elsewhere. The norm the
    step reports (logged, and watched for divergence) is that summed gradient's, clipped or not."""
    manifest = read_manifest(wikitext_shards["validation"])
    config = model_config("tiny", manifest)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # the same forward pass every time
    stream = evaluation_dataset(wikitext_shards["validation"], manifest, 8, Masking.from_manifest(manifest))
    first, second = list(stream.take(2))
    strategy = tf.distribute.get_strategy()
    initial = TFAutoModelForMaskedLM.from_config(config)
    initial(first)
    start = initial.get_weights()

    def one_step(clip_norm: float) -> tuple[list[np.ndarray], float]:
        model = TFAutoModelForMaskedLM.from_config(config)
        model(first)
        model.set_weights(start)
        optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)  # moves by exactly the gradient it is given
        dataset = tf.data.Dataset.from_tensors(first).concatenate(tf.data.Dataset.from_tensors(second))
        run = train_function(model, optimizer, strategy, False, max_predictions(128, 0.15), 2, clip_norm)
        _, reported_norm = run(iter(dataset), tf.constant(1))
        return model.get_weights(), float(reported_norm)

    weights, reported = one_step(0.0)
    unclipped = [after - initial for after, initial in zip(weights, start, strict=True)]
    norm = float(np.sqrt(sum(np.sum(np.square(delta)) for delta in unclipped)))
    assert reported == pytest.approx(norm, rel=1e-3)  # SGD at 1.0: the step is the gradient
    clip_norm = norm / 10
    weights, reported_clipped = one_step(clip_norm)
    assert reported_clipped == pytest.approx(norm, rel=1e-3)
    clipped = [after - initial for after, initial in zip(weights, start, strict=True)]
    for delta, expected in zip(clipped, unclipped, strict=True):
        np.testing.assert_allclose(delta, expected * clip_norm / norm, rtol=1e-3, atol=1e-7)


def test_evaluation_masks_each_sample_the_same_whatever_the_batch_size(embedded_shards):
    """Validation and the evaluate step score every model on the same masked positions: a sample's masks come
    from its index, not from where it sits in a batch (the micro-batch is a memory setting)."""
    manifest = read_manifest(embedded_shards["validation"])
    masking = Masking.from_manifest(manifest)
    labels = {}
    for batch_size in (7, 32):
        stream = evaluation_dataset(embedded_shards["validation"], manifest, batch_size, masking)
        labels[batch_size] = np.concatenate([batch["labels"].numpy() for batch in stream])
    assert labels[7].shape == (manifest["num_records"], manifest["max_length"])
    np.testing.assert_array_equal(labels[7], labels[32])
    share = (labels[7] >= 0).sum() / (labels[7] != -100).size
    assert 0.05 < share < 0.2  # about EVALUATION_MLM_PROBABILITY of the tokens that are not special


@pytest.mark.parametrize("dropout", [0.0, MODEL_DROPOUT])
def test_pre_training_dropout_is_the_layers_and_the_saved_config_keeps_the_model_s(tmp_path, embedded_shards, dropout):
    """--dropout 0 pre-trains without dropout (a training pass is deterministic), and the model saves its config's
    0.1 for fine-tuning; -1 (every recipe's) trains with the config's own."""
    from components.train import TrainArguments

    arguments = TrainArguments(
        output=str(tmp_path / "model"),
        tokenizer=embedded_shards["tokenizer"],
        train_shards=embedded_shards["train"],
        model_config="tiny",
        accelerator="cpu",
        dropout=dropout,
    )
    strategy = tf.distribute.get_strategy()
    plan = plan_training(arguments, strategy.num_replicas_in_sync, input_pipelines=1)
    model = start_or_resume(arguments, plan, strategy, str(tmp_path / "checkpoints")).model
    inputs = model.dummy_inputs
    training_passes = [model(inputs, training=True).logits.numpy() for _ in range(2)]
    assert np.array_equal(*training_passes) == (dropout == 0.0)
    assert model.config.hidden_dropout_prob == model.config.attention_probs_dropout_prob == 0.1  # tiny's own
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.1


def test_a_dropout_the_model_config_has_no_setting_for_is_refused_in_one_line():
    from transformers import DistilBertConfig

    with pytest.raises(InvalidParameter, match="dropout") as refused:
        pretraining_config(DistilBertConfig(), 0.0)
    assert "hidden_dropout_prob" in str(refused.value) and "\n" not in str(refused.value)
    assert pretraining_config(DistilBertConfig(), MODEL_DROPOUT).dropout == DistilBertConfig().dropout


def test_the_tuned_recipe_benchmark_widens_its_grid_past_the_best_edge_and_counts_a_diverged_rate_the_worst(
    monkeypatch,
):
    """benchmarks/recipes_tuned.py's search: three rates around the recipe's own, one more past an edge holding the
    best until the best is inside (or the widenings run out); a run the train step stops on a non-finite loss
    (exit 4) is the worst, any other failure ends the benchmark."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from recipes_tuned import TunedRecipesArguments, tuned_rate

    arguments = TunedRecipesArguments()
    best, diverges = 8e-4, 3e-3

    def train(name: str, candidate: dict, steps: int) -> dict:
        rate = candidate["learning_rate"]
        if rate > diverges:
            raise SystemExit(f"components.train failed (4): see {name}.log")
        return {"curve": [(steps, 5 + math.log(rate / best) ** 2)]}

    rate, search = tuned_rate("hf-2023", 100, train, arguments)  # its own rate 1e-4: 5e-5, 1e-4, 2e-4, then up
    assert rate == pytest.approx(8e-4) and [point["learning_rate"] for point in search] == pytest.approx(
        [5e-5, 1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3]
    )
    rate, search = tuned_rate("hf-2023", 100, train, replace(arguments, most_widenings=1))
    assert rate == pytest.approx(4e-4) and len(search) == 4  # still at the edge: the search's rates show it
    best = 5e-3  # past the divergence: the highest rate that trained is chosen, the diverged one recorded
    rate, search = tuned_rate("roberta-2019", 100, train, replace(arguments, grid_factor=4))
    assert rate == pytest.approx(2e-3)
    assert search[-1] == {"learning_rate": pytest.approx(8e-3), "validation_loss": math.inf}

    def broken(name: str, candidate: dict, steps: int) -> dict:
        raise SystemExit(f"components.train failed (1): see {name}.log")

    with pytest.raises(SystemExit, match=r"failed \(1\)"):
        tuned_rate("hf-2023", 100, broken, arguments)
