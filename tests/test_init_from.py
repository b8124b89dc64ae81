"""Continuing a model's pre-training (``--init_from``): a tiny RoBERTa with a byte-level BPE tokenizer and a tiny BERT
with WordPiece, made here, from a folder, from ``gs://`` through the storage stand-in and from the Hub stand-in;
their tokenizers used as they are, their weights kept by a run at a tiny rate and improved on by a real one; and
each refusal before any training."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import HUB_TOKEN, LONG_TEST_SECONDS, TINY_TRAINING, made_once, run_module

from components.compare import CompareArguments, compare
from components.lib import storage
from components.lib.base_model import check_base_model, pinned_by_tokenizer
from components.lib.errors import InvalidParameter
from components.lib.training_plan import plan_training
from components.shards import ShardArguments, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer
from components.train import TrainArguments, train

VOCAB_SIZE = 800
MAX_LENGTH = 32


def embedded_texts() -> list[str]:
    from components.lib.corpus import Corpus, CorpusSpec

    return list(Corpus(CorpusSpec(corpus="embedded")))


def save_roberta(folder: Path, positions: int = 66, head: bool = True, vocab_size: int = 0) -> None:
    """A tiny RoBERTa masked-LM model (bare encoder without ``head``) with a byte-level BPE tokenizer of the
    embedded corpus, as ``save_pretrained`` writes them; ``vocab_size``: its embeddings (0: the tokenizer's)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaTokenizerFast, TFRobertaForMaskedLM, TFRobertaModel

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(embedded_texts(), VOCAB_SIZE, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder.mkdir(parents=True)
    bpe.save_model(str(folder))
    tokenizer = RobertaTokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"))
    tokenizer.save_pretrained(folder)
    config = RobertaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = (TFRobertaForMaskedLM if head else TFRobertaModel)(config)
    model(model.dummy_inputs)
    model.save_pretrained(folder, safe_serialization=False)


def save_bert(folder: Path) -> None:
    """A tiny BERT masked-LM model with a lowercasing WordPiece tokenizer of the embedded corpus."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertConfig, BertTokenizerFast, TFBertForMaskedLM

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(embedded_texts(), VOCAB_SIZE)
    folder.mkdir(parents=True)
    wordpiece.save_model(str(folder))
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))
    tokenizer.save_pretrained(folder)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = TFBertForMaskedLM(config)
    model(model.dummy_inputs)
    model.save_pretrained(folder, safe_serialization=False)


@pytest.fixture(scope="session")
def base_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model folders made once per test run: ``roberta`` and ``bert`` to continue, and ones to refuse."""

    def make(root: Path) -> None:
        save_roberta(root / "roberta")
        save_bert(root / "bert")
        save_roberta(root / "bare-encoder", head=False)
        save_roberta(root / "few-embeddings", vocab_size=VOCAB_SIZE // 2)
        save_roberta(root / "no-tf-weights")
        (root / "no-tf-weights" / "tf_model.h5").unlink()
        save_roberta(root / "headless-weights", head=False)  # a config that says it has the head its file lacks
        config = json.loads((root / "headless-weights" / "config.json").read_text())
        config["architectures"] = ["RobertaForMaskedLM"]
        (root / "headless-weights" / "config.json").write_text(json.dumps(config))

    root = made_once(tmp_path_factory, "base-models", make)
    return {path.name: path for path in root.iterdir()}


def weights(folder: Path | str) -> dict[str, np.ndarray]:
    """The arrays of a folder's ``tf_model.h5`` by name, less the model object's own (``tf_roberta_for_masked_lm_1``
    when another was built in the process before)."""
    import h5py

    arrays: dict[str, np.ndarray] = {}

    def keep(name: str, item: object) -> None:
        if isinstance(item, h5py.Dataset):
            arrays[re.sub(r"^([^/]+)/[^/]+/", r"\1/", name)] = item[()]

    with h5py.File(Path(folder, "tf_model.h5"), "r") as file:
        file.visititems(keep)
    return arrays


def adapted(tmp_path: Path, init_from: str, **settings) -> dict:
    """The tokenizer, shards (training, and the held-out 5%) and train steps of a run continued from ``init_from``,
    as the pipeline chains them; returns the folders and the training summary."""
    tokenizer = str(tmp_path / "tokenizer")
    summary = train_tokenizer(TokenizerArguments(output=tokenizer, init_from=init_from))
    shards = {}
    for split, holdout in (("train", "exclude"), ("validation", "only")):
        shards[split] = str(tmp_path / split)
        write_shards(
            ShardArguments(
                output=shards[split],
                tokenizer=tokenizer,
                corpus="embedded",
                split=split,
                max_length=MAX_LENGTH,
                holdout_fraction=0.05,
                holdout=holdout,
            )
        )
    arguments = {**TINY_TRAINING, "max_steps": 2, "log_every_steps": 1, **settings}
    del arguments["model_config"]  # the base model's config is the model's
    model = str(tmp_path / "model")
    trained = train(
        TrainArguments(
            output=model, tokenizer=tokenizer, train_shards=shards["train"], init_from=init_from, **arguments
        )
    )
    return {"tokenizer": tokenizer, "tokenizer_summary": summary, **shards, "model": model, "summary": trained}


@pytest.mark.slow  # two base models, each continued at a tiny and a real rate (about a minute)
@pytest.mark.parametrize("kind", ["roberta", "bert"])
def test_a_model_continues_from_its_own_weights_and_tokenizer_and_a_real_rate_improves_it(tmp_path, base_models, kind):
    from transformers import AutoTokenizer

    base = base_models[kind]
    kept = adapted(tmp_path / "kept", str(base), learning_rate=1e-9, warmup_steps=1)
    base_tokenizer = AutoTokenizer.from_pretrained(base)
    assert kept["tokenizer_summary"]["init_from"] == str(base)
    manifest = json.loads(Path(kept["train"], "manifest.json").read_text())
    # the tokenizer as it is, byte for byte; the shards' and the trained model's vocabulary and class, the base's own
    assert Path(kept["tokenizer"], "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    for name in ("tokenizer", "model"):
        loaded = AutoTokenizer.from_pretrained(kept[name])
        assert loaded.get_vocab() == base_tokenizer.get_vocab() and type(loaded) is type(base_tokenizer), name
    # masking takes the tokenizer's own special tokens: BERT's [MASK] and [CLS]/[SEP], RoBERTa's <mask> and <s>/</s>
    assert manifest["special_tokens"]["mask"] == base_tokenizer.mask_token_id
    assert manifest["special_tokens"]["pad"] == base_tokenizer.pad_token_id
    assert {manifest["special_tokens"][role] for role in ("cls", "sep")} == {
        base_tokenizer.cls_token_id,
        base_tokenizer.sep_token_id,
    }
    saved_config = json.loads(Path(kept["model"], "config.json").read_text())
    base_config = json.loads((base / "config.json").read_text())
    for key in ("model_type", "hidden_size", "vocab_size", "max_position_embeddings", "pad_token_id"):
        assert saved_config[key] == base_config[key], key
    before, after = weights(base), weights(kept["model"])
    assert before.keys() == after.keys()
    for name, value in before.items():  # two steps at 1e-9: the base's weights within rounding
        np.testing.assert_allclose(after[name], value, atol=1e-6, err_msg=name)

    improved = adapted(tmp_path / "improved", str(base), learning_rate=2e-3, max_steps=40, log_every_steps=20)
    assert improved["summary"]["total_steps"] == 40
    assert improved["summary"]["base_model"] == str(base)  # what the push reads the base's license from
    # no recipe named: the one published for continuing a model, recorded by its name
    trained_with = improved["summary"]["arguments"]
    assert (trained_with["recipe"], trained_with["warmup_fraction"], trained_with["mlm_probability"]) == (
        "dapt-2020",
        0.0,
        0.15,
    )
    result = compare(
        CompareArguments(
            model=improved["model"], baseline=kept["model"], shards=kept["validation"], output=str(tmp_path / "cmp")
        )
    )
    assert result["difference"] < 0 and result["z"] < -2, result  # lower held-out loss than the base, beyond chance

    if kind == "bert":  # the probe's third model, the base as it was (BERT's: token type ids, a pooler of its own)
        from components.downstream import DownstreamArguments, downstream
        from components.lib.results import BASE_MODEL

        probe = downstream(
            DownstreamArguments(
                **{"model": kept["model"], "output": str(tmp_path / "probe"), "seeds": "1", "learning_rates": "1e-3"},
                **{"min_steps": 8, "max_steps": 8, "max_train_samples": 128, "max_eval_samples": 64},
            )
        )
        task = probe["tasks"][0]
        assert set(probe["average"]) == {"pre-trained", "random init", BASE_MODEL}
        # the kept model's weights are the base's within 1e-6: fine-tuned alike, they learn alike, and the twin not
        losses = {model: task[model]["runs"][0]["mean_train_loss"] for model in probe["average"]}
        assert losses["pre-trained"] == pytest.approx(losses[BASE_MODEL], rel=1e-6)
        assert losses["random init"] != pytest.approx(losses[BASE_MODEL], rel=1e-6)
        assert task["adaptation_gain"] == task["pre-trained"]["score"] - task[BASE_MODEL]["score"]
        report = Path(tmp_path / "probe" / "report.md").read_text()
        assert f"| {BASE_MODEL} | adaptation gain |" in report and "base this one continued" not in report


@pytest.mark.slow  # the steps' own processes against the Hub stand-in (about 20 s)
def test_a_private_hub_model_at_a_revision_and_a_bucket_folder_give_their_tokenizer(
    tmp_path, base_models, hub, gcs, gcs_server, monkeypatch
):
    import huggingface_hub.constants
    from huggingface_hub import HfApi

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # the commit URLs this process parses
    api = HfApi(endpoint=hub.url, token=HUB_TOKEN)
    api.create_repo("user/tiny-roberta", private=True)
    first = api.upload_folder(repo_id="user/tiny-roberta", folder_path=base_models["roberta"]).oid
    second = api.upload_folder(repo_id="user/tiny-roberta", folder_path=base_models["bert"]).oid  # main: a BERT now

    outputs: list[str] = []

    def tokenizer_step(init_from: str, env: dict) -> tuple[int, str, dict | None]:
        """The tokenizer step's own process, into a folder of its own (the last of ``outputs``)."""
        outputs.append(str(tmp_path / f"tokenizer-{len(outputs)}"))
        done = run_module("components.tokenizer", "--init_from", init_from, "--output", outputs[-1], env=env)
        summary = Path(outputs[-1], "tokenizer_summary.json")
        return done.returncode, done.stderr, json.loads(summary.read_text()) if summary.exists() else None

    status, _, summary = tokenizer_step(f"hf:user/tiny-roberta@{first}", hub.env)
    assert status == 0 and summary["tokenizer_class"] == "RobertaTokenizerFast"  # the revision's, not main's
    status, _, summary = tokenizer_step("hf:user/tiny-roberta", hub.env)
    assert status == 0 and summary["tokenizer_class"] == "BertTokenizerFast"
    # main pinned to the commit it names now: preflight and the train step read that one, whatever main does after
    assert summary["init_from_pinned"] == f"hf:user/tiny-roberta@{second}"
    assert pinned_by_tokenizer("hf:user/tiny-roberta", outputs[-1]) == f"hf:user/tiny-roberta@{second}"
    assert pinned_by_tokenizer("hf:user/other", outputs[-1]) == "hf:user/other"  # another run's tokenizer: as given
    status, stderr, summary = tokenizer_step("hf:user/tiny-roberta@v9", hub.env)
    assert status == 2 and summary is None
    assert "--init-from='hf:user/tiny-roberta@v9': user/tiny-roberta has no revision 'v9'" in stderr
    without_token = {name: value for name, value in hub.env.items() if name != "HF_TOKEN"}
    status, stderr, summary = tokenizer_step("hf:user/tiny-roberta", without_token)
    assert status == 2 and summary is None
    assert "no such Hub model repository, or it needs a token in HF_TOKEN that may read it" in stderr

    # what preflight asks before a TPU run, whose job has no Hub token: a private model cannot be read without one
    api.create_repo("user/public-roberta", private=False)
    api.upload_folder(repo_id="user/public-roberta", folder_path=base_models["roberta"])
    readable = "from components.lib.base_model import readable_without_token as r; print(r('hf:user/{}'))"
    api.create_repo("user/gated-roberta", private=False)
    api.upload_folder(repo_id="user/gated-roberta", folder_path=base_models["roberta"])
    hub.repos["user/gated-roberta"].gated = "manual"  # its owner's setting: its files for those granted them
    for repo, expected in (("tiny-roberta", "False"), ("public-roberta", "True"), ("gated-roberta", "False")):
        asked = subprocess.run(
            [sys.executable, "-c", readable.format(repo)], env=hub.env, capture_output=True, text=True, check=True
        )
        assert asked.stdout.strip() == expected, (repo, asked.stderr[-2000:])
    storage.upload_folder(base_models["bert"], gcs + "/bert")
    status, _, summary = tokenizer_step(gcs + "/bert", {**hub.env, **gcs_server})
    assert status == 0 and summary["tokenizer_class"] == "BertTokenizerFast" and summary["vocab_size"] == VOCAB_SIZE


@pytest.mark.parametrize(
    ("model", "max_length", "message"),
    [
        ("bare-encoder", None, "was saved as RobertaModel, without a masked-LM head to continue"),
        ("few-embeddings", None, "its tokenizer has 800 tokens, more than the model's 400 embeddings"),
        ("no-tf-weights", None, "holds no weights read here (tf_model.h5, or PyTorch's model.safetensors)"),
        ("roberta", 65, "--max-length=65: is more than {folder} takes (64 tokens: its position embeddings)"),
        ("bert", 65, "--max-length=65: is more than"),
        ("missing", None, "is not a model folder (no config.json in it)"),
        ("distilbert", None, "is a 'distilbert' model; the masked-LM loss here takes the head of roberta, bert"),
        ("gpt2", None, "is a 'gpt2' model, which has no TensorFlow masked-LM model here"),
    ],
)
@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_a_base_model_that_cannot_be_continued_is_refused_in_one_line(
    base_models, tmp_path, model, max_length, message
):
    folder = base_models.get(model, tmp_path / model)
    if model in ("distilbert", "gpt2"):  # a config is all it takes to be refused
        folder.mkdir()
        architecture = {"distilbert": "DistilBertForMaskedLM", "gpt2": "GPT2LMHeadModel"}[model]
        (folder / "config.json").write_text(json.dumps({"model_type": model, "architectures": [architecture]}))
    with pytest.raises(InvalidParameter) as refused:
        check_base_model(str(folder), max_length)
    assert message.format(folder=folder) in str(refused.value) and "\n" not in str(refused.value)


def test_the_bounds_of_a_base_model_s_positions_are_its_own(base_models):
    # RoBERTa numbers positions from its pad id + 1: 66 positions take 64 tokens; BERT's 64 take 64
    check_base_model(str(base_models["roberta"]), 64)
    check_base_model(str(base_models["bert"]), 64)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("hf:roberta-base", "a Hub model is written hf:NAMESPACE/NAME[@REVISION]"),
        ("hf:user/model@", "names no revision after '@'"),
        ("s3://bucket/model", "unsupported URI scheme"),
    ],
)
def test_an_init_from_of_no_known_form_is_refused_by_every_step_that_takes_it(value, message, tmp_path):
    for arguments in (
        lambda: TokenizerArguments(output=str(tmp_path / "t"), init_from=value),
        lambda: TrainArguments(output=str(tmp_path / "m"), tokenizer="t", train_shards="s", init_from=value),
    ):
        with pytest.raises(InvalidParameter, match="--init-from") as refused:
            arguments()
        assert message in str(refused.value)


def test_shards_of_another_tokenizer_than_the_base_model_s_are_refused_before_training(
    tmp_path, base_models, embedded_shards
):
    settings = TrainArguments(
        output=str(tmp_path / "model"),
        tokenizer=embedded_shards["tokenizer"],
        train_shards=embedded_shards["train"],
        init_from=str(base_models["roberta"]),
    )
    with pytest.raises(InvalidParameter, match=r"--tokenizer=.*is not .*'s tokenizer: make the shards with"):
        plan_training(settings, num_replicas=1)  # what preflight and the train step check before any TPU time


@pytest.mark.parametrize(
    ("init_from", "base_model", "shown"),
    [
        ("hf:FacebookAI/roberta-base@main", "FacebookAI/roberta-base", "hf:FacebookAI/roberta-base@main"),
        ("gs://b/m/base", None, "(left out)"),
    ],
)
def test_the_card_of_a_continued_model_names_its_base_and_no_bucket(init_from, base_model, shown):
    import yaml

    from components.lib.model_card import CARD_HYPERPARAMETERS, model_card, public_summary

    pinned = f"{init_from[: -len('@main')]}@{'c0ffee' * 6}abcd" if base_model else init_from
    summary = {
        "base_model": pinned,
        "arguments": {key: 1 for key in CARD_HYPERPARAMETERS}
        | {"model_config": "roberta-base", "init_from": init_from, "dropout": -1},
        "corpus": {"source": "gs://b/corpus/*.txt"},
        **{"global_batch_size": 2048, "total_steps": 650, "samples": 1, "tokens": 128, "replicas": 8},
        **{"accelerator": "tpu", "num_parameters": 1, "tokenizer_fingerprint": "sha256:0"},
        **{"first_loss": 9.0, "last_loss": 2.0, "history": [{"step": 1}, {"step": 650}], "steps_this_run": 650},
    }
    config = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}
    summary = public_summary(summary)  # what push gives the card
    card = model_card("me/legal-bert", summary, {**config, "intermediate_size": 3072, "vocab_size": 30522}, None)
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata.get("base_model") == base_model and "bert" in metadata["tags"]  # the Hub's family tree
    # a Hub base at the commit its revision was pinned to; a folder's place nowhere
    base = f"`{shown}` at commit `{'c0ffee' * 6}abcd`" if base_model else "a model folder (its place left out)"
    assert f"continued from the weights of {base}" in card and "from scratch" not in card
    assert "30,522 tokens (the base model's tokenizer)" in card and "Unigram" not in card
    assert f"| init_from | {shown} |" in card and "model_config" not in card and "gs://" not in card


def test_weights_that_lack_the_head_their_config_names_are_refused_not_started_from_random(base_models):
    from components.lib.base_model import load_base_weights

    folder = str(base_models["headless-weights"])
    base = check_base_model(folder)  # the config and tokenizer pass: only the weights tell
    with pytest.raises(InvalidParameter, match=r"tf_model\.h5 lacks \d+ of the masked-LM model's weights .*lm_head"):
        load_base_weights(folder, base.config)


def test_a_resume_onto_checkpoints_of_another_base_model_is_refused(tmp_path):
    from components.lib.training_plan import CHECKPOINT_IDENTITY_FILE, check_checkpoints_match

    identity = {"model_config": {"hidden_size": 32}, "tokenizer_fingerprint": "sha256:0", "recipe": {}}
    (tmp_path / CHECKPOINT_IDENTITY_FILE).write_text(json.dumps({**identity, "init_from": "hf:user/legal@abc"}))
    check_checkpoints_match(str(tmp_path), {**identity, "init_from": "hf:user/legal@abc"})
    for other in ({**identity, "init_from": "hf:user/medical"}, identity):  # another base, or from scratch
        with pytest.raises(InvalidParameter, match=r"holds checkpoints of another model \(init_from differ"):
            check_checkpoints_match(str(tmp_path), other)
    # submit's resume, before the tokenizer step pins a revision: the same model's name passes, another's does not
    before_data = {"model_config": {}, "recipe": {}}
    check_checkpoints_match(str(tmp_path), {**before_data, "init_from": "hf:user/legal"})
    with pytest.raises(InvalidParameter, match=r"init_from differ"):
        check_checkpoints_match(str(tmp_path), {**before_data, "init_from": "hf:user/medical"})


def test_a_from_scratch_roberta_refuses_a_tokenizer_without_roberta_s_special_ids():
    from components.lib.modeling import model_config

    wordpiece = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103, "bos": None, "eos": None}
    with pytest.raises(InvalidParameter, match=r"--model-config='mini': is a roberta model, which needs .*init_from"):
        model_config("mini", {"vocab_size": 800, "max_length": 32, "special_tokens": wordpiece})


def test_the_estimate_of_a_continued_run_sizes_the_base_model_and_copies_its_tokenizer(tmp_path, base_models):
    """The estimate and submit's dry run count the run that will happen: the base's model whatever model_config
    says, tokens per byte measured with its tokenizer, a tokenizer step that only copies it, dapt-2020's masking."""
    from components.lib.estimates import (
        CPU_TASK_START_HOURS,
        DEFAULT_PROBE,
        EstimateArguments,
        estimate_run,
        estimate_table,
    )
    from pipelines.pipeline import routed_values

    base = str(base_models["roberta"])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(embedded_texts()) + "\n")
    common = {"corpus": str(corpus), "max_length": MAX_LENGTH, "per_replica_batch_size": 8}
    continued = estimate_run(EstimateArguments(**common, model_config="roberta-base", init_from=base), DEFAULT_PROBE)
    # the base's config, read as a config file and measured with its own tokenizer, is the same run
    as_config = estimate_run(
        EstimateArguments(**common, model_config=f"{base}/config.json", tokenizer=base), DEFAULT_PROBE
    )
    # but for the probe, which fine-tunes a third model, the base as it was, at the model's rates
    assert continued["probe"]["fine_tunings"] == 3 * as_config["probe"]["fine_tunings"] // 2
    for key in ("parameters", "model_flops_per_token", "steps", "samples"):
        assert continued[key] == as_config[key], key
    assert continued["data"]["tokens_per_byte"] == as_config["data"]["tokens_per_byte"] != 0.312
    assert (
        continued["data"]["vocab_size"]
        == json.loads((base_models["roberta"] / "config.json").read_text())["vocab_size"]
    )
    # its tokenizer step copies files (a task's start); one from scratch trains on the corpus's sample
    tokenizer_hours = {
        name: next(step["hours"] for step in run["cpu_steps"] if step["step"] == "tokenizer")
        for name, run in (("continued", continued), ("scratch", as_config))
    }
    assert tokenizer_hours["continued"] == CPU_TASK_START_HOURS < tokenizer_hours["scratch"]
    # dapt-2020 masks 15% where the default's masking starts at 30%: a smaller head to hold in memory
    at_default = estimate_run(EstimateArguments(**common, init_from=base, recipe="roberta-2019-mask-decay-clip"))[
        "memory"
    ]
    assert continued["memory"]["largest_per_replica_batch"] > at_default["largest_per_replica_batch"]
    assert f"{base}, continued" in estimate_table(continued)
    # a dry run reads nothing, of the corpus or the base: sized as model_config says, tokens per byte assumed, the
    # tokenizer step still a copy
    size = corpus.stat().st_size
    embeddings = json.loads((base_models["roberta"] / "config.json").read_text())["vocab_size"]
    offline = {**common, "corpus_bytes": size, "offline": True, "vocab_size": embeddings}
    dry = estimate_run(EstimateArguments(**offline, init_from="hf:nobody/nothing", model_config=f"{base}/config.json"))
    assert dry["parameters"] == continued["parameters"] and dry["data"]["tokens_per_byte"] == 0.312
    assert next(step for step in dry["cpu_steps"] if step["step"] == "tokenizer")["hours"] == CPU_TASK_START_HOURS
    assert "hf:nobody/nothing, continued, sized as" in estimate_table(dry)
    with pytest.raises(InvalidParameter, match="--max-length=80: is more than"):
        estimate_run(EstimateArguments(**{**common, "max_length": 80}, init_from=base))
    # submit gives the estimate the pipeline's init_from
    assert routed_values({"init_from": "hf:user/model"}, EstimateArguments) == {"init_from": "hf:user/model"}


def test_a_continued_model_is_published_under_its_base_s_license_unless_another_is_given(tmp_path, base_models):
    """The base's card's license (and an ``other`` license's name and link) is the card's where the push is given
    none; one given is stated beside the base's where they differ; a base that cannot be read needs one given."""
    import yaml

    from components.lib.base_model import base_license
    from components.lib.model_card import license_line, model_card
    from components.push import PushArguments, base_terms

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_bytes((base_models["roberta"] / "config.json").read_bytes())
    assert base_license(str(base)) == {}  # save_pretrained writes no card
    (base / "README.md").write_text(
        "---\nlicense: other\nlicense_name: llama3\nlicense_link: https://example.org/LICENSE\ntags: [x]\n---\n# Base\n"
    )
    terms = base_license(str(base))
    assert terms == {"license": "other", "license_name": "llama3", "license_link": "https://example.org/LICENSE"}
    summary = {
        "arguments": {"model_config": "roberta-base", "init_from": "hf:meta/base"},
        "corpus": {"source": "embedded"},
        **{"global_batch_size": 8, "total_steps": 2, "samples": 1, "tokens": 128, "replicas": 1},
        **{"accelerator": "cpu", "num_parameters": 1, "tokenizer_fingerprint": "sha256:0"},
        **{"first_loss": 9.0, "last_loss": 2.0, "history": [{"step": 1}], "steps_this_run": 2},
    }
    config = {"model_type": "roberta", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}
    config |= {"intermediate_size": 8, "vocab_size": 10}
    card = model_card("me/m", summary, config, None, "", None, terms)
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert (metadata["license"], metadata["license_name"], metadata["license_link"]) == tuple(terms.values())
    assert "- license: llama3 (the base model's, as its card states it)" in card
    given = yaml.safe_load(model_card("me/m", summary, config, None, "apache-2.0", None, terms).split("---\n")[1])
    assert given["license"] == "apache-2.0" and "license_name" not in given
    assert license_line("apache-2.0", {"license": "mit"}) == "apache-2.0; the base model's card states mit"
    assert license_line("mit", {"license": "mit"}) == "mit" and license_line("", {}) == "not stated by the publisher"
    # the push reads the base it trained from; one it cannot read now does not stop it: the card says so
    pushing = {"model": str(tmp_path / "model"), "repo_id": "me/m"}
    assert base_terms(str(base), PushArguments(**pushing)) == terms
    unread = base_terms(str(tmp_path / "deleted-base"), PushArguments(**pushing))
    assert set(unread) == {"unread"} and "is not a model folder" in unread["unread"]
    assert (
        license_line("", unread) == "not stated by the publisher (the base model's card could not be read at the push)"
    )
    assert license_line("mit", unread) == "mit"
    # what is not a Hub license id, or a link into the base's own repository, is not carried over
    (base / "README.md").write_text("---\nlicense: [mit, apache-2.0]\n---\n")
    assert base_license(str(base)) == {}
    (base / "README.md").write_text("---\nlicense: other\nlicense_name: Our Terms\nlicense_link: LICENSE.md\n---\n")
    assert base_license(str(base)) == {"license": "other"}


@pytest.mark.slow  # a model made and saved by PyTorch in the tests' second environment (about 15 s)
def test_a_model_with_pytorch_weights_only_is_continued_from_them_read_with_numpy(
    tmp_path, base_models, hub, gcs, gcs_server, monkeypatch
):
    """A base saved by PyTorch (transformers 5: model.safetensors, no tf_model.h5), from a folder, a bucket and the
    Hub stand-in: its TensorFlow model computes the logits PyTorch's does, without torch in this environment."""
    import shutil

    import huggingface_hub.constants
    from huggingface_hub import HfApi
    from pytorch_env import run_pytorch

    from components.lib.base_model import load_base_weights

    folder = tmp_path / "pytorch-roberta"
    batch = {"input_ids": [[0, 11, 12, 13, 2, 1]], "attention_mask": [[1, 1, 1, 1, 1, 0]]}
    answer = run_pytorch({"model": str(base_models["roberta"]), "save_new": str(folder), "batch": batch})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        shutil.copy(base_models["roberta"] / name, folder / name)
    assert (folder / "model.safetensors").exists() and not (folder / "tf_model.h5").exists()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # the repository URLs this process parses
    api = HfApi(endpoint=hub.url, token=HUB_TOKEN)
    api.create_repo("user/pytorch-roberta")
    api.upload_folder(repo_id="user/pytorch-roberta", folder_path=folder)
    storage.upload_folder(folder, gcs + "/pytorch-roberta")
    # what preflight and the train step do, in a process of their own as they run (the Hub's address is its env's)
    logits_of = (
        "import json, sys, numpy as np; from components.lib.base_model import check_base_model, load_base_weights; "
        "init_from, batch = sys.argv[1], json.loads(sys.argv[2]); "
        "model = load_base_weights(init_from, check_base_model(init_from).config); "
        "print(json.dumps(model(**{k: np.array(v) for k, v in batch.items()}).logits.numpy().tolist()))"
    )
    # a checkpoint of older PyTorch names: LayerNorm's gamma and beta, the head's bias under its decoder's alone
    from safetensors.numpy import load_file, save_file

    legacy = shutil.copytree(folder, tmp_path / "legacy-roberta")
    renamed = {
        re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma", name)): value
        for name, value in load_file(legacy / "model.safetensors").items()
        if name != "lm_head.decoder.bias"
    }
    renamed["lm_head.decoder.bias"] = renamed.pop("lm_head.bias")
    save_file(renamed, legacy / "model.safetensors", metadata={"format": "pt"})
    assert sum(name.endswith(".gamma") for name in renamed) == 5  # the embeddings', and 2 in each of the 2 layers
    for init_from in (str(folder), "hf:user/pytorch-roberta", gcs + "/pytorch-roberta", str(legacy)):
        done = subprocess.run(
            [sys.executable, "-c", logits_of, init_from, json.dumps(batch)],
            env={**hub.env, **gcs_server},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        logits = np.array(json.loads(done.stdout.splitlines()[-1]), dtype=np.float32)
        difference = np.abs(np.array(answer["logits"], dtype=np.float32) - logits).max()
        assert difference <= 1e-4 * np.abs(logits).max(), (init_from, difference)
    # one saved in bfloat16, which numpy has no type for: widened to float32 exactly (PyTorch computes in bfloat16)
    bfloat16 = tmp_path / "bfloat16-roberta"
    answer = run_pytorch(
        {"model": str(base_models["roberta"]), "save_new": str(bfloat16), "save_dtype": "bfloat16", "batch": batch}
    )
    assert answer["dtype"] == "torch.bfloat16"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        shutil.copy(base_models["roberta"] / name, bfloat16 / name)
    done = subprocess.run(
        [sys.executable, "-c", logits_of, str(bfloat16), json.dumps(batch)], env=hub.env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logits = np.array(json.loads(done.stdout.splitlines()[-1]), dtype=np.float32)
    assert np.abs(np.array(answer["logits"], dtype=np.float32) - logits).max() <= 3e-2 * np.abs(logits).max()
    # one of another shape than its config's is refused, not loaded half
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(InvalidParameter, match=r"stores roberta\.encoder\.layer\.0\..* of shape"):
        load_base_weights(str(folder), check_base_model(str(folder)).config)


@pytest.mark.timeout(LONG_TEST_SECONDS)
@pytest.mark.slow  # the whole pipeline under kfp.local, short (about a minute)
def test_run_local_continues_a_model_end_to_end_and_probes_its_base_beside_it(tmp_path, base_models, capsys):
    """run-local --init_from, as a user runs it: the compiled pipeline's tokenizer step copies the base's tokenizer,
    the shards are made with it, the training starts from its weights at dapt-2020's knobs (make run's small-model
    rate is for a model from scratch), the probe fine-tunes the base as it was, and the model loads in
    transformers 5."""
    from pytorch_env import run_pytorch

    from components.lib.results import BASE_MODEL
    from pipelines.run_local import RunLocalArguments, run_local

    base = base_models["roberta"]
    summary = run_local(
        RunLocalArguments(
            **{"pipeline_root": str(tmp_path / "runs"), "init_from": str(base), "max_steps": 20},
            **{"downstream_max_steps": 8, "downstream_seeds": "1", "downstream_max_train_samples": 64},
        )
    )
    artifacts = summary["artifacts"]
    assert Path(artifacts["tokenizer"], "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    manifest = json.loads(Path(artifacts["train shards"], "manifest.json").read_text())
    assert manifest["vocab_size"] == VOCAB_SIZE and manifest["special_tokens"]["mask"] == 4  # the base's <mask>
    training = json.loads(Path(artifacts["model"], "training_summary.json").read_text())
    assert training["base_model"] == str(base) and training["total_steps"] == 20
    trained_with = training["arguments"]
    assert (trained_with["recipe"], trained_with["learning_rate"], trained_with["warmup_fraction"]) == (
        "dapt-2020",
        5e-4,
        0.0,
    )
    probe = json.loads(Path(artifacts["downstream probe"], "downstream.json").read_text())
    assert set(probe["average"]) == {"pre-trained", "random init", BASE_MODEL}
    assert "adaptation gain" in Path(artifacts["run report"]).read_text()
    printed = capsys.readouterr()
    assert "the base as it was" in printed.out + printed.err
    answer = run_pytorch({"model": artifacts["model"]})
    assert answer["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}


def test_a_base_that_cannot_be_read_now_leaves_the_probe_its_two_models(tmp_path):
    """A base gone since the training (or a published copy of the model, whose base's place is left out) costs the
    probe its third model, said in one line, not the pre-trained model's comparison with its twin."""
    from components.downstream import probe_folders

    model = tmp_path / "model"
    model.mkdir()
    (model / "training_summary.json").write_text(json.dumps({"base_model": str(tmp_path / "gone")}))
    folders, reason = probe_folders(model, tmp_path / "work")
    assert set(folders) == {"pre-trained", "random init"}
    assert reason.startswith("The base model could not be read, so it is not probed (InvalidParameter: ")
    assert "\n" not in reason
