"""What each shards part reads: a ~200 MB corpus as one file and as 16 files, sharded as 1 part and as 4 parts.

Each part runs as its own process, one after the other (as pipeline tasks would, on their own machines), and
reports its wall time and the bytes it read, measured twice: by the operating system (``rchar`` of
``/proc/self/io``: every byte the process read through ``read()``, less what the same command reads besides
a 64 KB corpus, i.e. Python, TensorFlow and the tokenizer) and by the corpus reader's own count. The parts
of a run must together read the corpus once: their sum, against the corpus size, is the last column.

    python benchmarks/parts_read.py [--megabytes 200] [--output benchmarks/results/parts_read.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

PROJECT = Path(__file__).resolve().parents[1]
WIKITEXT = PROJECT.parent / "shared" / "data" / "wikitext-2"
# Runs a job's module as its container would, then prints what the process read (its own /proc/self/io).
MEASURED = (
    "import runpy, sys\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    "    io = dict(line.split(': ') for line in open('/proc/self/io').read().splitlines())\n"
    "    sys.stderr.write('\\nIO ' + str(int(io['rchar'])) + '\\n')\n"
)


@dataclass
class BenchmarkArguments:
    megabytes: int = field(default=200, metadata={"help": "Size of the corpus written."})
    files: int = field(default=16, metadata={"help": "Files of the many-files layout."})
    parts: int = field(default=4, metadata={"help": "Parts of the split runs."})
    output: str = field(default="benchmarks/results/parts_read.json", metadata={"help": "JSON results."})


def source_text() -> bytes:
    """WikiText-2 where ../shared has it, else the embedded corpus."""
    if (WIKITEXT / "valid.txt").exists():
        return (WIKITEXT / "valid.txt").read_bytes() + (WIKITEXT / "test.txt").read_bytes()
    from components.lib.corpus import embedded_lines

    return "\n".join(embedded_lines()).encode() + b"\n"


def run_measured(module: str, *arguments: str) -> tuple[float, int, str]:
    """(seconds, bytes read by the process, stderr) of ``python -m module arguments``."""
    started = time.perf_counter()
    process = subprocess.run(
        [sys.executable, "-c", MEASURED, module, *arguments],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(process.stderr[-3000:])
    read = int(process.stderr.rsplit("\nIO ", 1)[1].split()[0])
    return seconds, read, process.stderr


def main() -> None:
    (arguments,) = HfArgumentParser(BenchmarkArguments, allow_abbrev=False).parse_args_into_dataclasses()
    work = Path(tempfile.mkdtemp(prefix="parts-read-"))
    text = source_text()
    copies = max(1, arguments.megabytes * 1_000_000 // len(text))
    layouts = {"1 file": work / "one", f"{arguments.files} files": work / "many"}
    (layouts["1 file"]).mkdir()
    with open(layouts["1 file"] / "corpus.txt", "wb") as f:
        for _ in range(copies):
            f.write(text)
    many = layouts[f"{arguments.files} files"]
    many.mkdir()
    for index in range(arguments.files):  # the same bytes, cut into files at line ends
        share = copies // arguments.files + (index < copies % arguments.files)
        (many / f"corpus-{index:02d}.txt").write_bytes(text * share)
    corpus_bytes = len(text) * copies
    tiny = text[: text.index(b"\n", 65_536) + 1]  # a few hundred lines: enough for a sample
    (work / "tiny.txt").write_bytes(tiny)

    tokenizer = str(work / "tokenizer")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "components.tokenizer",
            "--corpus",
            "embedded",
            "--vocab_size",
            "8000",
            "--output",
            tokenizer,
        ],
        cwd=PROJECT,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT)},
    )

    def shards(corpus: str, output: Path, num_parts: int, part: int) -> tuple[float, int, str]:
        return run_measured(
            "components.shards",
            *("--corpus", corpus, "--tokenizer", tokenizer, "--output", str(output)),
            *("--num_parts", str(num_parts), "--part", str(part), "--records_per_shard", "100000"),
        )

    _, baseline_read, _ = shards(str(work / "tiny.txt"), work / "baseline", 1, 0)
    baseline = baseline_read - len(tiny)  # what the process reads besides the corpus
    rows = []
    for layout, folder in layouts.items():
        corpus = str(folder / "*.txt")
        for num_parts in (1, arguments.parts):
            output = work / f"shards-{folder.name}-{num_parts}"
            for part in range(num_parts):
                seconds, read, _ = shards(corpus, output, num_parts, part)
                manifest = json.loads(next((output / "parts").glob(f"{part:05d}-of-*.json")).read_text())
                rows.append(
                    {
                        "layout": layout,
                        "parts": num_parts,
                        "part": part,
                        "seconds": round(seconds, 1),
                        "os_bytes_read": read - baseline,
                        "reader_bytes_read": manifest["bytes_read"],
                        "samples": manifest["num_records"],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu_count": os.cpu_count(),
        "corpus_bytes": corpus_bytes,
        "baseline_os_bytes_read": baseline,
        "rows": rows,
    }
    Path(arguments.output).parent.mkdir(parents=True, exist_ok=True)
    Path(arguments.output).write_text(json.dumps(result, indent=2) + "\n")

    print(f"\ncorpus {corpus_bytes:,} bytes\n")
    print("| layout | parts | part | seconds | bytes read (OS) | bytes read (reader) | share of the corpus |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['layout']} | {row['parts']} | {row['part']} | {row['seconds']} | {row['os_bytes_read']:,} | "
            f"{row['reader_bytes_read']:,} | {row['reader_bytes_read'] / corpus_bytes:.1%} |"
        )
    for layout in layouts:
        for num_parts in (1, arguments.parts):
            run = [row for row in rows if row["layout"] == layout and row["parts"] == num_parts]
            total = sum(row["reader_bytes_read"] for row in run)
            print(
                f"{layout}, {num_parts} part(s): {sum(r['seconds'] for r in run):.1f} s in all, the parts read "
                f"{total:,} bytes = {total / corpus_bytes:.4f} x the corpus (OS: "
                f"{sum(r['os_bytes_read'] for r in run) / corpus_bytes:.4f} x)"
            )


if __name__ == "__main__":
    main()
