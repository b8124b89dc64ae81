import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.lib import storage
from components.lib.corpus import LINE_STEP, Corpus, CorpusSpec, embedded_lines, holdout_texts, is_held_out
from components.lib.errors import InvalidParameter


def texts_of(source: str, **kwargs) -> list[str]:
    return list(Corpus(CorpusSpec(corpus=source, **kwargs)))


def test_embedded_corpus_is_real_english_text_without_blank_lines():
    texts = texts_of("embedded")
    assert len(texts) > 5000
    assert all(text.strip() for text in texts)
    assert sum(len(text) for text in texts) > 300_000
    assert len(texts) == sum(1 for line in embedded_lines() if line.strip())


def test_text_jsonl_and_parquet_files_give_the_same_texts(tmp_path):
    rows = ["first document", "", "second  document with  spaces", "   ", "third"]
    (tmp_path / "a.txt").write_text("\n".join(rows) + "\n")
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"body": row, "id": i}) for i, row in enumerate(rows)))
    pq.write_table(pa.table({"body": rows, "id": list(range(len(rows)))}), tmp_path / "a.parquet")
    expected = ["first document", "second  document with  spaces", "third"]
    assert texts_of(str(tmp_path / "a.txt")) == expected
    assert texts_of(str(tmp_path / "a.jsonl"), text_column="body") == expected
    assert texts_of(str(tmp_path / "a.parquet"), text_column="body") == expected


def test_globs_and_comma_lists_read_files_in_order_and_limit_counts_texts(tmp_path):
    for name, lines in {"b.txt": ["b1", "b2"], "a.txt": ["a1", "", "a2"], "c.txt": ["c1"]}.items():
        (tmp_path / name).write_text("\n".join(lines))
    assert texts_of(str(tmp_path / "*.txt")) == ["a1", "a2", "b1", "b2", "c1"]
    assert texts_of(f"{tmp_path / 'c.txt'}, {tmp_path / 'a.txt'}") == ["c1", "a1", "a2"]
    assert texts_of(str(tmp_path / "*.txt"), limit=3) == ["a1", "a2", "b1"]


def test_progress_follows_bytes_read(tmp_path):
    (tmp_path / "a.txt").write_text("\n".join(f"line {i} é" for i in range(400_000)))  # 5 MB: several blocks
    corpus = Corpus(CorpusSpec(corpus=str(tmp_path / "a.txt")))
    seen = [corpus.fraction_done for _ in corpus]
    assert len(seen) == 400_000
    assert seen == sorted(seen) and 0.1 < seen[0] < 0.3 and seen[-1] == pytest.approx(1.0)
    assert len(set(seen)) >= 4


def test_a_local_folder_named_like_a_bucket_stays_local(tmp_path):
    folder = tmp_path / "gs" / "logs"
    folder.mkdir(parents=True)
    (folder / "gs.txt").write_text("local text")
    assert texts_of(str(folder / "gs.txt")) == ["local text"]


@pytest.mark.parametrize(
    ("source", "parameter", "fragment"),
    [
        ("", "corpus", "name a corpus"),
        ("s3://bucket/file.txt", "corpus", "unsupported URI scheme 's3'"),
        ("gs:///file.txt", "corpus", "needs a bucket name"),
        ("hf:", "corpus", "hf:NAME[:CONFIG[:SPLIT]]"),
        ("hf:a:b:c:d", "corpus", "hf:NAME[:CONFIG[:SPLIT]]"),
        ("/no/such/folder/*.txt", "corpus", "no file matches"),
    ],
)
def test_bad_corpus_names_fail_naming_the_parameter(source, parameter, fragment):
    with pytest.raises(InvalidParameter) as error:
        Corpus(CorpusSpec(corpus=source))
    assert error.value.parameter == parameter
    assert fragment in str(error.value)
    assert repr(source) in str(error.value) or source.startswith("/no")


def test_files_that_cannot_be_read_as_text_fail_early(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(InvalidParameter, match=r"--corpus=.*data\.csv.*unknown file type \.csv"):
        Corpus(CorpusSpec(corpus=str(tmp_path / "data.csv")))
    with pytest.raises(InvalidParameter, match="is a folder"):
        Corpus(CorpusSpec(corpus=str(tmp_path)))


def test_empty_corpus_fails_early(tmp_path):
    (tmp_path / "empty.txt").write_text("\n   \n\n")
    with pytest.raises(InvalidParameter, match=r"--corpus=.*empty\.txt.*holds no text"):
        Corpus(CorpusSpec(corpus=str(tmp_path / "empty.txt")))


def test_missing_text_column_names_the_columns_there(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "a.parquet")
    for name in ("a.jsonl", "a.parquet"):
        with pytest.raises(InvalidParameter, match=r"--text-column='text'.*has no such column.*'content'"):
            Corpus(CorpusSpec(corpus=str(tmp_path / name)))


def test_limit_must_be_positive():
    with pytest.raises(InvalidParameter, match="--limit=-1"):
        CorpusSpec(corpus="embedded", limit=-1)


def test_holdout_is_chosen_by_content_and_never_overlaps():
    texts = texts_of("embedded")
    kept = list(holdout_texts(iter(texts), holdout_fraction=0.1, holdout="exclude"))
    held = list(holdout_texts(iter(texts), holdout_fraction=0.1, holdout="only"))
    assert not set(kept) & set(held)
    assert len(kept) + len(held) == len(texts)
    assert 0.07 < len(held) / len(texts) < 0.13
    assert held == [t for t in texts if is_held_out(t, 0.1)]


def write_layouts(folder, lines: list[str]) -> dict[str, str]:
    """The same texts as one text file, as 7 text files, as JSON lines, and as parquet with row groups."""
    folder.mkdir(exist_ok=True)
    (folder / "one.txt").write_text("\n".join(lines) + "\n")
    for index in range(7):
        chunk = lines[index * len(lines) // 7 : (index + 1) * len(lines) // 7]
        (folder / f"many-{index}.txt").write_text("\n".join(chunk) + "\n")
    (folder / "rows.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    pq.write_table(pa.table({"text": lines}), folder / "rows.parquet", row_group_size=len(lines) // 10)
    return {
        "one text file": str(folder / "one.txt"),
        "seven text files": str(folder / "many-*.txt"),
        "one JSON-lines file": str(folder / "rows.jsonl"),
        "parquet row groups": str(folder / "rows.parquet"),
    }


@pytest.mark.parametrize("num_parts", [2, 3, 5])
def test_parts_read_disjoint_shares_that_together_are_the_corpus_in_order(tmp_path, num_parts):
    lines = [f"text {i} " + "word " * (i * 7919 % 23) for i in range(3000)]  # lines of varied length
    for layout, source in write_layouts(tmp_path, lines).items():
        whole = Corpus(CorpusSpec(corpus=source))
        assert list(whole) == lines, layout
        parts = [Corpus(CorpusSpec(corpus=source), num_parts, part) for part in range(num_parts)]
        shares = [list(part) for part in parts]
        assert [text for share in shares for text in share] == lines, layout
        assert all(shares), f"{layout}: a part read nothing"
        read = sum(part.bytes_read for part in parts)
        if "parquet" not in layout:  # every byte once, plus at most one line at each part's edges
            assert whole.bytes_read <= read <= whole.bytes_read + num_parts * (LINE_STEP + max(map(len, lines))), layout
            assert max(part.bytes_read for part in parts) < 1.5 * whole.bytes_read / num_parts, layout


def test_a_part_reads_its_byte_range_of_a_big_file_not_the_whole_file(tmp_path):
    lines = [f"line {i:07d} " + "x" * 90 for i in range(60_000)]  # 6 MB: several read blocks per part
    (tmp_path / "big.txt").write_text("\n".join(lines) + "\n")
    size = (tmp_path / "big.txt").stat().st_size
    parts = [Corpus(CorpusSpec(corpus=str(tmp_path / "big.txt")), 4, part) for part in range(4)]
    shares = [list(part) for part in parts]
    assert [text for share in shares for text in share] == lines
    for part in parts:
        assert size / 4 - 1 <= part.bytes_read <= size / 4 + LINE_STEP + 100  # its quarter, the line at its end
        assert part.fraction_done == 1.0


def test_a_sample_is_spread_over_the_whole_corpus_and_about_its_size(tmp_path):
    lines = [f"document {i:06d} " + "y" * 200 for i in range(50_000)]  # 10.5 MB in three files
    for index in range(3):
        (tmp_path / f"part-{index}.txt").write_text("\n".join(lines[index::3]) + "\n")
    corpus = Corpus(CorpusSpec(corpus=str(tmp_path / "*.txt")), sample_bytes=2_000_000)
    texts = list(corpus)
    assert texts and set(texts) <= set(lines) and len(set(texts)) == len(texts)
    assert 1_900_000 <= corpus.bytes_read <= 2_300_000
    assert {int(text.split()[1]) // 10_000 for text in texts} == {0, 1, 2, 3, 4}  # from every stretch of ids
    windows = corpus.reader.sample_slices(2_000_000)
    assert {Path(piece.uri).name for piece in windows} == {"part-0.txt", "part-1.txt", "part-2.txt"}
    assert list(Corpus(CorpusSpec(corpus=str(tmp_path / "*.txt")), sample_bytes=2_000_000)) == texts  # each run
    everything = Corpus(CorpusSpec(corpus=str(tmp_path / "*.txt")), sample_bytes=100_000_000)  # larger than the corpus
    assert len(list(everything)) == len(lines)


def test_embedded_corpus_parts_are_contiguous_runs_of_its_lines():
    texts = texts_of("embedded")
    shares = [list(Corpus(CorpusSpec(corpus="embedded"), 3, part)) for part in range(3)]
    assert [text for share in shares for text in share] == texts
    assert all(len(share) > len(texts) / 4 for share in shares)


def test_lines_across_read_blocks_multibyte_text_and_crlf_are_read_whole(tmp_path):
    lines = [f"ligne {i} é ü 東京 {'x' * (i % 97)}" for i in range(120_000)]  # about 6 MB
    (tmp_path / "crlf.txt").write_bytes("\r\n".join(lines).encode())
    assert list(Corpus(CorpusSpec(corpus=str(tmp_path / "crlf.txt")))) == lines


def test_hub_datasets_stream_through_the_datasets_library(tmp_path):
    """A dataset folder laid out like a Hub repository, loaded by the same ``load_dataset`` call as
    ``hf:wikitext:wikitext-103-raw-v1`` (the Hub itself is out of reach here)."""
    (tmp_path / "data").mkdir()
    rows = ["= Heading =", "", "A paragraph of text .", "Another one ."]
    pq.write_table(pa.table({"text": rows}), tmp_path / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": ["held out"]}), tmp_path / "data" / "validation-00000-of-00001.parquet")
    assert texts_of(f"hf:{tmp_path}") == ["= Heading =", "A paragraph of text .", "Another one ."]
    assert texts_of(f"hf:{tmp_path}:default:validation") == ["held out"]
    with pytest.raises(InvalidParameter, match=r"--text-column='body'.*has no such column.*\['text'\]"):
        texts_of(f"hf:{tmp_path}", text_column="body")
    with pytest.raises(InvalidParameter, match=r"--corpus=.*cannot load the Hub dataset"):
        texts_of(f"hf:{tmp_path / 'missing'}")


def test_a_bare_file_name_is_written_in_the_current_folder_published_whole(tmp_path, monkeypatch):
    """tpu-mlm report --output report.html: a file name with no folder (dirname "") is the current folder's."""
    monkeypatch.chdir(tmp_path)
    storage.write_text_atomic("report.html", "<p>")
    storage.copy("report.html", "copy.html")
    assert (tmp_path / "report.html").read_text() == (tmp_path / "copy.html").read_text() == "<p>"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy.html", "report.html"]  # no temporary left
