import json
import logging
from pathlib import Path

import pytest
from conftest import WIKITEXT_VOCAB_SIZE
from transformers import AutoTokenizer

from components.lib.errors import InvalidParameter
from components.lib.tokenization import SPECIAL_TOKENS, load_tokenizer
from components.tokenizer import SUMMARY_FILE, TokenizerArguments, train_tokenizer


def test_wikitext_tokenizer_reloads_round_trips_and_has_roberta_special_tokens(wikitext, wikitext_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(wikitext_tokenizer)
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert (tokenizer.unk_token_id, tokenizer.mask_token_id) == (3, 4)
    assert len(tokenizer) == WIKITEXT_VOCAB_SIZE

    lines = [line.strip() for line in (wikitext / "test.txt").read_text().splitlines() if line.strip()][:200]
    for line in lines:
        ids = tokenizer(line)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[1:-1]) == line.replace("``", '"').replace("''", '"')
    pair = tokenizer("a b", "c d")["input_ids"]
    assert pair.count(tokenizer.eos_token_id) == 3


def test_summary_records_what_was_read(wikitext, wikitext_tokenizer):
    summary = json.loads(Path(wikitext_tokenizer, SUMMARY_FILE).read_text())
    lines = [line for line in (wikitext / "valid.txt").read_text().splitlines() if line.strip()]
    assert summary["texts_read"] == len(lines)
    assert summary["bytes_read"] == sum(len(line.encode()) for line in lines)
    assert summary["vocab_size"] == summary["vocab_size_requested"] == WIKITEXT_VOCAB_SIZE
    assert summary["special_tokens"] == {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    _, fingerprint = load_tokenizer(wikitext_tokenizer)
    assert summary["fingerprint"] == fingerprint


def test_a_corpus_too_small_for_the_vocabulary_says_the_size_reached(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    summary = train_tokenizer(TokenizerArguments(output=str(tmp_path / "tok"), corpus="embedded", vocab_size=50_000))
    assert summary["vocab_size"] < 50_000
    assert f"reached a vocabulary of {summary['vocab_size']} pieces, fewer than the 50000" in caplog.text
    assert len(AutoTokenizer.from_pretrained(tmp_path / "tok")) == summary["vocab_size"]


def test_lowercase_option(tmp_path):
    train_tokenizer(TokenizerArguments(output=str(tmp_path), corpus="embedded", vocab_size=2000, lowercase=True))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.decode(tokenizer("The Python Tutorial")["input_ids"], skip_special_tokens=True) == (
        "the python tutorial"
    )


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ({"vocab_size": 5}, "vocab_size"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"output": "ftp://host/tok"}, "output"),
        ({"corpus": "/no/such/file.txt"}, "corpus"),
        ({"limit": -1}, "limit"),
    ],
)
def test_bad_input_fails_before_writing(tmp_path, arguments, parameter):
    output = str(tmp_path / "tok")
    with pytest.raises(InvalidParameter) as error:
        train_tokenizer(TokenizerArguments(**{"output": output, "corpus": "embedded", **arguments}))
    assert error.value.parameter == parameter
    assert not Path(output).exists()


def test_load_refuses_a_tokenizer_without_a_mask_token(tmp_path, embedded_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer)
    tokenizer.mask_token = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(InvalidParameter, match=r"--tokenizer=.*has no mask_token"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(InvalidParameter, match=r"--tokenizer=.*not a tokenizer folder"):
        load_tokenizer(str(tmp_path / "missing"))


def test_the_mask_takes_the_word_boundary_before_it_as_training_masked_whole_pieces(embedded_tokenizer):
    """ "a <mask> of" must give the model what training gave it, a masked "▁word" piece, not a bare "▁" then
    the mask (the mask token strips the space on its left, as roberta-base's does)."""
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(embedded_tokenizer).tokenize("The function returns a <mask> of values.")
    mask = next(index for index, token in enumerate(tokens) if token.strip() == "<mask>")
    assert tokens[mask - 1] == "\u2581a", tokens  # without lstrip: [..., "▁a", "▁", "<mask>", ...]
