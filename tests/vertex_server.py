"""A local stand-in for Vertex AI's job and pipeline services over REST, and for Cloud Logging's ``entries.list``
of a custom job's lines: enough for ``aiplatform_v1.JobServiceClient``, ``PipelineServiceClient`` and
``aiplatform.PipelineJob.submit``.

Custom jobs: create, get, list (by label and display name) and cancel. A created job runs its first worker pool's
container command on this machine, as the container would run it (the project's Python, the job's environment on top
of this process's, with what Vertex AI adds: ``CLOUD_ML_JOB_ID``, ``CLUSTER_SPEC``, the ``AIP_*`` folders): the job
is ``JOB_STATE_RUNNING`` while it runs, then ``JOB_STATE_SUCCEEDED`` or ``JOB_STATE_FAILED`` by its exit status,
after the restarts Vertex AI documents (a worker that exits non-zero starts again, up to 5 times, then the whole job,
up to 3 times). What the job can do here is what this machine has: no TPU. Each line the
job's process prints is a log entry at once (``resource.type="ml_job"``, its numeric id as ``job_id``).

Pipeline jobs: create, get, list (by the pipeline's name) and cancel. No orchestrator runs the pipeline: a created
job is ``PIPELINE_STATE_RUNNING`` (or queued, as the test has it) with a ``PENDING`` task for each task of its root
DAG, and the test reports what the tasks do (``set_task``) and how the run ends (``end_pipeline_job``), as Vertex AI's
orchestrator would. Each run has its context in the metadata store (``jobDetail.pipelineRunContext``), which an
experiment (a context of its own, created and read through Vertex ML Metadata's contexts) takes as a child: what
``submit(experiment=...)`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from http_stand_in import serving_thread

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PIPELINE_ENDED = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
TASK_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "SKIPPED", "NOT_TRIGGERED")
PIPELINE_JOB_ID = re.compile(r"[a-z][a-z0-9-]{0,127}")  # what Vertex AI takes as a pipelineJobId
# the one query of Cloud Logging the stand-in answers: a custom job's lines (gcloud ai custom-jobs stream-logs's)
ML_JOB_FILTER = re.compile(r'resource\.type="ml_job" AND resource\.labels\.job_id="(\d+)"')
LOG_ORDERS = ("timestamp asc", "timestamp desc")  # the only orders entries.list takes
MAX_PAGE_SIZE = 1000  # entries.list refuses a larger pageSize (its proto's documentation; newer docs drop the cap)
DEFAULT_PAGE_SIZE = 50
# "Understand the custom training service" (Vertex AI): a worker that exits with an error is restarted up to 5 times,
# then the whole job is retried up to 3 times, unless Vertex AI counts the error as permanent
WORKER_RESTARTS, JOB_RETRIES = 5, 3
TASK = {"type": "workerpool0", "index": 0}  # CLUSTER_SPEC's task of a job's one worker


class Refused(Exception):
    """A request Vertex AI or Cloud Logging would refuse: its HTTP status and google.rpc status name."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status = code, status


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def kill_worker(process: subprocess.Popen) -> None:
    """Ends a job's worker and every process it started, as a VM that goes away does: a child left alive (a slice
    launcher's worker server) would hold the worker's output open, and its supervisor would read on."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has ended already
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class VertexStandIn:
    """``start_jobs=False``: jobs stay ``JOB_STATE_PENDING`` (no TPU capacity, no quota); ``cancels_take=False``:
    a cancelled job (custom or pipeline) stays cancelling; ``refuse_creates``: a create is refused as Vertex AI refuses
    an account without ``aiplatform.customJobs.create``; ``refuse_links``: a run added to an experiment is refused as
    for an account without ``aiplatform.contexts.addContextChildren``; ``filters=False``: a list with a filter is
    refused as invalid; ``pipeline_state``: the state a created pipeline job is in (PIPELINE_STATE_QUEUED: created, not
    begun). ``cancel_requests`` lists the jobs (custom and pipeline) asked to cancel; ``starts`` counts
    each custom job's worker starts (``worker_restarts`` and ``job_retries``: Vertex AI's documented restarts, the
    defaults)."""

    def __init__(
        self,
        start_jobs: bool = True,
        cancels_take: bool = True,
        refuse_creates: bool = False,
        refuse_links: bool = False,
        filters: bool = True,
        worker_restarts: int = WORKER_RESTARTS,
        job_retries: int = JOB_RETRIES,
        pipeline_state: str = "PIPELINE_STATE_RUNNING",
    ) -> None:
        self.start_jobs, self.cancels_take, self.refuse_creates = start_jobs, cancels_take, refuse_creates
        self.pipeline_state = pipeline_state
        self.filters, self.refuse_links = filters, refuse_links
        self.worker_restarts, self.job_retries = worker_restarts, job_retries
        self.jobs: dict[str, dict] = {}
        self.processes: dict[str, subprocess.Popen] = {}  # each job's latest start of its worker
        self.starts: Counter[str] = Counter()  # how many times each job's worker started: what a TPU job pays for
        self.logs: dict[str, str] = {}  # each ended job's whole output, every start's
        self.lines: dict[str, list[tuple[str, str]]] = {}  # each job's output so far: (timestamp, line)
        self._supervisors: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed = False  # once the stand-in has exited: no job starts
        self.pipeline_jobs: dict[str, dict] = {}
        self.contexts: dict[str, dict] = {}  # Vertex ML Metadata's contexts: experiments and pipeline runs
        self._read_cancelling: set[str] = set()  # pipeline jobs read while cancelling
        self.cancel_requests: list[str] = []
        self.reads: Counter[str] = Counter()  # GETs of each job through the API (a command's, not the test's)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = serving_thread(self._server)

    def __enter__(self) -> VertexStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()  # no new request; one being handled creates no running job once closed
        # its jobs end with it: a worker killed here would otherwise be restarted (a non-zero exit), up to 24 times
        with self._lock:
            self._closed = True
            for job in self.jobs.values():
                if job["state"] == "JOB_STATE_RUNNING":  # a supervisor's: it starts no worker once it is not
                    job.update(state="JOB_STATE_CANCELLED", endTime=now())
            processes, supervisors = list(self.processes.values()), list(self._supervisors.values())
        for process in processes:
            kill_worker(process)
        for supervisor in supervisors:
            supervisor.join(timeout=60)
        self._server.server_close()
        left = [supervisor.name for supervisor in supervisors if supervisor.is_alive()]
        assert not left, f"the stand-in's supervisors {left} still run after their workers were killed"

    def create(self, parent: str, job: dict) -> dict:
        with self._lock:  # a name of its own, and no start once the stand-in has exited
            return self._create(parent, job)

    def _create(self, parent: str, job: dict) -> dict:
        name = f"{parent}/customJobs/{len(self.jobs) + 1}"
        container = job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]
        command = [*container.get("command", []), *container.get("args", [])]
        if command[:1] == ["python"]:
            command[0] = sys.executable  # the image's Python is this project's here
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # and its python3 (KFP's executor line)
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PATH": path}
        # what Vertex AI sets in a custom job's containers: the job's id, and the cluster of its one worker
        cluster = {"cluster": {"workerpool0": ["workerpool0-0:2222"]}, "environment": "cloud"}
        env.update(CLOUD_ML_JOB_ID=name.rsplit("/", 1)[1], CLUSTER_SPEC=json.dumps({**cluster, "task": TASK}))
        env.update({variable["name"]: variable["value"] for variable in container.get("env", [])})
        if base := job["jobSpec"].get("baseOutputDirectory", {}).get("outputUriPrefix"):
            # Vertex AI's folders under a job's output folder, given to its containers
            env.update(AIP_MODEL_DIR=f"{base}/model/", AIP_CHECKPOINT_DIR=f"{base}/checkpoints/")
            env.update(AIP_TENSORBOARD_LOG_DIR=f"{base}/logs/")
        self.jobs[name] = {**job, "name": name, "state": "JOB_STATE_PENDING", "createTime": now()}
        self.starts[name] = 0
        if self.start_jobs and not self._closed:
            self.jobs[name].update(state="JOB_STATE_RUNNING", startTime=now())
            self.lines[name] = []
            # Scheduling.disable_retries: "If true, overrides restart_job_on_worker_restart to false" (the API's
            # reference): taken here as no restart of any kind (the smoke job's setting)
            starts = 1 if job["jobSpec"].get("scheduling", {}).get("disableRetries") else None
            self._supervisors[name] = threading.Thread(target=self._run, args=(name, command, env, starts), daemon=True)
            self._supervisors[name].start()
        return self.jobs[name]

    def _run(self, name: str, command: list[str], env: dict[str, str], starts: int | None = None) -> None:
        """Runs the job's worker as Vertex AI does: a worker that exits non-zero is restarted in the same VM, up to
        ``worker_restarts`` times; then the whole job is retried, up to ``job_retries`` times; then it fails. No exit
        status is taken as permanent (which ones Vertex AI judges so is not documented): each costs every start.
        ``starts``: at most this many (a job that disables retries: 1)."""
        try:
            for _ in range(starts or (self.job_retries + 1) * (self.worker_restarts + 1)):
                with self._lock:
                    if self.jobs[name]["state"] != "JOB_STATE_RUNNING":
                        return  # cancelled
                    self.starts[name] += 1
                    process = subprocess.Popen(
                        command,
                        cwd=PROJECT_ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        start_new_session=True,  # its own process group: kill_worker ends what it started too
                    )
                    self.processes[name] = process
                for line in process.stdout:  # each line as it is printed, as Vertex AI's logging agent sends it
                    self.lines[name].append((now(), line))
                if process.wait() == 0:
                    break
        finally:
            self.logs[name] = "".join(line for _, line in self.lines[name])
        with self._lock:
            job = self.jobs[name]
            if job["state"] != "JOB_STATE_RUNNING":
                return
            job["endTime"] = now()
            if process.returncode == 0:
                job["state"] = "JOB_STATE_SUCCEEDED"
            else:
                job["state"] = "JOB_STATE_FAILED"
                job["error"] = {
                    "code": 3,  # what Vertex AI reports for an exit with an error (its logs show it)
                    "message": f"The replica workerpool0-0 exited with a non-zero status of {process.returncode}.",
                }

    def cancel(self, name: str) -> None:
        """As Vertex AI does: the job is cancelling, then cancelled once its VMs are gone."""
        self.cancel_requests.append(name)
        with self._lock:
            job = self.jobs[name]
            if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
                return
            job["state"] = "JOB_STATE_CANCELLING"
            process = self.processes.get(name)
        if process is not None:
            kill_worker(process)
        if self.cancels_take:
            job.update(state="JOB_STATE_CANCELLED", endTime=now())

    def wait(self, name: str, seconds: float = 300) -> dict:
        """The job once it has ended (its worker's last start included); fails a test past ``seconds``."""
        supervisor = self._supervisors.get(name)
        if supervisor is not None:
            supervisor.join(timeout=seconds)
            assert not supervisor.is_alive(), f"{name} still running after {seconds} s"
        return self.jobs[name]

    def list(self, parent: str, query: str) -> list[dict]:
        """The jobs under ``parent`` that match a filter of the API's form, ``A="x" AND labels.b="y"``."""
        wanted = re.findall(r'(labels\.[\w-]+|display_name)\s*=\s*"([^"]*)"', query)
        if query and len(wanted) != query.count("="):
            raise Refused(400, "INVALID_ARGUMENT", f"the stand-in does not understand the filter {query!r}")

        def value(job: dict, key: str) -> str:
            if key.startswith("labels."):
                return job.get("labels", {}).get(key.removeprefix("labels."))
            return job.get("displayName")

        jobs = [self.get(name) for name in self.jobs if name.startswith(parent + "/")]
        return [job for job in jobs if all(value(job, key) == expected for key, expected in wanted)]

    def get(self, name: str) -> dict:
        return self.jobs[name]

    def create_pipeline_job(self, parent: str, job_id: str, job: dict) -> dict:
        """What Vertex AI makes of a submitted pipeline job: running, a pending task for each of its root DAG's tasks
        under the root task (the pipeline's own)."""
        if not PIPELINE_JOB_ID.fullmatch(job_id):
            raise Refused(400, "INVALID_ARGUMENT", f"pipelineJobId {job_id!r}: [a-z][a-z0-9-], at most 128 characters")
        name = f"{parent}/pipelineJobs/{job_id}"
        if name in self.pipeline_jobs:
            raise Refused(409, "ALREADY_EXISTS", f"{name} already exists")
        spec, created = job["pipelineSpec"], now()
        root = {"taskId": "1", "taskName": spec["pipelineInfo"]["name"], "state": "RUNNING", "createTime": created}
        tasks = [
            {"taskId": str(number), "parentTaskId": "1", "taskName": task, "state": "PENDING", "createTime": created}
            for number, task in enumerate(spec["root"]["dag"]["tasks"], start=2)
        ]
        # the run's context in the project's metadata store, where an experiment finds its runs
        run_context = self.create_context(
            f"{parent}/metadataStores/default", job_id, {"schemaTitle": "system.PipelineRun"}
        )
        self.pipeline_jobs[name] = {
            **job,
            "name": name,
            "state": self.pipeline_state,
            "createTime": created,
            **({"startTime": created} if self.pipeline_state == "PIPELINE_STATE_RUNNING" else {}),
            "jobDetail": {"taskDetails": [root, *tasks], "pipelineRunContext": run_context},
        }
        return self.pipeline_jobs[name]

    def list_pipeline_jobs(self, parent: str, query: str) -> list[dict]:
        """The pipeline jobs under ``parent``, oldest first, that match a filter of the API's form on the pipeline's
        name (``pipeline_name="x"``)."""
        wanted = re.findall(r'pipeline_name\s*=\s*"([^"]*)"', query)
        if query and len(wanted) != query.count("="):
            raise Refused(400, "INVALID_ARGUMENT", f"the stand-in does not understand the filter {query!r}")
        jobs = [job for name, job in self.pipeline_jobs.items() if name.startswith(parent + "/")]
        return [job for job in jobs if all(job["pipelineSpec"]["pipelineInfo"]["name"] == name for name in wanted)]

    def create_context(self, store: str, context_id: str, context: dict) -> dict:
        """A metadata context (an experiment, a pipeline run) in the metadata store ``store``."""
        name = f"{store}/contexts/{context_id}"
        if name in self.contexts:
            raise Refused(409, "ALREADY_EXISTS", f"{name} already exists")
        self.contexts[name] = {**context, "name": name, "createTime": now(), "childContexts": []}
        return self.contexts[name]

    def set_task(self, name: str, task: str, state: str) -> None:
        """Reports the task ``task`` of the pipeline job ``name`` in ``state`` (RUNNING, SUCCEEDED, FAILED, ...)."""
        (detail,) = [detail for detail in self._tasks(name) if detail["taskName"] == task]
        detail["state"] = state
        detail.setdefault("startTime", now())
        if state in TASK_ENDED:
            detail["endTime"] = now()

    def end_pipeline_job(self, name: str, state: str, error: str = "") -> None:
        """Ends the pipeline job ``name`` in ``state`` (PIPELINE_STATE_SUCCEEDED or _FAILED) with ``error``'s message,
        its root task alike."""
        job = self.pipeline_jobs[name]
        job.update(state=state, endTime=now())
        if error:
            job["error"] = {"code": 9, "message": error}  # FAILED_PRECONDITION, as Vertex AI reports a failed DAG
        self.set_task(name, self._tasks(name)[0]["taskName"], state.removeprefix("PIPELINE_STATE_"))

    def cancel_pipeline_job(self, name: str) -> None:
        """Asks for the cancel: the job is cancelling (then cancelled: ``get_pipeline_job``). The cancel of an ended
        job is refused, as Vertex AI refuses it for an ended training pipeline."""
        self.cancel_requests.append(name)
        job = self.pipeline_jobs[name]
        if job["state"] in PIPELINE_ENDED:
            raise Refused(
                400, "FAILED_PRECONDITION", f"The PipelineJob {name} is in state {job['state']} and cannot be canceled."
            )
        job["state"] = "PIPELINE_STATE_CANCELLING"

    def get_pipeline_job(self, name: str) -> dict:
        """The pipeline job; one cancelling is cancelled from its second read on (its tasks stopped meanwhile)."""
        job = self.pipeline_jobs[name]
        if job["state"] == "PIPELINE_STATE_CANCELLING" and self.cancels_take:
            if name in self._read_cancelling:
                for detail in self._tasks(name):
                    if detail["state"] not in TASK_ENDED:
                        self.set_task(name, detail["taskName"], "CANCELLED")
                job.update(state="PIPELINE_STATE_CANCELLED", endTime=now())
            self._read_cancelling.add(name)
        return job

    def _tasks(self, name: str) -> list[dict]:
        return self.pipeline_jobs[name]["jobDetail"]["taskDetails"]

    def log_entries(self, request: dict) -> dict:
        """Cloud Logging's ``entries.list`` of one custom job's lines, a page at a time."""
        names = request.get("resourceNames", [])
        if len(names) != 1 or not re.fullmatch(r"projects/[^/]+", names[0]):
            raise Refused(400, "INVALID_ARGUMENT", f"the stand-in takes one project as resourceNames, not {names}")
        query = ML_JOB_FILTER.fullmatch(request.get("filter", ""))
        if not query:
            raise Refused(
                400, "INVALID_ARGUMENT", f"the stand-in does not understand the filter {request.get('filter')!r}"
            )
        order = request.get("orderBy", LOG_ORDERS[0])
        size = int(request.get("pageSize", DEFAULT_PAGE_SIZE))
        if order not in LOG_ORDERS or not 0 < size <= MAX_PAGE_SIZE:
            raise Refused(400, "INVALID_ARGUMENT", f"orderBy {order!r} or pageSize {size} is not taken")
        project, job_id = names[0].removeprefix("projects/"), query.group(1)
        jobs = [
            name for name in self.jobs if re.fullmatch(rf"projects/{project}/locations/[^/]+/customJobs/{job_id}", name)
        ]
        resource = {"type": "ml_job", "labels": {"job_id": job_id, "project_id": project, "task_name": "workerpool0-0"}}
        entries = [
            {
                "logName": f"projects/{project}/logs/workerpool0-0",
                "resource": resource,
                "textPayload": line.rstrip("\n"),
                "timestamp": timestamp,
                "insertId": f"{job_id}-{number}",
            }
            for name in jobs
            for number, (timestamp, line) in enumerate(list(self.lines.get(name, [])))
        ]
        if order == "timestamp desc":
            entries.reverse()
        start = int(request.get("pageToken") or 0)
        page = {"entries": entries[start : start + size]}
        if start + size < len(entries):
            page["nextPageToken"] = str(start + size)
        return page

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _refuse(self, refused: Refused) -> None:
                error = {"code": refused.code, "message": str(refused), "status": refused.status}
                self._reply(refused.code, {"error": error})

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

            def do_POST(self) -> None:
                try:
                    self._post()
                except Refused as refused:
                    self._refuse(refused)

            def do_GET(self) -> None:
                try:
                    self._get()
                except Refused as refused:
                    self._refuse(refused)

            def _post(self) -> None:
                url = urlparse(self.path)
                path = url.path
                if path == "/v2/entries:list":
                    return self._reply(200, stand_in.log_entries(self._body()))
                cancel = re.fullmatch(
                    r"/v1/(projects/[^/]+/locations/[^/]+/(customJobs|pipelineJobs)/[^/:]+):cancel", path
                )
                if cancel:
                    self._body()  # {}, read off the connection
                    name = cancel.group(1)
                    if name in stand_in.jobs:
                        stand_in.cancel(name)
                    elif name in stand_in.pipeline_jobs:
                        stand_in.cancel_pipeline_job(name)
                    else:
                        raise Refused(404, "NOT_FOUND", f"{name} not found")
                    return self._reply(200, {})
                store = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/metadataStores/default)/contexts", path)
                if store:
                    (context_id,) = parse_qs(url.query).get("contextId", [""])
                    return self._reply(200, stand_in.create_context(store.group(1), context_id, self._body()))
                children = re.fullmatch(r"/v1/(.+/metadataStores/default/contexts/[^/:]+):addContextChildren", path)
                if children:
                    if children.group(1) not in stand_in.contexts:
                        raise Refused(404, "NOT_FOUND", f"{children.group(1)} not found")
                    body = self._body()
                    if stand_in.refuse_links:
                        message = f"Permission 'aiplatform.contexts.addContextChildren' denied on '{children.group(1)}'"
                        raise Refused(403, "PERMISSION_DENIED", message)
                    for child in body.get("childContexts", []):
                        if child not in stand_in.contexts:
                            raise Refused(400, "INVALID_ARGUMENT", f"child context {child} does not exist")
                        stand_in.contexts[children.group(1)]["childContexts"].append(child)
                    return self._reply(200, {})
                pipeline = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/pipelineJobs", path)
                if pipeline:
                    (job_id,) = parse_qs(url.query).get("pipelineJobId", [""])
                    return self._reply(200, stand_in.create_pipeline_job(pipeline.group(1), job_id, self._body()))
                match = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/customJobs", path)
                if not match:
                    raise Refused(404, "NOT_FOUND", self.path)
                job = self._body()
                scheduling = job.get("jobSpec", {}).get("scheduling", {})
                if "maxWaitDuration" in scheduling and scheduling.get("strategy") not in (6, "FLEX_START"):
                    message = "max_wait_duration is only supported with the FLEX_START scheduling strategy"
                    raise Refused(400, "INVALID_ARGUMENT", message)
                if stand_in.refuse_creates:
                    message = f"Permission 'aiplatform.customJobs.create' denied on resource '{match.group(1)}'"
                    raise Refused(403, "PERMISSION_DENIED", message)
                self._reply(200, stand_in.create(match.group(1), job))

            def _get(self) -> None:
                url = urlparse(self.path)
                name = url.path.removeprefix("/v1/")
                if name.endswith("/customJobs"):
                    (query,) = parse_qs(url.query).get("filter", [""])
                    if query and not stand_in.filters:
                        raise Refused(400, "INVALID_ARGUMENT", f"Unsupported filter: {query}")
                    return self._reply(200, {"customJobs": stand_in.list(name.removesuffix("/customJobs"), query)})
                if name.endswith("/pipelineJobs"):
                    (query,) = parse_qs(url.query).get("filter", [""])
                    jobs = stand_in.list_pipeline_jobs(name.removesuffix("/pipelineJobs"), query)
                    return self._reply(200, {"pipelineJobs": jobs})
                if name in stand_in.pipeline_jobs:
                    stand_in.reads[name] += 1
                    return self._reply(200, stand_in.get_pipeline_job(name))
                if re.fullmatch(r"projects/[^/]+/locations/[^/]+/metadataStores/default", name):
                    return self._reply(200, {"name": name})  # every project's region has its default store
                if name in stand_in.contexts:
                    return self._reply(200, stand_in.contexts[name])
                if "/metadataStores/" in name:
                    raise Refused(404, "NOT_FOUND", f"{name} not found")
                if name not in stand_in.jobs:
                    raise Refused(404, "NOT_FOUND", f"{name} not found")
                stand_in.reads[name] += 1
                self._reply(200, stand_in.get(name))

        return Handler
