"""Vertex AI custom jobs, as this project creates and waits on them (the smoke test's job, the pipeline's TPU task):
the job service's client, and a wait that never leaves a job to start and bill with nobody waiting on it.

A wait follows the job's state until it ends. It cancels the job it follows when it has stayed queued or pending
longer than its limit (no TPU capacity, no quota), and when whoever waits is stopped: a SIGTERM (a pipeline task
cancelled) or a Ctrl-C (a second Ctrl-C leaves without waiting for the cancel to take, saying how to check it).
"""

from __future__ import annotations

import logging
import re
import shlex
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from components.lib.errors import InvalidParameter, ServiceFailed
from components.lib.tpu_catalogue import TpuType
from components.slice import launched

log = logging.getLogger("tpu_mlm.vertex")

SUCCEEDED = "JOB_STATE_SUCCEEDED"
# where a wait ends without success (a paused job is not running: GCPC's launcher ends there too)
ENDED_WITHOUT_SUCCESS = ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED", "JOB_STATE_PAUSED")
TERMINAL_STATES = (SUCCEEDED, *ENDED_WITHOUT_SUCCESS)
# before the job runs: queued, then pending while its VMs are provisioned and its image pulled (whether
# provisioning is billed is not said in what was read)
WAITING_STATES = ("JOB_STATE_QUEUED", "JOB_STATE_PENDING")
# google.rpc.Code values of a job's error that another try would meet again (GCPC's launcher's list): invalid
# argument, not found, already exists, permission denied, failed precondition, out of range, unimplemented
USER_ERROR_CODES = (3, 5, 6, 7, 9, 11, 12)
# where a pipeline job ends (a paused one can be resumed: not ended)
PIPELINE_SUCCEEDED = "PIPELINE_STATE_SUCCEEDED"
PIPELINE_TERMINAL_STATES = (PIPELINE_SUCCEEDED, "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
CANCEL_WAIT_SECONDS = 300.0  # how long a stopped wait follows the cancel before it leaves
CALL_TIMEOUT_SECONDS = 60.0  # one call to the job service; a hung connection must not stall the wait
CALL_RETRY_SECONDS = 600.0  # transient errors (503, 429, a reset connection) retried for this long, as GCPC does
# a command's first call (status, logs, cancel): an endpoint, region or network that cannot be reached is said in
# seconds, not after the ten minutes a run's later calls wait out
FIRST_CALL_RETRY_SECONDS = 30.0


def call(method: Any, retry_seconds: float = CALL_RETRY_SECONDS, **request: Any) -> Any:
    """A job-service call that can be repeated (get, list, cancel), retried on transient errors (a timed-out read
    and a 504 among them, which the client's own predicate leaves out) for ``retry_seconds`` and bounded in time."""
    import requests
    from google.api_core import exceptions
    from google.api_core.retry import Retry, if_transient_error

    def transient(error: Exception) -> bool:
        timed_out = (requests.exceptions.Timeout, exceptions.DeadlineExceeded, exceptions.GatewayTimeout)
        return if_transient_error(error) or isinstance(error, timed_out)

    # an attempt's timeout within the deadline, which is checked only between attempts
    timeout = min(CALL_TIMEOUT_SECONDS, retry_seconds)
    return method(**request, retry=Retry(predicate=transient, deadline=retry_seconds), timeout=timeout)


def location_path(project: str, location: str) -> str:
    """Where a project's custom jobs live in a region: the parent of their names."""
    return f"projects/{project}/locations/{location}"


def create_job(client: Any, project: str, location: str, job: Any) -> Any:
    """Creates the custom job ``job``; not retried (a retried create could make two jobs), bounded in time."""
    return client.create_custom_job(
        parent=location_path(project, location), custom_job=job, timeout=CALL_TIMEOUT_SECONDS
    )


def tpu_worker_pool(
    tpu: TpuType, image: str, command: list[str], args: list[str], env: dict[str, str], report_dir: str = ""
) -> dict[str, Any]:
    """The one worker pool of a custom job on the TPU ``tpu``, as the job service takes it: the TPU's machine (a v5e
    by machine type and topology, no accelerator fields), one replica (a slice's hosts come with its machine, a
    container each), and the container that runs ``command`` with ``args`` (under the slice launcher on a slice of
    several hosts, each host's findings under ``report_dir`` when given) with the TPU runtime's settings ``env``.
    No ``disk_spec``: a TPU VM brings its own boot disk."""
    return {
        "machine_spec": tpu.machine_spec,
        "replica_count": 1,
        "container_spec": {
            "image_uri": image,
            "command": launched(tpu, command, report_dir),
            "args": args,
            "env": [{"name": name, "value": value} for name, value in sorted(env.items())],
        },
    }


# A Google Cloud region's name: us-central1, europe-west4, northamerica-northeast1, me-central2. Nothing that could
# carry a host name's '@', ':', '/', '#' or '?': the API's host name is built from it, and gets the user's credentials.
REGION = re.compile(r"[a-z]{2,20}-[a-z]{2,20}[0-9]{1,2}")
REGIONS_PAGE = "https://cloud.google.com/vertex-ai/docs/general/locations"
# An endpoint given explicitly: a host name or IPv4 address, a port, an http(s):// scheme; no user, path, query or
# fragment (an '@' would send the request, and its credentials, to the host after it).
ENDPOINT = re.compile(
    r"(https?://)?(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(:[0-9]{1,5})?/?"
)


def check_region(region: str, parameter: str = "region") -> str:
    """``region`` when it is a Google Cloud region's name: every host name this project builds from a region goes
    through here, before any credential is sent. ``global`` is none: no custom job or pipeline runs there."""
    if not REGION.fullmatch(region):
        raise InvalidParameter(
            parameter,
            region,
            "must be a region such as us-central1 or europe-west4 (lowercase letters, a hyphen, letters and a number; "
            f"Vertex AI's regions: {REGIONS_PAGE})",
        )
    return region


# A Google Cloud project's id: every resource name this project sends is built from it ('/' would name another path)
PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")


def check_project(project: str) -> str:
    """``project`` when it is a Google Cloud project's id: submit's, status's, logs's, cancel's and clean's."""
    if not PROJECT.fullmatch(project):
        raise InvalidParameter(
            "project", project, "is not a Google Cloud project id (6-30 lowercase letters, digits and hyphens)"
        )
    return project


def check_endpoint(parameter: str, endpoint: str) -> str:
    """An endpoint given explicitly (``""``: the default, left alone): a host name with an optional port and scheme."""
    if endpoint and not ENDPOINT.fullmatch(endpoint):
        raise InvalidParameter(
            parameter,
            re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/@]*@", r"\1…(redacted)@", endpoint),  # a password in it
            "must be a host name, with a port and an http(s):// scheme if need be (us-central1-aiplatform."
            "googleapis.com), no user, path, query or fragment; leave it out for the default",
        )
    return endpoint


def endpoint_url(endpoint: str) -> str:
    """An endpoint (``check_endpoint``'s) as the base of the URLs an HTTP session requests: https:// where it names no
    scheme (as Google's clients take a bare host), no trailing '/'."""
    url = endpoint if "://" in endpoint else f"https://{endpoint}"
    return url.rstrip("/")


def chain_post_init(cls: type, self: Any) -> None:
    """Runs the ``__post_init__`` that follows ``cls``'s in ``self``'s classes, where there is one: the argument
    mixins below check their own fields and let the others check theirs."""
    following = getattr(super(cls, self), "__post_init__", None)
    if following is not None:
        following()


@dataclass(kw_only=True)
class VertexProject:
    """Where a submission runs on Vertex AI and as whom: the pipeline's and the smoke job's."""

    project: str = field(metadata={"help": "Google Cloud project id."})
    region: str = field(default="us-central1", metadata={"help": "Vertex AI region (one with the TPU type)."})
    service_account: str = field(
        default="", metadata={"help": "Service account the run or job acts as (docs/vertex-ai.md's, least privilege)."}
    )

    def __post_init__(self) -> None:
        check_region(self.region)
        chain_post_init(VertexProject, self)


@dataclass(kw_only=True)
class JobServiceArguments:
    """How a command reaches Vertex AI's job service and how often it looks at a job."""

    poll_seconds: float = field(default=30.0, metadata={"help": "Seconds between looks at the job's state."})
    api_endpoint: str = field(
        default="", metadata={"help": "Vertex AI's endpoint; default: the region's, REGION-aiplatform.googleapis.com."}
    )

    def __post_init__(self) -> None:
        if not 0 < self.poll_seconds <= MAX_POLL_SECONDS:
            raise InvalidParameter(
                "poll_seconds",
                self.poll_seconds,
                f"must be above 0 and at most {MAX_POLL_SECONDS:g} (30 is the default)",
            )
        check_endpoint("api_endpoint", self.api_endpoint)
        chain_post_init(JobServiceArguments, self)


MAX_POLL_SECONDS = 3600.0


def job_client(region: str, endpoint: str = "") -> Any:
    """Vertex AI's job service over REST. An ``http://`` endpoint is a local stand-in (the tests'), reached
    without credentials, as Google's clients treat their emulators."""
    from google.cloud import aiplatform_v1 as vertex

    return service_client(vertex.JobServiceClient, region, endpoint)


def pipeline_client(region: str, endpoint: str = "", credentials: Any = None) -> Any:
    """Vertex AI's pipeline service over REST, reached as ``job_client`` reaches the job service (as ``credentials``
    when given: submit's, which creates the run with them)."""
    from google.cloud import aiplatform_v1 as vertex

    return service_client(vertex.PipelineServiceClient, region, endpoint, credentials)


def service_client(client_class: type, region: str, endpoint: str, credentials: Any = None) -> Any:
    """A client of one of Vertex AI's services over REST at ``endpoint`` (default: the region's) as ``credentials``
    (default: Application Default Credentials); an ``http://`` endpoint without credentials."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    check_region(region)  # in the default host name, and in every resource name sent to an explicit one
    endpoint = check_endpoint("api_endpoint", endpoint) or f"{region}-aiplatform.googleapis.com"
    credentials = AnonymousCredentials() if endpoint.startswith("http://") else credentials
    return client_class(transport="rest", client_options=ClientOptions(api_endpoint=endpoint), credentials=credentials)


CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def api_session(endpoint: str, credentials: Any = None, parameter: str = "endpoint") -> Any:
    """An HTTP session to a Google API at ``endpoint`` as ``credentials`` (default: Application Default Credentials);
    to an ``http://`` endpoint (a local stand-in), without, as ``service_client`` reaches one. An endpoint of another
    form than a host's (``check_endpoint``) is refused naming ``parameter``."""
    import requests

    check_endpoint(parameter, endpoint)
    if endpoint.startswith("http://"):
        return requests.Session()
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    if credentials is None:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    return AuthorizedSession(credentials)


def cancel_command(name: str) -> str:
    """The gcloud command that cancels the job ``name`` (projects/P/locations/R/customJobs/ID)."""
    _, project, _, region, _, job_id = name.split("/")
    return shlex.join(["gcloud", "ai", "custom-jobs", "cancel", job_id, f"--region={region}", f"--project={project}"])


class LeftWaiting(ServiceFailed):
    """A second Ctrl-C: the command leaves without waiting for its job's cancel to take."""


class JobWait:
    """Follows a custom job to its end; see the module's docstring. Entered before the job is created, so that a
    signal while it is being created cancels it too. ``max_queued_seconds``: how long the job may stay queued or
    pending (None: no limit); ``why_queued``: what to check when it does, for the error."""

    def __init__(
        self,
        client: Any,
        poll_seconds: float = 30.0,
        max_queued_seconds: float | None = None,
        why_queued: str = "",
    ):
        self.client, self.poll_seconds = client, poll_seconds
        self.max_queued_seconds, self.why_queued = max_queued_seconds, why_queued
        self.name = ""  # the job followed, once known
        self.stop_signal: int | None = None  # the signal that asked for the job's cancel
        self._woken = threading.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> JobWait:
        """SIGTERM and SIGINT ask for the job's cancel; a second SIGINT leaves at once. Main thread only."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
            for number in self._previous:
                signal.signal(number, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _on_signal(self, number: int, frame: Any) -> None:
        if self.stop_signal is not None and number == signal.SIGINT:
            where = (
                f"the cancel of {self.name} was requested; see where it stands in the console, or cancel it again "
                f"with: {cancel_command(self.name)}"
                if self.name
                else "the job may have been created meanwhile: see gcloud ai custom-jobs list"
            )
            raise LeftWaiting(f"left without waiting: {where}")
        if self.stop_signal is None:
            self.stop_signal = number
            if number == signal.SIGINT:
                log.warning("Ctrl-C: cancelling the job; Ctrl-C again to leave without waiting")
        self._woken.set()

    def follow(self, name: str) -> Any:
        """Polls the job ``name`` until it ends, logging each change of state, and returns it; cancels it past the
        queue limit (then raises ``ServiceFailed``) or when stopped (then raises ``ServiceFailed`` once it has
        ended, or ``LeftWaiting`` on a second Ctrl-C)."""
        self.name = name
        started, last, cancelled_at = time.monotonic(), None, None
        while True:
            if cancelled_at is None and self.stop_signal is not None:  # before anything else can fail
                cancelled_at = self._cancel(f"{signal.Signals(self.stop_signal).name} received")
            try:
                job = call(self.client.get_custom_job, name=name)
            except Exception as error:  # out of reach past the retries: the job goes on, bounded by its own limit
                raise ServiceFailed(
                    f"lost contact with Vertex AI's job service ({type(error).__name__}: {error}); {name} goes on "
                    f"within its own time limit; to stop it: {cancel_command(name)}"
                ) from None
            waited = time.monotonic() - started
            if job.state.name != last:
                log.info("%s after %.0f s", job.state.name, waited)
                last = job.state.name
            if job.state.name in TERMINAL_STATES:
                if job.error.message:
                    log.warning("the job's error: %s", job.error.message)
                break
            if cancelled_at is None and self._queued_too_long(job.state.name, waited):
                cancelled_at = self._cancel(f"it stayed queued or pending for {waited:.0f} s")
            if cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_WAIT_SECONDS:
                log.warning("the cancel has not taken after %.0f s; leaving %s", CANCEL_WAIT_SECONDS, name)
                break
            self._woken.wait(self.poll_seconds)
            self._woken.clear()
        if self.stop_signal is not None:
            raise ServiceFailed(f"stopped by {signal.Signals(self.stop_signal).name}: {name} is {job.state.name}")
        if cancelled_at is not None:
            raise ServiceFailed(
                f"{name} stayed queued or pending for more than {self.max_queued_seconds / 60:g} min and was "
                f"cancelled ({job.state.name}); {self.why_queued}"
            )
        return job

    def _queued_too_long(self, state: str, waited: float) -> bool:
        return self.max_queued_seconds is not None and state in WAITING_STATES and waited > self.max_queued_seconds

    def _cancel(self, why: str) -> float:
        log.warning("%s: cancelling %s", why, self.name)
        try:
            call(self.client.cancel_custom_job, name=self.name)
        except Exception as error:  # the job goes on: say how to stop it, whatever the client raised
            message = f"could not cancel {self.name} ({error}); cancel it with: {cancel_command(self.name)}"
            raise ServiceFailed(message) from None
        return time.monotonic()
