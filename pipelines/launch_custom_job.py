"""The pipeline's TPU task on Vertex AI: creates the train step's custom job and waits for it, in place of Google
Cloud Pipeline Components' launcher, whose arguments it takes (``--type CustomJob --project --location --payload
--gcp_resources``, the payload with the pipeline's values filled in by Vertex AI).

GCPC's launcher, when the task's ``gcp_resources`` output already records a job (a launcher restarted after its own
preemption), polls that job instead of creating one; a retried task that found a failed job there would fail again
in seconds, without a new TPU job or a resume. This launcher looks at the recorded job first: one still queued,
running or done is followed, one that failed, was cancelled or expired is replaced by a new job (which resumes
from the run's checkpoints). A SIGTERM (the task cancelled) cancels the job it follows.

    python -m pipelines.launch_custom_job --type CustomJob --project my-project --location us-central1 \\
        --payload '{"display_name": "train", "job_spec": {...}}' --gcp_resources /tmp/gcp_resources
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib.errors import InvalidParameter, ServiceFailed
from components.lib.jobs import log, run_job
from pipelines.vertex_jobs import ENDED_WITHOUT_SUCCESS, SUCCEEDED, JobServiceArguments, JobWait, job_client

RESOURCE_TYPE = "CustomJob"


@dataclass(kw_only=True)
class LaunchArguments(JobServiceArguments):
    type: str = field(metadata={"help": "What to launch: CustomJob (the only type)."})
    project: str = field(metadata={"help": "Google Cloud project id."})
    location: str = field(metadata={"help": "Vertex AI region."})
    payload: str = field(metadata={"help": "The custom job as JSON (Vertex AI's REST fields)."})
    gcp_resources: str = field(metadata={"help": "File recording the job (KFP's output parameter gcp_resources)."})

    def __post_init__(self) -> None:
        if self.type != RESOURCE_TYPE:
            raise InvalidParameter("type", self.type, f"must be {RESOURCE_TYPE}")
        try:
            json.loads(self.payload, strict=False)
        except ValueError as error:
            raise InvalidParameter("payload", self.payload[:80], f"is not JSON ({error})") from None

    @property
    def endpoint(self) -> str:
        return self.api_endpoint or f"https://{self.location}-aiplatform.googleapis.com"


def launch(arguments: LaunchArguments) -> dict[str, Any]:
    """Follows the recorded job, or creates one; returns the job's name and state once it succeeded."""
    client = job_client(arguments.location, arguments.api_endpoint.removeprefix("https://"))
    with JobWait(client, arguments.poll_seconds) as waiting:  # a SIGTERM from here on cancels the job
        name = followed_job(client, arguments.gcp_resources)
        if not name:
            created = client.create_custom_job(
                parent=f"projects/{arguments.project}/locations/{arguments.location}",
                custom_job=custom_job(arguments.payload),
            )
            name = created.name
            record_job(arguments.gcp_resources, arguments.endpoint, name)
            log.info("created %s", name)
        job = waiting.follow(name)
    if job.state.name != SUCCEEDED:
        raise ServiceFailed(f"{name} ended {job.state.name}: {job.error.message or 'no error given'}")
    return {"job": name, "state": job.state.name}


def followed_job(client: Any, gcp_resources: str) -> str:
    """The job recorded in ``gcp_resources`` if it is to be followed (queued, running or succeeded); "" when
    there is none, or when it ended without success and a new one is to be created."""
    if not os.path.exists(gcp_resources) or not os.path.getsize(gcp_resources):
        return ""
    with open(gcp_resources) as file:
        (resource,) = json.load(file)["resources"]
    name = resource["resourceUri"].split("/v1/", 1)[1]
    from google.api_core.exceptions import NotFound

    try:
        state = client.get_custom_job(name=name).state.name
    except NotFound:
        log.warning("the job this task recorded, %s, is not found: creating a new one", name)
        return ""
    if state in ENDED_WITHOUT_SUCCESS:
        log.warning("the job this task recorded, %s, ended %s: this retry creates a new one", name, state)
        return ""
    log.info("following the job this task recorded, %s (%s)", name, state)
    return name


def record_job(gcp_resources: str, endpoint: str, name: str) -> None:
    """Writes the job into ``gcp_resources`` as GCPC does: the console links the task to it from there."""
    resources = {"resources": [{"resourceType": RESOURCE_TYPE, "resourceUri": f"{endpoint}/v1/{name}"}]}
    os.makedirs(os.path.dirname(gcp_resources) or ".", exist_ok=True)
    with open(gcp_resources, "w") as file:
        json.dump(resources, file)


def custom_job(payload: str) -> Any:
    """The ``aiplatform_v1.CustomJob`` of the payload."""
    from google.cloud import aiplatform_v1 as vertex

    return vertex.CustomJob.from_json(json.dumps(without_empty(json.loads(payload, strict=False))))


def without_empty(value: Any) -> Any:
    """``value`` without its fields that hold nothing (empty, 0, false), as GCPC's launcher sends a payload: the API
    reads a missing field as its default, and the compiled payload has some it would refuse empty (an unused
    accelerator type, say). Plain values inside lists stay."""
    if isinstance(value, dict):
        cleaned = {key: without_empty(item) for key, item in value.items()}
        return {key: item for key, item in cleaned.items() if item}
    if isinstance(value, list):
        cleaned = [without_empty(item) for item in value]
        return [item for item in cleaned if item or isinstance(item, int | float | str)]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(LaunchArguments, launch, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
