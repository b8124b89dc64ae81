"""Secrets never echoed, addresses never chosen by input (issue 45 §5), through the project's own commands.

A Hub token typed where it does not belong (an abbreviation of a flag, a flag the job does not have, the secret
name's flag, a number's flag, --parameters' JSON) is refused in one line that never shows it; a region or an
endpoint that could carry a host name of its own (``x@127.0.0.1:PORT#``) is refused before any connection, so no
credential goes to an address built from input.
"""

import socket
import threading

import pytest
from conftest import HUB_TOKEN

from components.lib.errors import InvalidParameter
from pipelines.cli import main as tpu_mlm
from pipelines.quota import QuotaArguments
from pipelines.vertex_jobs import api_session, check_region, job_client, pipeline_client

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # a Hub token's form: hf_ and 34 letters and digits
ACCESS_TOKEN = "ya29.a0AfB_byC-example-access-token"  # a Google OAuth access token's form


def refusal(argv: list[str], capsys) -> str:
    """The last line ``tpu-mlm ARGV`` prints on stderr, after checking it refused with 2 and no traceback."""
    try:
        code = tpu_mlm(argv)
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert "Traceback" not in stderr
    return stderr.strip().splitlines()[-1]


PUSH = ["push", "--model", "/tmp/model", "--repo_id", "user/model"]


@pytest.mark.parametrize(
    "typed",
    [
        ["--hf_token", TOKEN],  # an abbreviation of --hf_token_secret before issue 45
        [f"--hf_token={TOKEN}"],
        ["--hf_token_secret", TOKEN],
        ["--retries", TOKEN],  # argparse's own refusal of a number
        ["--private", TOKEN],  # argparse's own refusal of a yes/no
        [TOKEN],  # a value no flag takes
        ["--token", ACCESS_TOKEN],
    ],
)
def test_a_token_typed_into_the_wrong_place_is_refused_and_never_shown(typed, capsys):
    line = refusal([*PUSH, *typed], capsys)
    secret = typed[-1].split("=")[-1]
    assert secret not in line and secret[:12] not in line, line
    assert "(redacted)" in line, line
    assert "did you mean --hf_token_secret" not in line  # a token is never advised into another flag


def test_a_secret_flag_s_value_is_never_shown_whatever_it_looks_like(capsys):
    line = refusal([*PUSH, "--hf_token_secret", "my-s3cret-Hub-t0ken"], capsys)
    assert "my-s3cret" not in line
    assert line.startswith("error: --hf-token-secret='…(redacted)': must be a Secret Manager name")
    line = refusal([*PUSH, "--api_token", "s3cret-value"], capsys)  # a secret's flag the job does not have
    assert "s3cret" not in line and "is not a flag of this job" in line


def test_flags_are_taken_only_as_spelt_in_full(capsys):
    """``--hf_token_sec`` was --hf_token_secret to argparse; ``--repo`` was --repo_id."""
    line = refusal([*PUSH, "--hf_token_sec", "projects/p/secrets/hub"], capsys)
    assert "--hf-token-sec=" in line and "is not a flag of this job" in line
    line = refusal(["push", "--model", "/tmp/model", "--repo", "user/model"], capsys)
    assert line == "error: --repo='user/model': is not a flag of this job; did you mean --repo_id?"


def test_a_token_in_submit_s_parameters_is_never_shown(tmp_path, capsys):
    template = tmp_path / "pipeline.yaml"
    template.write_text("{}")
    where = ["submit", "--template", str(template), "--project", "my-proj", "--pipeline_root", "gs://b/r"]
    malformed = f'{{"hub_repo_id": "me/x", "hf_token": "{TOKEN}", "hub_secret": "s3cret\\"-value",}}'
    line = refusal([*where, "--parameters", malformed], capsys)
    assert TOKEN not in line and "s3cret" not in line and "-value" not in line  # past an escaped quote too
    assert '"hub_repo_id": "me/x"' in line and "is not a JSON object" in line  # the rest still shown, to find the typo
    line = refusal([*where, "--parameters", "{'HF_TOKEN': 'plain-secret', 'max_steps': 10}"], capsys)  # any case, quote
    assert "plain-secret" not in line and "'max_steps': 10" in line
    line = refusal([*where, "--parameters", f'{{"corpus": "{ACCESS_TOKEN}"'], capsys)  # by its form alone
    assert ACCESS_TOKEN not in line and "ya29.…(redacted)" in line


def test_the_test_token_stays_out_of_a_refusal_too(capsys):
    """The stand-in's own token (not of a real token's form) typed into the secret's flag: shown as redacted."""
    line = refusal([*PUSH, "--hf_token_secret", HUB_TOKEN], capsys)
    assert HUB_TOKEN not in line and "hf_…(redacted)" in line


@pytest.fixture
def listener():
    """A TCP listener on this machine that counts the connections it gets (a TLS handshake would be one)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


RUN = "tpu-mlm-20260101-120000"
SMOKE = ["--scratch", "gs://b/smoke", "--tpu_image", "us-docker.pkg.dev/p/r/tpu:1"]


@pytest.mark.parametrize(
    "command",
    [
        ["status", RUN, "--project", "my-proj"],
        ["status", RUN, "--project", "my-proj", "--follow"],
        ["logs", RUN, "--project", "my-proj"],
        ["cancel", RUN, "--project", "my-proj", "--yes"],
        ["clean", RUN, "--project", "my-proj", "--yes"],
        ["submit", "--template", "pipeline.yaml", "--project", "my-proj", "--pipeline_root", "gs://b/r"],
        ["smoke", "--project", "my-proj", *SMOKE],
    ],
)
def test_a_region_that_could_name_another_host_is_refused_before_any_connection(command, listener, capsys):
    port, accepted = listener
    line = refusal([*command, "--region", f"x@127.0.0.1:{port}#"], capsys)
    assert line.startswith(f"error: --region='x@127.0.0.1:{port}#': must be a region such as us-central1")
    assert accepted == [], "a connection reached the address the region named"


@pytest.mark.parametrize(
    "flag, command",
    [
        ("--api_endpoint", ["status", RUN, "--project", "my-proj"]),
        ("--api_endpoint", ["cancel", RUN, "--project", "my-proj", "--yes"]),
        ("--api_endpoint", ["clean", RUN, "--project", "my-proj", "--yes"]),
        ("--logging_endpoint", ["logs", RUN, "--project", "my-proj"]),
        ("--api_endpoint", ["smoke", "--project", "my-proj", *SMOKE]),
        ("--quota_endpoint", ["smoke", "--project", "my-proj", *SMOKE]),
    ],
)
def test_an_endpoint_with_a_user_or_a_path_is_refused_before_any_connection(flag, command, listener, capsys):
    port, accepted = listener
    for endpoint in (f"127.0.0.1:{port}/x#", f"https://127.0.0.1:{port}?a=b"):
        line = refusal([*command, flag, endpoint], capsys)
        assert line.startswith(f"error: {flag.replace('_', '-')}='{endpoint}': must be a host name"), line
    line = refusal([*command, flag, f"https://me:hunter2@127.0.0.1:{port}"], capsys)  # its password never shown
    assert line.startswith(f"error: {flag.replace('_', '-')}='https://…(redacted)@127.0.0.1:{port}': must be a host")
    assert accepted == []


def test_every_client_built_from_a_region_checks_it():
    """The builders the launcher (whose region comes from the compiled pipeline), status, logs, cancel and smoke
    reach Vertex AI through, and the Cloud Quotas and Logging sessions: a region or an endpoint of another form is
    refused before a client or a session exists."""
    for build in (job_client, pipeline_client):
        with pytest.raises(InvalidParameter, match=r"--region='us-central1@evil\.example#'"):
            build("us-central1@evil.example#")
        with pytest.raises(InvalidParameter, match=r"--api-endpoint="):
            build("us-central1", "https://user@evil.example")
    with pytest.raises(InvalidParameter, match=r"--quota-endpoint="):
        api_session("https://user@evil.example", parameter="quota_endpoint")
    with pytest.raises(InvalidParameter, match=r"--quota-endpoint="):
        QuotaArguments(quota_endpoint="https://cloudquotas.googleapis.com/#")
    for region in ("us-central1", "europe-west4", "northamerica-northeast1", "me-central2", "asia-southeast1"):
        assert check_region(region) == region
    for region in ("global", "US-CENTRAL1", "us-central1.", "us-central1/x", "us-central1?", "us central1", ""):
        with pytest.raises(InvalidParameter, match="must be a region such as us-central1"):
            check_region(region)


def test_following_a_run_with_a_poll_interval_below_zero_is_refused_in_one_line(capsys):
    line = refusal(["status", RUN, "--project", "my-proj", "--follow", "--poll_seconds", "-1"], capsys)
    assert line == "error: --poll-seconds=-1.0: must be above 0 and at most 3600 (30 is the default)"


def test_a_service_that_never_answers_ends_in_one_line_with_what_to_do(monkeypatch, capsys):
    """The endpoint given is closed: the client's retries run out (shortened here) and the command ends with exit 1
    and one line, not RetryError's traceback."""
    import pipelines.runs

    monkeypatch.setattr(pipelines.runs, "FIRST_CALL_RETRY_SECONDS", 1.0)  # the first call's deadline (30 s)
    with socket.socket() as closed:  # bound, never listening: refused, and no other process can take the port
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        code = tpu_mlm(["status", RUN, "--project", "my-proj", "--api_endpoint", f"http://127.0.0.1:{port}"])
    stderr = capsys.readouterr().err
    assert code == 1 and "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error: Google Cloud could not be reached") and line.endswith("run the command again")
