"""Talking to the Hugging Face Hub: repository ids, the token, and pushing a folder in one commit, retried
with backoff after transient errors.

The token is read from ``HF_TOKEN`` and never written into arguments, logs or artifacts. ``HF_ENDPOINT``
points the client at another Hub (the tests use a local stand-in of its HTTP API).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from components.lib.errors import InvalidParameter, ServiceFailed

log = logging.getLogger("tpu_mlm.hub")
T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_RETRIES = 4
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,63}$")  # the Hub's ids: apache-2.0, cc-by-nc-sa-4.0, llama3.1
CARD_FILE = "README.md"  # a Hub repository's card: its metadata (license, base_model) and text

SECRET_NAME = re.compile(r"^projects/[\w.:-]+/secrets/[\w-]{1,255}(/versions/(latest|\d+))?$")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


@dataclass(kw_only=True)
class HubToken:
    """Where a job that reads from or writes to the Hub gets its token (corpus steps, preflight, push, export)."""

    hf_token_secret: str = field(
        default="",
        metadata={"help": "Secret Manager secret holding the Hub token (projects/P/secrets/NAME); else HF_TOKEN."},
    )


def check_repo_id(parameter: str, repo_id: str) -> str:
    if not REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id or repo_id.endswith((".", "-")):
        raise InvalidParameter(
            parameter, repo_id, "must be a Hub repository id 'namespace/name' (letters, digits, '-', '_', '.')"
        )
    return repo_id


def check_retries(retries: int) -> int:
    if not 0 <= retries <= 10:
        raise InvalidParameter("retries", retries, "must be from 0 to 10")
    return retries


def check_secret_name(secret: str) -> str:
    if not SECRET_NAME.match(secret):
        expected = "must be a Secret Manager name: projects/PROJECT/secrets/NAME[/versions/V]"
        if "/" not in secret:  # a token itself, most likely: where it goes, never echoed (errors.shown_value)
            expected += (
                "; a token itself goes into the secret (docs/vertex-ai.md, step 3) or into HF_TOKEN, never on the "
                "command line: if you typed one here, revoke it and make another"
            )
        raise InvalidParameter("hf_token_secret", secret, expected)
    return secret if "/versions/" in secret else secret + "/versions/latest"


def secret_token(secret: str) -> str:
    """The Hub token stored in Secret Manager (how Vertex AI jobs get secrets: custom jobs have no
    secret-backed environment variables)."""
    from google.cloud import secretmanager

    client = secretmanager.SecretManagerServiceClient()
    return client.access_secret_version(name=check_secret_name(secret)).payload.data.decode("utf-8").strip()


def hub_token(parameter: str, repo_id: str, secret: str = "") -> str:
    """The Hub token from the Secret Manager ``secret`` when one is named, else from ``HF_TOKEN``; the error
    names the parameter that asked for a push to ``repo_id``."""
    if secret:
        return secret_token(secret)
    token = os.environ.get("HF_TOKEN", "").strip()
    if not token:
        raise InvalidParameter(parameter, repo_id, "a Hub push needs a write token in HF_TOKEN, which is not set")
    return token


def read_token(secret: str = "") -> str:
    """The token a Hub repository is read with, when one is at hand (private repositories need it): the Secret
    Manager ``secret``'s where one is named (a step on Vertex AI), else ``HF_TOKEN``'s; "" without one."""
    return secret_token(secret) if secret else os.environ.get("HF_TOKEN", "").strip()


@contextlib.contextmanager
def refused_reads(parameter: str, named: str, repo_id: str, revision: str | None, token: str) -> Iterator[None]:
    """Turns the Hub's refusals of a read of ``repo_id`` (no such repository or revision, no access) into one line
    naming ``parameter`` and its value ``named``."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        yield
    except RevisionNotFoundError as error:
        raise InvalidParameter(parameter, named, f"{repo_id} has no revision {revision!r}") from error
    except (RepositoryNotFoundError, GatedRepoError) as error:
        reason = "a token in HF_TOKEN that may read it" if not token else "a token that may read it"
        raise InvalidParameter(parameter, named, f"no such Hub model repository, or it needs {reason}") from error


def is_transient(error: BaseException) -> bool:
    """Worth another try: rate limiting, a server error or a dropped connection, not a refusal."""
    import requests
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return error.response.status_code in TRANSIENT_STATUSES
    return isinstance(error, requests.ConnectionError | requests.Timeout)


def with_retries(action: Callable[[], T], what: str, retries: int = DEFAULT_RETRIES, first_delay: float = 1.0) -> T:
    """``action()``, tried again up to ``retries`` times after transient errors, waiting 1, 2, 4 ... s
    (with jitter) in between. Hub commits are atomic, so trying a whole upload again is safe."""
    for attempt in range(retries + 1):
        try:
            return action()
        except Exception as error:
            if not is_transient(error):
                raise
            reason = str(error).splitlines()[0]
            if attempt == retries:
                raise ServiceFailed(f"{what} failed {retries + 1} times; the last error: {reason}") from error
            delay = first_delay * 2**attempt * random.uniform(0.8, 1.2)
            log.warning("%s failed (%s); try %d of %d in %.1f s", what, reason, attempt + 2, retries + 1, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def create_repo(repo_id: str, token: str, private: bool, retries: int = DEFAULT_RETRIES) -> None:
    from huggingface_hub import HfApi

    with_retries(
        lambda: HfApi(token=token).create_repo(repo_id, private=private, exist_ok=True),
        f"creating the Hub repository {repo_id}",
        retries,
    )


def push_folder(
    folder: Path,
    repo_id: str,
    token: str,
    message: str,
    ignore: list[str] | None = None,
    retries: int = DEFAULT_RETRIES,
) -> Any:
    """Uploads ``folder`` to ``repo_id`` in one commit; unchanged content makes no new commit."""
    from huggingface_hub import HfApi

    commit = with_retries(
        lambda: HfApi(token=token).upload_folder(
            repo_id=repo_id, folder_path=folder, commit_message=message, ignore_patterns=ignore
        ),
        f"pushing {folder} to the Hub repository {repo_id}",
        retries,
    )
    log.info("pushed %s to %s (commit %s)", folder, repo_id, commit.oid)
    return commit


def download_repo(
    parameter: str,
    repo_id: str,
    folder: Path,
    token: str,
    retries: int = DEFAULT_RETRIES,
    revision: str | None = None,
    patterns: list[str] | None = None,
) -> Path:
    """The files of the model repository ``repo_id`` at ``revision`` (its default branch: None) in ``folder``, those
    matching ``patterns`` (all: None); a repository or revision that does not exist, or that the token may not read,
    is refused naming ``parameter``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    check_repo_id(parameter, repo_id)
    named = f"hf:{repo_id}" + (f"@{revision}" if revision else "")
    try:
        with refused_reads(parameter, named, repo_id, revision, token):
            with_retries(
                lambda: snapshot_download(
                    repo_id, revision=revision, token=token or None, local_dir=folder, allow_patterns=patterns
                ),
                f"downloading the Hub repository {repo_id}",
                retries,
            )
    except LocalEntryNotFoundError as error:  # the Hub could not be reached (offline, a dropped connection)
        raise ServiceFailed(f"downloading the Hub repository {repo_id}: the Hub could not be reached") from error
    return folder


class BackgroundPush:
    """Pushes folders to a Hub repository from a background thread while training goes on: at most one push
    in flight (the next one waits for it, so commits keep their order), each folder deleted once pushed. A
    push that fails, retries included, is logged and listed by :meth:`close`, and training goes on."""

    def __init__(self, repo_id: str, token: str, retries: int = DEFAULT_RETRIES):
        from concurrent.futures import ThreadPoolExecutor

        self._repo_id, self._token, self._retries = repo_id, token, retries
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hub-push")
        self._pending: Any = None
        self._failures: list[str] = []

    def submit(self, folder: Path, message: str) -> None:
        self._wait()
        self._pending = self._executor.submit(self._push, folder, message)

    def _push(self, folder: Path, message: str) -> None:
        import shutil

        try:
            push_folder(folder, self._repo_id, self._token, message, retries=self._retries)
        except Exception as error:  # reported, never raised: a lost checkpoint push must not stop training
            reason = f"{message}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            log.warning("background push to %s failed (%s); training goes on", self._repo_id, reason)
            self._failures.append(reason)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> list[str]:
        """Waits for the push in flight; returns the pushes that failed."""
        self._wait()
        self._executor.shutdown()
        return list(self._failures)
