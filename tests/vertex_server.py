"""A local stand-in for Vertex AI's job service over REST, enough for ``aiplatform_v1.JobServiceClient``:
create a custom job, get it and cancel it. A created job runs its first worker pool's container command on this machine,
as the container would run it (the project's Python, the job's environment on top of this process's): the job
is ``JOB_STATE_RUNNING`` while it runs, then ``JOB_STATE_SUCCEEDED`` or ``JOB_STATE_FAILED`` by its exit status.
What the job can do here is what this machine has: no TPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class VertexStandIn:
    """``start_jobs=False``: jobs stay ``JOB_STATE_PENDING`` (no TPU capacity, no quota); ``cancels_take=False``:
    a cancelled job stays ``JOB_STATE_CANCELLING``; ``refuse_creates``: a create is refused as Vertex AI refuses an
    account without ``aiplatform.customJobs.create``; ``filters=False``: a list with a filter is refused as invalid.
    ``cancel_requests`` lists the jobs asked to cancel."""

    def __init__(
        self, start_jobs: bool = True, cancels_take: bool = True, refuse_creates: bool = False, filters: bool = True
    ) -> None:
        self.start_jobs, self.cancels_take, self.refuse_creates = start_jobs, cancels_take, refuse_creates
        self.filters = filters
        self.jobs: dict[str, dict] = {}
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self.cancel_requests: list[str] = []
        self.reads: Counter[str] = Counter()  # GETs of each job through the API (a launcher's, not the test's)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> VertexStandIn:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        for process in self.processes.values():
            process.kill()
        self._server.shutdown()
        self._server.server_close()

    def create(self, parent: str, job: dict) -> dict:
        name = f"{parent}/customJobs/{len(self.jobs) + 1}"
        container = job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]
        command = [*container.get("command", []), *container.get("args", [])]
        if command[:1] == ["python"]:
            command[0] = sys.executable  # the image's Python is this project's here
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # and its python3 (KFP's executor line)
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PATH": path}
        env.update({variable["name"]: variable["value"] for variable in container.get("env", [])})
        self.jobs[name] = {**job, "name": name, "state": "JOB_STATE_PENDING", "createTime": now()}
        if self.start_jobs:
            self.jobs[name].update(state="JOB_STATE_RUNNING", startTime=now())
            self.processes[name] = subprocess.Popen(
                command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        return self.jobs[name]

    def cancel(self, name: str) -> None:
        """As Vertex AI does: the job is cancelling, then cancelled once its VMs are gone."""
        self.cancel_requests.append(name)
        job = self.jobs[name]
        if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            return
        job["state"] = "JOB_STATE_CANCELLING"
        if name in self.processes:
            self.processes[name].kill()
            self.processes[name].wait()
        if self.cancels_take:
            job.update(state="JOB_STATE_CANCELLED", endTime=now())

    def list(self, parent: str, query: str) -> list[dict]:
        """The jobs under ``parent`` that match a filter of the API's form, ``A="x" AND labels.b="y"``."""
        wanted = re.findall(r'(labels\.[\w-]+|display_name)\s*=\s*"([^"]*)"', query)
        if query and len(wanted) != query.count("="):
            raise ValueError(f"the stand-in does not understand the filter {query!r}")

        def value(job: dict, key: str) -> str:
            if key.startswith("labels."):
                return job.get("labels", {}).get(key.removeprefix("labels."))
            return job.get("displayName")

        jobs = [self.get(name) for name in self.jobs if name.startswith(parent + "/")]
        return [job for job in jobs if all(value(job, key) == expected for key, expected in wanted)]

    def get(self, name: str) -> dict:
        job, process = self.jobs[name], self.processes.get(name)
        if job["state"] == "JOB_STATE_RUNNING" and process.poll() is not None:
            self.logs[name] = process.stdout.read()
            job["endTime"] = now()
            if process.returncode == 0:
                job["state"] = "JOB_STATE_SUCCEEDED"
            else:
                job["state"] = "JOB_STATE_FAILED"
                job["error"] = {
                    "code": 3,  # what Vertex AI reports for an exit with an error (its logs show it)
                    "message": f"The replica workerpool0-0 exited with a non-zero status of {process.returncode}.",
                }
        return job

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

            def do_POST(self) -> None:
                path = urlparse(self.path).path
                cancel = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+):cancel", path)
                if cancel and cancel.group(1) in stand_in.jobs:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    stand_in.cancel(cancel.group(1))
                    return self._reply(200, {})
                match = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/customJobs", path)
                if not match:
                    return self._reply(404, {"error": {"code": 404, "message": self.path}})
                job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                scheduling = job.get("jobSpec", {}).get("scheduling", {})
                if "maxWaitDuration" in scheduling and scheduling.get("strategy") not in (6, "FLEX_START"):
                    message = "max_wait_duration is only supported with the FLEX_START scheduling strategy"
                    return self._reply(400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
                if stand_in.refuse_creates:
                    message = f"Permission 'aiplatform.customJobs.create' denied on resource '{match.group(1)}'"
                    return self._reply(403, {"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}})
                self._reply(200, stand_in.create(match.group(1), job))

            def do_GET(self) -> None:
                url = urlparse(self.path)
                name = url.path.removeprefix("/v1/")
                if name.endswith("/customJobs"):
                    (query,) = parse_qs(url.query).get("filter", [""])
                    if query and not stand_in.filters:
                        message = f"Unsupported filter: {query}"
                        return self._reply(
                            400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
                        )
                    return self._reply(200, {"customJobs": stand_in.list(name.removesuffix("/customJobs"), query)})
                if name not in stand_in.jobs:
                    return self._reply(404, {"error": {"code": 404, "message": f"{name} not found"}})
                stand_in.reads[name] += 1
                self._reply(200, stand_in.get(name))

        return Handler
