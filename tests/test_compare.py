"""tpu-mlm compare: two models on the same masked samples, the paired difference of their losses and its error,
through the command; the tiny model the train step wrote against itself and against its random twin."""

import json
import shutil

import pytest
from conftest import run_module

from components.compare import CompareArguments, ratio_and_error
from components.lib.errors import InvalidParameter

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("trained")]  # reads the tiny model, made once


def random_twin(model, folder):
    """A model of the tiny model's config with fresh weights, beside its tokenizer: what pre-training started from."""
    from transformers import AutoConfig, TFAutoModelForMaskedLM

    twin = TFAutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(model))
    twin(twin.dummy_inputs)
    twin.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model / name).exists():
            shutil.copy(model / name, folder / name)
    return folder


def test_a_model_is_compared_on_the_same_masks_with_a_paired_error(tmp_path, tiny_model, embedded_shards):
    shards = embedded_shards["validation"]
    itself = run_module(
        "components.compare",
        *("--model", str(tiny_model), "--baseline", str(tiny_model), "--shards", shards),
        *("--output", str(tmp_path / "itself"), "--max_batches", "0", "--json"),
    )
    assert itself.returncode == 0, itself.stderr[-3000:]
    same = json.loads(itself.stdout)
    assert (
        same["difference"] == 0 and same["paired_standard_error"] == 0 and same["model_loss"] == same["baseline_loss"]
    )

    twin = random_twin(tiny_model, tmp_path / "twin")
    against = run_module(
        "components.compare",
        *("--model", str(tiny_model), "--baseline", str(twin), "--shards", shards),
        *("--output", str(tmp_path / "twin-comparison"), "--max_batches", "0"),
    )
    assert against.returncode == 0, against.stderr[-3000:]
    result = json.loads((tmp_path / "twin-comparison" / "comparison.json").read_text())
    assert result["difference"] == pytest.approx(result["model_loss"] - result["baseline_loss"])
    # the pairing leaves out how hard each sample is for both: its error is at most that of two models scored apart
    apart = (result["model_standard_error"] ** 2 + result["baseline_standard_error"] ** 2) ** 0.5
    assert result["paired_standard_error"] < apart
    assert result["z"] < -2 and "the model is better" in against.stdout


def test_the_ratio_s_error_is_the_delta_method_s_and_bad_settings_are_refused(tmp_path):
    ratio, error = ratio_and_error([2.0, 4.0, 6.0], [1.0, 2.0, 2.0])
    assert ratio == 12 / 5 and error == pytest.approx(((0.4**2 + 0.8**2 + 1.2**2) * 3 / 2) ** 0.5 / 5)
    with pytest.raises(InvalidParameter, match="--batch-size=0: must be a positive whole number"):
        CompareArguments(model="a", baseline="b", shards="s", output=str(tmp_path), batch_size=0)
