"""The bad-input table: what users type wrong, the exact line they get back, and that nothing was written,
pushed or submitted. docs/troubleshooting.md lists the same messages (a test below keeps the two in step).

Each case runs a ``tpu-mlm`` job as a user would. ``…`` in a message stands for text that differs from run
to run (temporary folders, tokenizer fingerprints). Cases that could reach the Hub run in a subprocess
pointed at the local Hub stand-in, so "nothing pushed" is checked where a push would land.
"""

import gzip
import re
import shlex
import shutil
from dataclasses import dataclass

import pytest
from backports import zstd
from conftest import HUB_TOKEN, PROJECT_ROOT, run_module
from google.cloud.aiplatform_v1.services.job_service import JobServiceClient
from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

from components.lib.shard_set import read_manifest
from components.shards import ShardArguments, write_shards
from components.tokenizer import TokenizerArguments, train_tokenizer
from pipelines.cli import main as tpu_mlm
from pipelines.pipeline import compile_pipeline

TABLE_DOC = PROJECT_ROOT / "docs" / "troubleshooting.md"  # its "Bad input fails early" table


@dataclass(frozen=True)
class Case:
    job: str
    command: str  # the job's arguments as typed; {name} stands for a real input of the test's
    message: str  # what follows "error: " on the last line of stderr
    hub_token: str | None = None  # run against the Hub stand-in with this HF_TOKEN ("" = none)


CASES = {
    # corpora and URIs
    "unsupported URI scheme": Case(
        "tokenizer",
        "--corpus s3://bucket/a.txt --output {out}",
        "--corpus='s3://bucket/a.txt': unsupported URI scheme 's3'; use a local path or gs://bucket/path",
    ),
    "bucket missing from a gs:// URI": Case(
        "tokenizer",
        "--output gs:///tokenizer",
        "--output='gs:///tokenizer': a gs:// URI needs a bucket name: gs://bucket/path",
    ),
    "corpus files that do not exist": Case(
        "tokenizer",
        "--corpus {data}/missing/*.txt --output {out}",
        "--corpus='…/missing/*.txt': no file matches this path; expected 'embedded', 'hf:NAME[:CONFIG[:SPLIT]]', or "
        "comma-separated local/gs:// paths or globs of .json, .jsonl, .parquet, .txt files (all but .parquet also "
        ".gz/.bz2/.xz/.zst)",
    ),
    "a corpus of blank lines": Case(
        "tokenizer",
        "--corpus {data}/empty.txt --output {out}",
        "--corpus='…/empty.txt': holds no text (every row is empty)",
    ),
    "a text column the files do not have": Case(
        "shards",
        "--tokenizer {tokenizer} --corpus {data}/rows.jsonl --text_column body --output {out}",
        "--text-column='body': …/rows.jsonl has no such column; it has ['text']",
    ),
    # compressed files and encodings
    "a truncated compressed file": Case(
        "shards",
        "--tokenizer {tokenizer} --corpus {data}/cut.txt.gz --output {out}",
        "--corpus='…/cut.txt.gz': cannot be decompressed (Compressed file ended before the end-of-stream marker was "
        "reached): the file is truncated, or not .gz",
    ),
    "a compressed corpus of fewer files than parts": Case(
        "shards",
        "--tokenizer {tokenizer} --corpus {data}/rows.jsonl.zst --num_parts 2 --part 1 --output {out}",
        "--num-parts=2: the corpus has 1 file(s), 1 of them compressed, and a compressed file cannot be cut into "
        "parts: use num_parts <= 1, or a corpus of at least 2 files",
    ),
    "a compressed parquet file": Case(
        "tokenizer",
        "--corpus {data}/rows.parquet.gz --output {out}",
        "--corpus='…/rows.parquet.gz': a parquet file is compressed inside (its codec); name the .parquet file itself",
    ),
    "text in another encoding than UTF-8": Case(
        "tokenizer",
        "--corpus {data}/latin1.txt --output {out}",
        "--corpus='…/latin1.txt': 11.36% of its bytes are not UTF-8 (5 of 44 read), more than "
        "max_non_utf8_fraction=0.001: re-encode it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8) or raise "
        "max_non_utf8_fraction to read it with those bytes replaced",
    ),
    # tokenizer and shard settings
    "a vocabulary smaller than the special tokens": Case(
        "tokenizer",
        "--vocab_size 4 --output {out}",
        "--vocab-size=4: must be larger than the 5 special tokens ['<s>', '<pad>', '</s>', '<unk>', '<mask>'] and "
        "at most 1,000,000",
    ),
    "a sample length out of range": Case(
        "shards",
        "--tokenizer {tokenizer} --max_length 100000 --output {out}",
        "--max-length=100000: must be from 8 to 8192 tokens",
    ),
    "a part beyond num_parts": Case(
        "shards",
        "--tokenizer {tokenizer} --num_parts 4 --part 4 --output {out}",
        "--part=4: must be from 0 to num_parts-1 = 3",
    ),
    "a folder that is not a tokenizer": Case(
        "shards",
        "--tokenizer {data} --output {out}",
        "--tokenizer='…': is not a tokenizer folder (no tokenizer.json in it)",
    ),
    "a corpus shorter than one sample": Case(
        "shards",
        "--tokenizer {tokenizer} --corpus {data}/tiny.txt --max_length 512 --output {out}",
        "--max-length=512: the corpus gave … tokens, less than one sample; use a larger corpus or a smaller "
        "--max_length",
    ),
    # tokenizer / shards / model mismatches
    "shards of another tokenizer": Case(
        "train",
        "--tokenizer {other_tokenizer} --train_shards {shards} --output {out}",
        "--train-shards='…': were made with another tokenizer (sha256:…) than --tokenizer (sha256:…)",
    ),
    "a truncated shard": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {truncated} --output {out}",
        "--train-shards='…': shard … has 100 bytes, manifest.json says …: it is truncated or was replaced; write "
        "the shards again",
    ),
    "a shard folder that is not finished": Case(
        "evaluate",
        "--model {data} --shards {data} --output {out}",
        "--shards='…': holds no finished shard set (no manifest.json; is the run complete?)",
    ),
    "an unknown model preset": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --model_config roberta-huge --output {out}",
        "--model-config='roberta-huge': unknown preset; use one of ['mini', 'roberta-base', 'roberta-large', "
        "'tiny'], a config.json path or URI, or a Hub model name",
    ),
    "a fill-mask sentence without <mask>": Case(
        "evaluate",
        "--model {data} --shards {shards} --fill_mask 'No mask here.' --output {out}",
        "--fill-mask='No mask here.': each sentence needs exactly one <mask>",
    ),
    # sizes and batch arithmetic
    "a negative learning rate": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --learning_rate -0.0001 --output {out}",
        "--learning-rate=-0.0001: must be a positive number (1e-4 is usual)",
    ),
    "a rehearsed restart with no checkpoint before the end": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --max_steps 10 --checkpoint_every_steps 10 "
        "--rehearse_restart --output {out}",
        "--rehearse-restart=True: needs a checkpoint before the end to restart from: checkpoint_every_steps (10) must "
        "be below the training's 10 steps",
    ),
    "a learning-rate schedule the recipes do not have": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --lr_schedule cosine --output {out}",
        "--lr-schedule='cosine': must be one of ('linear', 'wsd')",
    ),
    "a negative clip norm": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --clip_norm -0.5 --output {out}",
        "--clip-norm=-0.5: must be 0 (no clipping) or positive (1.0 is usual)",
    ),
    "a global batch larger than the data": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --per_replica_batch_size 100000 --output {out}",
        "--per-replica-batch-size=100000: x 1 replica(s) = global batch 100000, more than the … training samples",
    ),
    "a batch too large only for the 8 replicas of a v3-8": Case(
        "preflight",
        "--tokenizer {tokenizer} --train_shards {shards} --model_config tiny --replicas 8 --per_replica_batch_size "
        "256 --output {out}",
        "--per-replica-batch-size=256: x 8 replica(s) = global batch 2048, more than the … training samples",
    ),
    "a batch of roberta-large that cannot fit the memory of a v3-8's cores": Case(
        "preflight",
        "--tokenizer {tokenizer} --train_shards {shards} --tpu_type v3-8 --model_config roberta-large "
        "--per_replica_batch_size 96 --gradient_accumulation_steps 1 --output {out}",
        "--per-replica-batch-size=96: needs at least 23.9 GiB per replica (4.6 GiB weights and optimizer state, the "
        "rest activations), more than a v3-8 replica's 16 GiB; a per-replica batch of 24 fits, and --bf16 true halves "
        "the activations",
    ),
    "a replica count that is not the TPU's": Case(
        "preflight",
        "--tokenizer {tokenizer} --train_shards {shards} --tpu_type v5e-4 --replicas 8 --output {out}",
        "--replicas=8: a v5e-4 has 4 replicas",
    ),
    # wrong parameter types
    "a word where a number goes": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --max_steps ten --output {out}",
        "argument --max_steps/--max-steps: invalid int value: 'ten'",
    ),
    "a yes/no flag given something else": Case(
        "shards",
        "--tokenizer {tokenizer} --overwrite maybe --output {out}",
        "argument --overwrite: Truthy value expected: got maybe but expected one of yes/no, true/false, t/f, y/n, "
        "1/0 (case insensitive).",
    ),
    # the Hub
    "a Hub repository id without a namespace": Case(
        "push",
        "--model {data} --repo_id no-namespace",
        "--repo-id='no-namespace': must be a Hub repository id 'namespace/name' (letters, digits, '-', '_', '.')",
        hub_token=HUB_TOKEN,
    ),
    "a push without a token": Case(
        "push",
        "--model {data} --repo_id user/model",
        "--repo-id='user/model': a Hub push needs a write token in HF_TOKEN, which is not set",
        hub_token="",
    ),
    "a token that may only read": Case(
        "preflight",
        "--tokenizer {tokenizer} --train_shards {shards} --model_config tiny --per_replica_batch_size 8 "
        "--hub_repo_id user/model --output {out}",
        "--hub-repo-id='user/model': the Hub token may not write (its role is 'read')",
        hub_token="hf_read_only",
    ),
    "checkpoint pushes without a token": Case(
        "train",
        "--tokenizer {tokenizer} --train_shards {shards} --hub_repo_id user/model --output {out}",
        "--hub-repo-id='user/model': a Hub push needs a write token in HF_TOKEN, which is not set",
        hub_token="",
    ),
    "a token value where a secret name goes": Case(
        "push",
        "--model {data} --repo_id user/model --hf_token_secret hf_abc123",
        "--hf-token-secret='hf_…(redacted)': must be a Secret Manager name: projects/PROJECT/secrets/NAME"
        "[/versions/V]; a token itself goes into the secret (docs/vertex-ai.md, step 3) or into HF_TOKEN, never on "
        "the command line: if you typed one here, revoke it and make another",
        hub_token=HUB_TOKEN,
    ),
    "a Hub token typed after a flag the job does not have": Case(
        "push",
        "--model {data} --repo_id user/model --hf_token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
        "--hf-token='hf_…(redacted)': is not a flag of this job; a credential is never given on the command line: the "
        "Hub token is read from HF_TOKEN, or from the Secret Manager secret --hf_token_secret names (the token typed "
        "here is in your shell's history: revoke it and make another)",
        hub_token=HUB_TOKEN,
    ),
    "a flag cut short": Case(
        "push",
        "--model {data} --repo user/model",
        "--repo='user/model': is not a flag of this job; did you mean --repo_id?",
    ),
    # exporting a model trained before the PyTorch weights
    "a model folder without TF weights": Case(
        "export",
        "--model {no_tf_weights} --output {out}",
        "--model='…': holds no TF model weights (tf_model.h5)",
    ),
    "a Hub model repository that does not exist": Case(
        "export",
        "--model hf:user/missing --output {out}",
        "--model='hf:user/missing': no such Hub model repository, or it needs a token that may read it",
        hub_token=HUB_TOKEN,
    ),
    "an export to the Hub without a token": Case(
        "export",
        "--model {no_tf_weights} --output hf:user/model",
        "--output='hf:user/model': a Hub push needs a write token in HF_TOKEN, which is not set",
        hub_token="",
    ),
    # the pipeline: compiling, submitting, running locally
    "an unknown TPU type": Case(
        "compile",
        "--tpu_type v4-32 --tpu_image tpu:1 --output {out}",
        "argument --tpu_type/--tpu-type: invalid choice: 'v4-32' (choose from 'v3-8', 'v5e-1', 'v5e-4', 'v5e-8', "
        "'v5e-16', 'v5e-32')",
    ),
    "a Vertex pipeline with the local CPU image": Case(
        "compile",
        "--target vertex --tpu_image us-docker.pkg.dev/p/r/tpu:1 --output {out}",
        "--cpu-image='tpu-mlm-cpu:latest': is a local image name; Vertex AI pulls images from a registry: name its "
        "URI (REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG)",
    ),
    "a JSON file that is not JSON lines": Case(
        "tokenizer",
        "--corpus {data}/array.json --output {out}",
        "--corpus='…/array.json': is not JSON lines (one object per line; Expecting value: line 1 column 2 (char 1)); "
        ".json files are read as JSON lines",
    ),
    "a Vertex pipeline without a TPU image": Case(
        "compile",
        "--target vertex --output {out}",
        "--tpu-image='': the vertex target needs the TPU image's URI",
    ),
    "a misspelt pipeline parameter": Case(
        "submit",
        """--template {template} --project my-proj --pipeline_root gs://b/r --parameters '{{"max_step": 1}}'""",
        "--parameters='max_step': is not a parameter of this pipeline; known: […]",
    ),
    "a pipeline parameter of the wrong type": Case(
        "submit",
        """--template {template} --project my-proj --pipeline_root gs://b/r --parameters '{{"max_steps": "ten"}}'""",
        "--max-steps='ten': must be of type number_integer",
    ),
    "a Vertex push without a secret": Case(
        "submit",
        """--template {template} --project my-proj --pipeline_root gs://b/r --parameters '{{"hub_repo_id": "me/x"}}'""",
        "--hf-token-secret='': a Hub push on Vertex AI reads its token from a Secret Manager secret; name it",
    ),
    "a local pipeline root on Vertex": Case(
        "submit",
        "--template {template} --project my-proj --pipeline_root /local/root",
        "--pipeline-root='/local/root': must be a gs:// URI on Vertex AI",
    ),
    "a smoke job writing to a local folder": Case(
        "smoke",
        "--project my-proj --scratch /tmp/smoke --tpu_image us-docker.pkg.dev/p/r/tpu:1",
        "--scratch='/tmp/smoke': must be a gs:// folder: the job on Vertex AI writes there",
    ),
    "a smoke job of hours": Case(
        "smoke",
        "--project my-proj --scratch gs://b/smoke --tpu_image us-docker.pkg.dev/p/r/tpu:1 --timeout_minutes 600",
        "--timeout-minutes=600: must be from 5 to 120 minutes",
    ),
    "a service account's name for its email": Case(
        "smoke",
        "--project my-proj --scratch gs://b/smoke --tpu_image us-docker.pkg.dev/p/r/tpu:1 --service_account trainer",
        "--service-account='trainer': must be a service account's email (NAME@PROJECT.iam.gserviceaccount.com)",
    ),
    "a smoke job that may wait in the queue for ever": Case(
        "smoke",
        "--project my-proj --scratch gs://b/smoke --tpu_image us-docker.pkg.dev/p/r/tpu:1 --max_queued_minutes 0",
        "--max-queued-minutes=0.0: must be above 0 and at most 1440",
    ),
    "a region that is no region's name": Case(
        "status",
        "tpu-mlm-20260101-120000 --project my-proj --region x@127.0.0.1:8443#",
        "--region='x@127.0.0.1:8443#': must be a region such as us-central1 or europe-west4 (lowercase letters, a "
        "hyphen, letters and a number; Vertex AI's regions: https://cloud.google.com/vertex-ai/docs/general/locations)",
    ),
    "an endpoint with more than a host": Case(
        "cancel",
        "tpu-mlm-20260101-120000 --project my-proj --api_endpoint https://me@127.0.0.1:8443",
        "--api-endpoint='https://…(redacted)@127.0.0.1:8443': must be a host name, with a port and an http(s):// "
        "scheme if need be (us-central1-aiplatform.googleapis.com), no user, path, query or fragment; leave it out "
        "for the default",
    ),
    "a poll interval below zero": Case(
        "status",
        "tpu-mlm-20260101-120000 --project my-proj --follow --poll_seconds -1",
        "--poll-seconds=-1.0: must be above 0 and at most 3600 (30 is the default)",
    ),
    "a bucket as the kfp.local root": Case(
        "run-local",
        "--pipeline_root gs://bucket/runs",
        "--pipeline-root='gs://bucket/runs': kfp.local needs a local folder; put gs:// in --output_root",
    ),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, embedded_tokenizer) -> dict[str, str]:
    """Real, valid inputs for the arguments a case does not get wrong."""
    root = tmp_path_factory.mktemp("bad-input")
    data = root / "data"
    data.mkdir()
    (data / "empty.txt").write_text("\n\n  \n")
    (data / "tiny.txt").write_text("a few words\n")
    (data / "rows.jsonl").write_text('{"text": "hello"}\n')
    (data / "array.json").write_text('[\n{"text": "hello"}\n]\n')
    (data / "cut.txt.gz").write_bytes(gzip.compress(b"a few words\n" * 1000)[:40])
    (data / "rows.jsonl.zst").write_bytes(zstd.compress(b'{"text": "hello"}\n'))
    (data / "rows.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    (data / "latin1.txt").write_bytes("Un café crème et une crêpe, à la française.\n".encode("latin-1"))
    shards = str(root / "shards")
    write_shards(ShardArguments(output=shards, tokenizer=embedded_tokenizer, records_per_shard=2000))
    truncated = root / "truncated"
    shutil.copytree(shards, truncated)
    first = truncated / read_manifest(shards)["files"][0]["name"]
    first.write_bytes(first.read_bytes()[:100])
    other_tokenizer = str(root / "other-tokenizer")
    train_tokenizer(TokenizerArguments(output=other_tokenizer, vocab_size=1000))
    template = compile_pipeline(str(root / "pipeline.yaml"), target="vertex", tpu_image="tpu:1")
    no_tf_weights = root / "no-tf-weights"  # a model folder without its weights
    no_tf_weights.mkdir()
    (no_tf_weights / "config.json").write_text('{"model_type": "roberta"}')
    return {
        "no_tf_weights": str(no_tf_weights),
        "data": str(data),
        "tokenizer": embedded_tokenizer,
        "other_tokenizer": other_tokenizer,
        "shards": shards,
        "truncated": str(truncated),
        "template": template,
    }


def pattern(message: str) -> str:
    return ".+".join(re.escape(part) for part in message.split("…"))


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_clear_line_and_nothing_is_written_pushed_or_submitted(
    name, inputs, tmp_path, capsys, monkeypatch, request
):
    case = CASES[name]
    out = tmp_path / "out"
    args = [arg.format(out=out, **inputs) for arg in shlex.split(case.command)]
    if case.job == "run-local":
        monkeypatch.chdir(tmp_path)  # a wrongly accepted root would appear here
    if case.hub_token is None:
        monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", lambda *a, **k: pytest.fail("submitted"))
        monkeypatch.setattr(JobServiceClient, "create_custom_job", lambda *a, **k: pytest.fail("submitted"))
        try:
            code = tpu_mlm([case.job, *args])
        except SystemExit as exit:  # argparse's own errors (wrong types)
            code = exit.code
        stderr = capsys.readouterr().err
    else:
        hub = request.getfixturevalue("hub")
        env = {**hub.env, "HF_TOKEN": case.hub_token}
        process = run_module("pipelines.cli", case.job, *args, env=env)
        code, stderr = process.returncode, process.stderr
        assert hub.repos == {} and not [r for r in hub.requests if r[0] != "GET"], "something reached the Hub"
    assert code == 2, stderr
    last_line = stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"(.+: )?error: " + pattern(case.message), last_line), last_line
    assert "Traceback" not in stderr
    assert not out.exists(), f"{name}: wrote {sorted(p.name for p in out.rglob('*'))}"
    assert list(tmp_path.iterdir()) == [], "something was written beside the output"


def test_the_documented_table_lists_every_message():
    documented = TABLE_DOC.read_text()
    missing = [name for name, case in CASES.items() if f"`{case.message}`" not in documented]
    assert not missing, f"not in {TABLE_DOC.relative_to(PROJECT_ROOT)}: {missing}"
    assert len(CASES) >= 20
