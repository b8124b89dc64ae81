"""The downstream probe's labelled classification tasks: what a task spec names, its training and validation
examples, and its metric.

A task is one of:

* ``word-order``: made from text no model of the project pre-trains on (the docstrings of standard-library modules
  that the embedded corpus does not hold: ``docstring_sentences``), no network: windows of a few consecutive words
  of that running text, lowercase and without punctuation, as they are (label 1) or with their words in reverse
  order (label 0), half each; a sentence's words are in one split only. A window starts anywhere in a sentence, so
  its words, its first and last word and its length tell the two apart no better than chance (the probe's
  baselines are scored beside it): only word order does, which a random twin must learn from the few hundred
  windows it is given and a pre-trained model may know. ``make run``'s model does not: no signal
  (docs/benchmarks.md, which compares other negatives); the same run trained 5,000 steps does (+0.16 over its twin:
  ``benchmarks/probe_training.py``);
* ``hf:NAME[:CONFIG[:SPLIT]]``, a Hub dataset, fine-tuned on its ``train`` split and scored on ``SPLIT``: GLUE's
  tasks (``hf:nyu-mll/glue:sst2``, ``hf:glue:mrpc``, ...) with their text columns, validation split and metric
  (Matthews correlation for CoLA, F1 for MRPC and QQP, accuracy else); any other with ``--text_columns`` and
  ``--label_column``, scored on ``validation`` unless ``SPLIT`` names another (``hf:user/reviews:default:dev``);
* a folder (local or ``gs://``) holding ``train`` and ``validation`` files of one format: ``.jsonl``, ``.csv``
  or ``.parquet``, with ``--text_columns`` and ``--label_column``.

Labels are whole numbers from 0, or text (the training split's values, sorted, become 0, 1, ...)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import re
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.lib import storage
from components.lib.corpus.spec import HUB_PREFIX
from components.lib.errors import InvalidParameter, first_line

WORD_ORDER = "word-order"
BUILT_IN_TASKS = (WORD_ORDER,)
METRICS = ("accuracy", "f1", "mcc")
# GLUE's classification tasks: text columns, the metric its papers report (F1 for MRPC and QQP, whose accuracy is
# reported beside it), the split scored
GLUE_DATASETS = ("glue", "nyu-mll/glue")
GLUE_TASKS = {
    "cola": (("sentence",), "mcc", "validation"),
    "sst2": (("sentence",), "accuracy", "validation"),
    "mrpc": (("sentence1", "sentence2"), "f1", "validation"),
    "qqp": (("question1", "question2"), "f1", "validation"),
    "mnli": (("premise", "hypothesis"), "accuracy", "validation_matched"),
    "qnli": (("question", "sentence"), "accuracy", "validation"),
    "rte": (("sentence1", "sentence2"), "accuracy", "validation"),
}
# the held-out splits a GLUE task is scored on besides its validation split, by the same fine-tunings
GLUE_ALSO_SCORED = {"mnli": ("validation_mismatched",)}
# roberta-base's published GLUE dev scores where their metric is this probe's (fairseq's RoBERTa README: single-task
# fine-tuning by the RoBERTa paper's recipe, 10 epochs and a sweep of rates and batches, from a model pre-trained on
# 160 GB of text); MRPC's and QQP's published figures are accuracies, where the probe reports F1
PUBLISHED_ROBERTA_BASE = {"cola": 0.636, "sst2": 0.948, "mnli": 0.876, "qnli": 0.928, "rte": 0.787}
PUBLISHED_SOURCE = (
    "roberta-base, fairseq's README: GLUE dev, a 10-epoch fine-tuning with a sweep of rates and batches a task, "
    "stopped early on that same dev split (the RoBERTa paper, appendix C)"
)


def published_score(source: str) -> float | None:
    """roberta-base's published score on a GLUE task named ``hf:glue:NAME`` or ``hf:nyu-mll/glue:NAME`` scored on its
    usual validation split; None for every other task."""
    if not source.startswith(HUB_PREFIX):
        return None
    name, config, split = _hub_name(source)
    if name not in GLUE_DATASETS or config not in PUBLISHED_ROBERTA_BASE or split not in (None, GLUE_TASKS[config][2]):
        return None
    return PUBLISHED_ROBERTA_BASE[config]


FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SPLITS = ("train", "validation")
MOST_CLASSES = 100  # more label values than this: a column of text or of ids given as the label, not classes
WORD_ORDER_WINDOW = 10  # words a sample: fewer than most sentences hold, so a window starts anywhere in one
WORD_ORDER_VALIDATION_SHARE = 5  # one sentence in five (by a hash of the sentence) is validation
# the training windows kept, spread over the text: a few hundred labelled windows are where pre-training's gain
# would show (a probe's max_train_samples takes fewer); more is text a longer fine-tuning spends on learning order
WORD_ORDER_TRAIN_WINDOWS = 800


@dataclass(frozen=True)
class Examples:
    texts: list[tuple[str, ...]]  # one or two texts each (a sentence, or a pair)
    labels: list[int]


@dataclass(frozen=True)
class Task:
    name: str
    metric: str
    label_names: tuple[str, ...]
    train: Examples
    validation: Examples
    validation_split: str = "validation"
    also_scored: dict[str, Examples] = field(default_factory=dict)  # more held-out splits the same runs score


@dataclass(frozen=True)
class TaskSpec:
    """A task as named: ``source``, and the columns a labelled dataset keeps its texts and labels in."""

    source: str
    text_columns: tuple[str, ...] = ()
    label_column: str = "label"

    @property
    def name(self) -> str:
        return self.source.rstrip("/").rsplit("/", 1)[-1] if "://" in self.source else self.source

    def load(self, max_train: int = 0, max_validation: int = 0) -> Task:
        if self.source == WORD_ORDER:
            task = word_order_task()
        elif self.source.startswith(HUB_PREFIX):
            task = self._hub_task()
        else:
            task = self._file_task()
        return Task(
            task.name,
            task.metric,
            task.label_names,
            _head(task.train, max_train),
            _head(task.validation, max_validation),
            task.validation_split,
            {split: _head(examples, max_validation) for split, examples in task.also_scored.items()},
        )

    def _hub_task(self) -> Task:
        import datasets

        name, config, split_given = _hub_name(self.source)
        glue = GLUE_TASKS.get(config or "") if name in GLUE_DATASETS else None
        columns, metric, validation_split = glue or (self.text_columns, "accuracy", "validation")
        # MNLI's mismatched validation split too, unless one split is named
        also = GLUE_ALSO_SCORED.get(config or "", ()) if glue and not split_given else ()
        scored = (split_given or validation_split, *also)
        if not columns:
            raise InvalidParameter("text_columns", "", f"name the text column(s) of {self.source}")
        try:
            splits = datasets.get_dataset_split_names(name, config)
            for split in ("train", *scored):
                if split not in splits:
                    raise InvalidParameter("tasks", self.source, f"has no {split!r} split (its splits: {splits})")
            loaded = {split: datasets.load_dataset(name, config, split=split) for split in ("train", *scored)}
        except InvalidParameter:
            raise
        except (ValueError, FileNotFoundError, ConnectionError) as error:  # no such dataset or config, no Hub
            raise InvalidParameter("tasks", self.source, f"cannot be loaded: {first_line(error)}") from None
        return _labelled(self.source, metric, loaded, columns, "label" if glue else self.label_column, scored)

    def _file_task(self) -> Task:
        import datasets

        if not self.text_columns:
            raise InvalidParameter("text_columns", "", f"name the text column(s) of the files in {self.source}")
        files = {split: _split_file(self.source, split) for split in SPLITS}
        formats = {FILE_FORMATS[storage.suffix(uri)] for uri in files.values()}
        if len(formats) > 1:
            raise InvalidParameter("tasks", self.source, f"holds train and validation files of two formats: {files}")
        file_format = formats.pop()
        loaded = {}
        with tempfile.TemporaryDirectory() as local:
            for split, uri in files.items():  # one at a time: splits of other columns are the user's to hear of
                path = str(Path(local, f"{split}{storage.suffix(uri)}"))
                storage.copy(uri, path)
                loaded[split] = datasets.load_dataset(file_format, data_files=path, split="train", cache_dir=local)
            return _labelled(self.source, "accuracy", loaded, self.text_columns, self.label_column)


@dataclass(kw_only=True)
class TaskSelection:
    """The downstream probe's tasks as named: the probe's, and preflight's, which loads them before any TPU time."""

    tasks: str = field(
        default=WORD_ORDER,
        metadata={
            "help": "The downstream probe's tasks, comma-separated: word-order (built in, no network: windows of "
            "words from Python's docstrings, which the embedded corpus does not hold, as written or reversed), "
            "hf:NAME[:CONFIG[:SPLIT]] (scored on SPLIT, validation by default; GLUE's by their conventions: "
            "hf:nyu-mll/glue:sst2, ...), or folders (local or gs://) of train and validation "
            ".jsonl/.csv/.parquet files."
        },
    )
    text_columns: str = field(
        default="text",
        metadata={
            "help": "Text column, or two comma-separated for sentence pairs, of tasks that are not GLUE's (text, as "
            "the corpus's)."
        },
    )
    label_column: str = field(default="label", metadata={"help": "Label column of tasks that are not GLUE's."})

    def task_specs(self) -> list[TaskSpec]:
        return parse_tasks(self.tasks, self.text_columns, self.label_column)


def parse_tasks(tasks: str, text_columns: str = "", label_column: str = "label") -> list[TaskSpec]:
    """The task specs of ``--tasks`` (comma-separated), each checked for its form; "" gives none."""
    columns = tuple(column.strip() for column in text_columns.split(",") if column.strip())
    specs = [TaskSpec(source.strip(), columns, label_column) for source in tasks.split(",") if source.strip()]
    for spec in specs:
        if spec.source.startswith(HUB_PREFIX):
            _hub_name(spec.source)
        elif spec.source not in BUILT_IN_TASKS:
            storage.check_uri("tasks", spec.source)
            if not storage.is_remote(spec.source) and not os.path.isdir(spec.source):  # a misspelt name, or no folder
                raise InvalidParameter(
                    "tasks",
                    spec.source,
                    f"is no built-in task ({', '.join(BUILT_IN_TASKS)}), no hf:NAME dataset and no folder here",
                )
    if len(columns) > 2:
        raise InvalidParameter("text_columns", text_columns, "names one text column, or two for sentence pairs")
    return specs


# Text held out from the embedded corpus, for probe tasks on text a model pre-trained on it never read (the
# built-in task, benchmarks/probe_rates.py): the docstrings of these standard-library modules and
# packages, which pydoc_data's topics (the language reference) do not hold. Pure Python, in every CPython install.
DOCSTRING_SOURCES = (
    *("argparse.py", "asyncio", "collections", "concurrent", "email", "http", "inspect.py", "json", "logging"),
    *("multiprocessing", "pathlib.py", "pydoc.py", "shutil.py", "subprocess.py", "tarfile.py", "typing.py"),
    *("unittest", "urllib", "xml", "zipfile"),
)
SENTENCE_WORDS = (8, 40)  # shorter: headings and fragments; longer: run-on lists


def normalised(text: str) -> str:
    """Lowercase words without punctuation: no capital or full stop left to tell a sentence's ends by."""
    return " ".join(re.sub(r"[^\w\s]|_", " ", text.lower()).split())


@functools.cache
def docstring_sentences(sources: tuple[str, ...] = DOCSTRING_SOURCES) -> tuple[str, ...]:
    """The distinct sentences that read as prose in the docstrings (of modules, classes, functions) of ``sources``,
    normalised, less any that the embedded corpus holds: text a model pre-trained on the embedded corpus never read.
    They depend on the Python version's standard library (the images': 3.11). Parsing the modules takes seconds,
    and every command that estimates a run reads the built-in task: the sentences are kept in the user's cache
    folder, under a key of this Python and this module's code (a read-only home: parsed every time)."""
    from components.lib.corpus import embedded

    code = Path(__file__).read_bytes() + Path(embedded.__file__).read_bytes()  # what it keeps, what it leaves out
    key = hashlib.sha256(repr((sys.version, sources, code)).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "tpu-mlm", f"docstrings-{key}.json")
    try:
        kept = json.loads(cache.read_text(encoding="utf-8"))
        if isinstance(kept, list) and all(isinstance(sentence, str) for sentence in kept):
            return tuple(kept)
    except (OSError, ValueError):
        pass
    sentences = parsed_docstring_sentences(sources)
    with contextlib.suppress(OSError):  # a read-only home
        storage.write_text_atomic(str(cache), json.dumps(sentences))
    return sentences


def parsed_docstring_sentences(sources: tuple[str, ...]) -> tuple[str, ...]:
    """``docstring_sentences`` from the modules themselves."""
    import ast
    import sysconfig

    from components.lib.corpus.embedded import embedded_lines

    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        path
        for source in sources
        for path in ([root / source] if source.endswith(".py") else sorted((root / source).rglob("*.py")))
    ]
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    sentences = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            docstring = ast.get_docstring(node) if isinstance(node, nodes) else None
            for paragraph in re.split(r"\n\s*\n", docstring or ""):
                for sentence in re.split(r"(?<=[.!?])\s+", " ".join(paragraph.split())):
                    # prose: starts as a sentence does, no doctest, reST directive or code
                    if re.match(r"[A-Z][a-z]", sentence) and not re.search(r">>>|::|[{}=]", sentence):
                        sentences.add(normalised(sentence))
    pre_training = {normalised(line) for line in embedded_lines()}
    low, high = SENTENCE_WORDS
    return tuple(sorted(sentence for sentence in sentences - pre_training if low <= len(sentence.split()) <= high))


# a window's words made a negative example, from the split's words and a seeded draw; None: keep it as it is
Corruption = Callable[[list[str], list[str], random.Random], list[str] | None]


def reversed_words(words: list[str], split_words: list[str], draw: random.Random) -> list[str] | None:
    """A window's words last first; None for one that reads the same both ways."""
    return None if words == words[::-1] else words[::-1]


def word_order_task(
    window: int = WORD_ORDER_WINDOW, negative: Corruption = reversed_words, sentences: Iterable[str] = ()
) -> Task:
    """Windows of ``window`` consecutive words of the held-out docstrings' running text (or of ``sentences``: a
    benchmark's of another corpus), half of them (label 0) made negatives by ``negative`` (reversed; ``benchmarks/
    downstream.py`` compares others), each sentence's words in one split; at most ``WORD_ORDER_TRAIN_WINDOWS``
    training windows, spread over the text. The same every run."""
    words: dict[str, list[str]] = {"train": [], "validation": []}
    for sentence in sentences or docstring_sentences():
        validation = zlib.crc32(sentence.encode()) % WORD_ORDER_VALIDATION_SHARE == 0
        words["validation" if validation else "train"].extend(sentence.split())
    splits = {}
    for split, split_words in words.items():
        draw = random.Random(split)
        examples = Examples([], [])
        # back to back from a random first word: sentences' lengths vary, so a window starts anywhere in one
        for start in range(draw.randrange(window), len(split_words) - window + 1, window):
            kept = split_words[start : start + window]
            reordered = negative(kept, split_words, draw) if draw.random() < 0.5 else kept
            if reordered is None:
                continue
            examples.texts.append((" ".join(reordered),))
            examples.labels.append(0 if reordered is not kept else 1)
        splits[split] = examples
    train = _head(splits["train"], WORD_ORDER_TRAIN_WINDOWS)
    return Task(WORD_ORDER, "accuracy", ("reordered", "original"), train, splits["validation"])


def _hub_name(source: str) -> tuple[str, str | None, str | None]:
    """A Hub task's dataset, config and the split it is scored on (None: the task's convention)."""
    parts = source[len(HUB_PREFIX) :].split(":")
    if not parts[0] or len(parts) > 3 or any(not part for part in parts):
        raise InvalidParameter("tasks", source, "a Hub dataset task is written hf:NAME[:CONFIG[:SPLIT]]")
    name, config, split = (*parts, None, None)[:3]
    if split == "train":
        raise InvalidParameter("tasks", source, "is scored on the split it fine-tunes on: name another split")
    return name, config, split


def _split_file(folder: str, split: str) -> str:
    found = [uri for uri in storage.glob(storage.join(folder, f"{split}.*")) if storage.suffix(uri) in FILE_FORMATS]
    if len(found) != 1:
        what = "no" if not found else "more than one"
        raise InvalidParameter(
            "tasks", folder, f"holds {what} {split} file ({split}.jsonl, {split}.csv or {split}.parquet)"
        )
    return found[0]


def _labelled(
    source: str,
    metric: str,
    loaded: dict[str, Any],
    columns: tuple[str, ...],
    label: str,
    scored: tuple[str, ...] = ("validation",),
) -> Task:
    """The examples of ``datasets.Dataset`` splits (``train`` and the ``scored`` ones, the first reported as the
    task's validation split), their columns checked and their labels made 0, 1, ..."""
    cells = {}  # split -> column -> its values, each column read once
    for split in ("train", *scored):
        dataset = loaded[split]
        missing = [column for column in (*columns, label) if column not in dataset.column_names]
        if missing:
            raise InvalidParameter(
                "tasks", source, f"its {split} split has no column {missing[0]!r} (its columns: {dataset.column_names})"
            )
        cells[split] = {column: list(dataset[column]) for column in (*columns, label)}
        for column, values in cells[split].items():
            empty = [row for row, value in enumerate(values) if value is None or value != value]  # NaN
            if empty:
                raise InvalidParameter(
                    "tasks",
                    source,
                    f"its {split} split has {len(empty):,} empty {column!r} cell(s), the first in row {empty[0]}",
                )
    names = _label_names(source, cells["train"][label])
    ids = {name: index for index, name in enumerate(names)}
    for split in scored:
        unknown = sorted({_label(value) for value in cells[split][label]} - set(ids))
        if unknown:
            raise InvalidParameter(
                "tasks", source, f"its {split} labels {unknown[:3]} are not among training's {names}"
            )

    def examples(split: str) -> Examples:
        texts = [tuple(map(str, row)) for row in zip(*(cells[split][column] for column in columns), strict=True)]
        return Examples(texts, [ids[_label(value)] for value in cells[split][label]])

    first, *others = scored
    return Task(
        source, metric, names, examples("train"), examples(first), first, {split: examples(split) for split in others}
    )


def _label(value: Any) -> str:
    """A label as its class's name: a whole number however stored (1, 1.0, True), else its text."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _label_names(source: str, values: list[Any]) -> tuple[str, ...]:
    """The classes in id order: whole numbers by value (ratings 1 to 5 become ids 0 to 4), text sorted; at least
    two of them."""
    distinct = sorted({_label(value) for value in values})
    if len(distinct) < 2:
        raise InvalidParameter("tasks", source, f"its training labels take {len(distinct)} value(s): nothing to learn")
    if len(distinct) > MOST_CLASSES:
        raise InvalidParameter(
            "tasks",
            source,
            f"its labels take {len(distinct):,} values in {len(values):,} rows: a text column, not classes? Name the "
            "label column with --label_column",
        )
    if any(isinstance(value, float) and not value.is_integer() for value in values):
        raise InvalidParameter("tasks", source, "has labels that are fractions: a classification task's are classes")
    if all(re.fullmatch(r"-?\d+", name) for name in distinct):
        numbers = sorted(int(name) for name in distinct)
        if numbers[0] < 0:
            raise InvalidParameter("tasks", source, f"has label {numbers[0]} (unlabelled rows?): labels start at 0")
        return tuple(str(number) for number in numbers)
    return tuple(distinct)


def _head(examples: Examples, most: int) -> Examples:
    """At most ``most`` examples (0: all), spread over the split: a head of a sorted file could be one class."""
    if not most or len(examples.labels) <= most:
        return examples
    chosen = sorted(random.Random(0).sample(range(len(examples.labels)), most))
    return Examples([examples.texts[i] for i in chosen], [examples.labels[i] for i in chosen])


def split_off(examples: Examples, count: int) -> tuple[Examples, Examples]:
    """The examples less ``count`` of them spread over the split (the same every time), and those."""
    chosen = set(random.Random(1).sample(range(len(examples.labels)), count))
    kept, taken = Examples([], []), Examples([], [])
    for index, (text, label) in enumerate(zip(examples.texts, examples.labels, strict=True)):
        part = taken if index in chosen else kept
        part.texts.append(text)
        part.labels.append(label)
    return kept, taken
