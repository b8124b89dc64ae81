"""What the project saves loads in transformers 5 (PyTorch only) as it is, with every weight, and computes what
the TF model computes. The PyTorch side runs in the tests' second environment (tests/pytorch_env.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import train_tiny
from pytorch_env import run_pytorch
from safetensors import safe_open

from components.evaluate import fill_mask_examples
from components.lib.errors import InvalidParameter
from components.lib.modeling import model_config
from components.lib.pytorch_weights import (
    TF_LOADING,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    load_tf_masked_lm,
    pytorch_state_dict,
    save_model_folder,
    write_pytorch_weights,
)
from components.lib.shard_set import read_manifest
from components.lib.tokenization import load_tokenizer

# the tests of the files that read the tiny model in one process: the others need not wait on its making
pytestmark = pytest.mark.xdist_group("tiny_model")

SENTENCES = ["The function returns a <mask> of values.", "The <mask> statement is used to leave a loop."]
TEXTS = ["The for statement iterates over the items of a sequence.", "A short one."]  # the second is padded


@pytest.fixture(scope="module")
def trained(tiny_model) -> str:
    """A tiny model the train step trained for long enough to predict something other than its initialisation."""
    return str(tiny_model)


@pytest.fixture(scope="module")
def untrained(tmp_path_factory, embedded_shards) -> str:
    """A tiny model folder saved the project's way, straight from its config (no training: fast tests)."""
    from transformers import TFAutoModelForMaskedLM

    model = TFAutoModelForMaskedLM.from_config(model_config("tiny", read_manifest(embedded_shards["train"])))
    model(model.dummy_inputs, training=False)
    folder = tmp_path_factory.mktemp("untrained") / "model"
    save_model_folder(model, load_tokenizer(embedded_shards["tokenizer"])[0], folder)
    return str(folder)


def batch_of(folder: str) -> dict[str, list]:
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(folder)(TEXTS, padding=True, return_tensors="np")
    assert encoded["attention_mask"].min() == 0, "the batch must have padding"
    return {"input_ids": encoded["input_ids"].tolist(), "attention_mask": encoded["attention_mask"].tolist()}


def tf_outputs(folder: str, batch: dict[str, list]) -> tuple[np.ndarray, np.ndarray]:
    """The TF model's logits and last hidden states on ``batch``, loaded the project's way."""
    model = load_tf_masked_lm(Path(folder), "model", folder)
    outputs = model(**{key: np.array(value) for key, value in batch.items()}, output_hidden_states=True)
    return outputs.logits.numpy(), outputs.hidden_states[-1].numpy()


def assert_close(pytorch: list, tf: np.ndarray) -> None:
    """Equal to 1e-4 of the values' scale, padding positions included."""
    difference = np.abs(np.array(pytorch, dtype=np.float32) - tf).max()
    assert difference <= 1e-4 * np.abs(tf).max(), f"max difference {difference} at scale {np.abs(tf).max()}"


def assert_loads_with_every_weight(answer: dict) -> None:
    assert answer["class"] == "RobertaForMaskedLM" and answer["encoder_class"] == "RobertaModel"
    assert answer["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    encoder = answer["encoder_loading"]  # the encoder alone leaves the LM head out, as with any MLM checkpoint
    assert encoder["missing_keys"] == encoder["mismatched_keys"] == []
    assert encoder["unexpected_keys"] and all(key.startswith("lm_head.") for key in encoder["unexpected_keys"])
    assert answer["decoder_tied"], "the LM head's decoder must be the word embeddings, as PyTorch ties them"
    assert answer["dtype"] == "torch.float32"


def check_equal_to_tf(folder: str, with_fill_mask: bool = True) -> dict:
    batch = batch_of(folder)
    request = {"model": folder, "batch": batch}
    if with_fill_mask:
        request.update(sentences=SENTENCES, top_k=5)
    answer = run_pytorch(request)
    assert_loads_with_every_weight(answer)
    logits, hidden = tf_outputs(folder, batch)
    assert_close(answer["logits"], logits)
    assert_close(answer["hidden"], hidden)  # AutoModel: the encoder's states, what embeddings are made from
    return answer


@pytest.mark.slow
def test_the_train_step_s_model_loads_in_transformers_5_and_predicts_as_the_tf_model(trained):
    answer = check_equal_to_tf(trained)
    tf_model = load_tf_masked_lm(Path(trained), "model", trained)
    tokenizer, _ = load_tokenizer(trained, "model")
    tf_predictions = fill_mask_examples(tf_model, tokenizer, SENTENCES, top_k=5)
    for tf_example, pytorch_predictions in zip(tf_predictions, answer["fill_mask"], strict=True):
        assert [p["token"] for p in pytorch_predictions] == [p["token"] for p in tf_example["predictions"]]
        for pytorch, tf in zip(pytorch_predictions, tf_example["predictions"], strict=True):
            assert abs(pytorch["score"] - tf["score"]) < 1e-4


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_the_model_s_tokenizer_says_the_length_it_was_trained_on(trained, embedded_shards):
    config = json.loads(Path(trained, "tokenizer_config.json").read_text())
    assert config["model_max_length"] == read_manifest(embedded_shards["train"])["max_length"]


def test_the_pytorch_weights_are_named_and_laid_out_for_pytorch(untrained):
    config = json.loads(Path(untrained, "config.json").read_text())
    assert config["architectures"] == ["RobertaForMaskedLM"]
    with safe_open(Path(untrained, WEIGHTS_FILE), framework="numpy") as weights:
        assert weights.metadata() == {"format": "pt"}
        names = set(weights.keys())
        tensors = {name: weights.get_tensor(name) for name in names}
    assert {
        "roberta.embeddings.word_embeddings.weight",
        "roberta.embeddings.LayerNorm.weight",
        "roberta.encoder.layer.1.attention.self.query.weight",
        "roberta.encoder.layer.1.output.LayerNorm.bias",
        "lm_head.dense.weight",
        "lm_head.layer_norm.weight",
        "lm_head.bias",
    } <= names
    assert not any(":0" in name or "/" in name or "decoder" in name for name in names)
    assert all(tensor.dtype == np.float32 for tensor in tensors.values())
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    assert tensors["roberta.encoder.layer.0.intermediate.dense.weight"].shape == (intermediate, hidden)  # (out, in)
    tf_model = load_tf_masked_lm(Path(untrained), "model", untrained)
    tf_kernel = next(w for w in tf_model.weights if "layer_._0/intermediate/dense/kernel" in w.name).numpy()
    np.testing.assert_array_equal(tensors["roberta.encoder.layer.0.intermediate.dense.weight"], tf_kernel.T)
    assert len(names) == len(tf_model.weights)  # every TF weight, none twice


@pytest.mark.slow
def test_a_roberta_base_shaped_model_and_a_bf16_run_convert_exactly(tmp_path, embedded_shards):
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    manifest = read_manifest(embedded_shards["train"])
    tokenizer, _ = load_tokenizer(embedded_shards["tokenizer"])
    model = TFAutoModelForMaskedLM.from_config(model_config("roberta-base", manifest))  # random weights
    model(model.dummy_inputs, training=False)
    save_model_folder(model, tokenizer, tmp_path / "base")
    check_equal_to_tf(str(tmp_path / "base"), with_fill_mask=False)

    train_tiny(tmp_path / "bf16", embedded_shards, per_replica_batch_size=8, max_steps=4, bf16=True)
    tf.keras.mixed_precision.set_global_policy("float32")  # the train step set bfloat16 for this process
    with safe_open(tmp_path / "bf16" / WEIGHTS_FILE, framework="numpy") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {np.dtype(np.float32)}  # noqa: SIM118
    check_equal_to_tf(str(tmp_path / "bf16"), with_fill_mask=False)


@pytest.mark.slow
def test_a_model_above_the_shard_size_is_sharded_with_the_index_the_hub_expects(tmp_path, trained):
    folder = tmp_path / "sharded"
    model = load_tf_masked_lm(Path(trained), "model", trained)
    model.save_pretrained(folder)
    load_tokenizer(trained, "model")[0].save_pretrained(folder)
    total = sum(array.nbytes for array in pytorch_state_dict(model).values())
    written = write_pytorch_weights(model, folder, max_shard_bytes=total // 3)
    shards = [name for name in written if name != WEIGHTS_INDEX_FILE]
    assert len(shards) >= 3 and WEIGHTS_INDEX_FILE in written and not (folder / WEIGHTS_FILE).exists()
    index = json.loads((folder / WEIGHTS_INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"].values()) == set(shards)
    check_equal_to_tf(str(folder), with_fill_mask=False)

    write_pytorch_weights(model, folder)  # one file again: the shards and their index are gone
    assert sorted(p.name for p in folder.glob("model*")) == [WEIGHTS_FILE]


def test_the_project_loads_tf_weights_beside_pytorch_ones_where_plain_loading_fails(untrained):
    from transformers import TFAutoModelForMaskedLM, pipeline

    with pytest.raises(TypeError, match="not iterable"):  # the trap: transformers 4.57 picks model.safetensors
        TFAutoModelForMaskedLM.from_pretrained(untrained)
    logits, _ = tf_outputs(untrained, batch_of(untrained))
    assert np.isfinite(logits).all()
    fill = pipeline("fill-mask", model=untrained, framework="tf", dtype=None, model_kwargs=TF_LOADING)
    assert len(fill("The <mask> statement.", top_k=3)) == 3


def test_a_folder_without_tf_weights_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidParameter, match=r"^--model='gs://b/m': holds no TF model weights \(tf_model.h5\)$"):
        load_tf_masked_lm(tmp_path, "model", "gs://b/m")
