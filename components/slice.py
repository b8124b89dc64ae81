"""Run a command on a TPU slice of several hosts, the way TensorFlow's single controller needs: Vertex AI starts this
container on every host of the slice, and on each this launcher

1. finds the host's index and every host's address (``components/lib/slice_hosts.py``);
2. starts the TensorFlow worker server that owns the host's chips (``python -m components.tpu_worker``);
3. on host 0: waits until every host's server accepts connections (a host that never does fails the job after
   ``--hosts_timeout_minutes``), then runs the command with ``TPU_SLICE_ENDPOINTS`` set to every host's
   ``grpc://`` endpoint, which the train step takes in place of ``--tpu local`` (and keeps itself off libtpu, which
   the server owns), passes it a SIGTERM as on one host, and ends with its exit code;
4. on the other hosts: serves until host 0's program has ended, then ends with its exit code (a host 0 that is
   gone for ``--host_zero_lost_minutes`` fails the host).

    python -m components.slice --tpu_type v5e-16 -- python -m components.train --accelerator tpu ...
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib import verdict
from components.lib.devices import skip_tpu_runtime
from components.lib.errors import InvalidParameter
from components.lib.job_runner import reported_status, run_job
from components.lib.slice_hosts import (
    ENDPOINTS_VARIABLE,
    MESH_CONTROLLER_VARIABLE,
    METADATA_REPORTED,
    SERVER_PORT,
    STATUS_PORT,
    HostReport,
    SliceFailed,
    StatusServer,
    discover,
    host_zero_status,
    metadata_attribute,
    wait_for_servers,
)
from components.lib.tpu_catalogue import SLICE_HOSTS_MINUTES, TPU_TYPES, TpuType, tpu_type

log = logging.getLogger("tpu_mlm.slice")
POLL_SECONDS = 2.0
VERDICT_POLL_SECONDS = 10.0  # how often a host that cannot reach host 0 looks for the job's verdict


@dataclass
class SliceArguments:
    tpu_type: str = field(
        metadata={"help": f"The slice, one of {sorted(name for name, tpu in TPU_TYPES.items() if tpu.hosts > 1)}."}
    )
    server_port: int = field(default=SERVER_PORT, metadata={"help": "Each host's worker server port."})
    status_port: int = field(default=STATUS_PORT, metadata={"help": "Host 0's status port, which the others follow."})
    hosts_timeout_minutes: float = field(
        default=SLICE_HOSTS_MINUTES,
        metadata={
            "help": "How long host 0 waits for every host's server before the job fails (each host pulls the image "
            "and starts on its own)."
        },
    )
    host_zero_lost_minutes: float = field(
        default=5.0, metadata={"help": "How long another host goes on without reaching host 0 before it fails."}
    )
    linger_seconds: float = field(
        default=30.0, metadata={"help": "How long host 0 waits, after its command, for the others to hear it ended."}
    )
    report_dir: str = field(
        default="",
        metadata={"help": "Folder (gs:// on Vertex AI) where each host writes what it found, hosts/host-N.json."},
    )

    def __post_init__(self) -> None:
        if tpu_type(self.tpu_type).hosts < 2:
            raise InvalidParameter("tpu_type", self.tpu_type, "is one host: run the command itself")
        for name in ("hosts_timeout_minutes", "host_zero_lost_minutes"):
            if getattr(self, name) <= 0:
                raise InvalidParameter(name, getattr(self, name), "must be above 0")


def launched(tpu: TpuType, command: list[str], report_dir: str = "") -> list[str]:
    """The container command that runs ``command`` on ``tpu``: under this launcher on a slice of several hosts (the
    command on host 0, a TPU worker server on every host; each host's findings under ``report_dir`` when given),
    as it is on one host."""
    if tpu.hosts == 1:
        return command
    reports = ["--report_dir", report_dir] if report_dir else []
    return ["python", "-m", "components.slice", "--tpu_type", tpu.name, *reports, "--", *command]


def launch(arguments: SliceArguments, command: list[str]) -> int:
    """Runs ``command`` on host 0 of the slice, the worker servers on every host; returns the command's exit code
    (on every host)."""
    runtime_env = dict(os.environ)  # the TPU runtime's settings: for the worker server and host 0's program only
    skip_tpu_runtime()  # this process writes its reports through TensorFlow's storage: it must not take the chips
    report = HostReport(arguments.report_dir)
    # what this VM's metadata says, whether or not the hosts are found from it
    seen = {name: metadata_attribute(name, tries=1) for name in METADATA_REPORTED} if report.report_dir else {}
    try:
        hosts = discover(os.environ, metadata_attribute, tpu_type(arguments.tpu_type).hosts)
    except SliceFailed as error:
        report.update(metadata=seen, failed=str(error))
        raise
    report.found(hosts, metadata=seen)
    log.info("host %d of %s, from %s", hosts.index, list(hosts.addresses), hosts.source)
    port = hosts.server(hosts.index, arguments.server_port)[1]
    worker = ["--task", str(hosts.index), "--port", str(port), "--report_dir", arguments.report_dir]
    # the StreamExecutor runtime's mesh controller, only where the job's environment asks (compile or smoke --tpu_env)
    server_environment = hosts.server_environment(os.environ.get(MESH_CONTROLLER_VARIABLE, "") == "true")
    server = subprocess.Popen(
        [sys.executable, "-m", "components.tpu_worker", *worker], env={**runtime_env, **server_environment}
    )
    report.update(server_port=port, server_environment=server_environment, server_started=time.time())
    try:
        if hosts.index == 0:
            exit_code = _run_host_zero(arguments, hosts, command, report, runtime_env, server)
        else:
            exit_code = _follow_host_zero(arguments, hosts, server)
    except SliceFailed as error:
        report.update(failed=str(error))
        raise
    finally:
        stop_server(server)
    report.update(exit_code=exit_code)
    return exit_code


def stop_server(server: subprocess.Popen) -> None:
    """Ends this host's worker server (again: a no-op). It holds nothing to save, and TensorFlow's preemption
    notifier catches a SIGTERM, so it is killed."""
    server.kill()
    server.wait()


def _run_host_zero(
    arguments: SliceArguments,
    hosts: Any,
    command: list[str],
    report: HostReport,
    runtime_env: dict[str, str],
    server: subprocess.Popen,
) -> int:
    status = StatusServer(arguments.status_port)
    exit_code = 1
    program: subprocess.Popen | None = None

    def on_signal(number: int, frame: Any) -> None:  # the program checkpoints on SIGTERM, as on one host
        if program is None:
            raise SliceFailed(f"{signal.Signals(number).name} while waiting for the hosts' servers")
        program.send_signal(number)

    previous = {number: signal.signal(number, on_signal) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        started = time.monotonic()
        try:
            wait_for_servers(hosts, arguments.server_port, arguments.hosts_timeout_minutes * 60, server)
        except SliceFailed as error:
            report.update(failed=str(error))
            # before the one line: the server shares this stderr, and what Vertex AI shows of a failed job is its end
            stop_server(server)
            # its one line, and the status the other hosts end with: 0 where it is the TPU job's verdict (a slice
            # that did not come up), so that no host's exit has Vertex AI restart the job to wait again
            exit_code = reported_status(error)
            return exit_code
        report.update(every_server_up_after_seconds=round(time.monotonic() - started, 1))
        log.info("every host's worker server is up; running %s", " ".join(command[:4]))
        program = subprocess.Popen(
            command, env={**runtime_env, ENDPOINTS_VARIABLE: hosts.endpoints(arguments.server_port)}
        )
        exit_code = program.wait()
        exit_code = 128 - exit_code if exit_code < 0 else exit_code  # killed by signal N: 128 + N, as a shell says
        log.info("the command ended with exit code %d", exit_code)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        status.end(exit_code, len(hosts.addresses), arguments.linger_seconds)
    return exit_code


def _follow_host_zero(arguments: SliceArguments, hosts: Any, server: subprocess.Popen) -> int:
    """Serves until host 0 says its program ended, and ends with its exit code. A SIGTERM does not end the server
    early: host 0's program may still be saving a checkpoint, which needs every host's chips. A host 0 that does not
    answer may have ended the TPU job with its verdict (it found no hosts, say): this host then ends cleanly too."""
    signal.signal(signal.SIGTERM, lambda number, frame: log.warning("SIGTERM: serving until host 0 ends"))
    # a verdict of this start of the job: host 0 may have written it before this host started, as hosts start within
    # the hosts' timeout of each other (each pulls the image on its own)
    this_start = time.time() - arguments.hosts_timeout_minutes * 60
    last_seen = last_verdict_check = time.monotonic()
    patience = (arguments.hosts_timeout_minutes + arguments.host_zero_lost_minutes) * 60  # before its first answer
    while True:
        if server.poll() is not None:
            raise SliceFailed(f"this host's worker server ended with exit code {server.returncode}")
        status = host_zero_status(hosts, arguments.status_port)
        if status is not None and not status["running"]:
            log.info("host 0's command ended with exit code %d", status["exit_code"])
            return status["exit_code"]
        if status is not None:
            last_seen, patience = time.monotonic(), arguments.host_zero_lost_minutes * 60
        elif time.monotonic() - last_verdict_check > VERDICT_POLL_SECONDS:
            last_verdict_check = time.monotonic()
            ended = verdict.written_since(this_start)
            if ended is not None and ended.status:
                log.info("host 0 ended the TPU job with its verdict (%s): this host ends too", ended.line)
                return 0
        elif time.monotonic() - last_seen > patience:
            raise SliceFailed(f"host 0 ({hosts.addresses[0]}) could not be reached for {patience / 60:g} minutes")
        time.sleep(POLL_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    exit_code = 0

    def run(arguments: SliceArguments) -> dict[str, Any]:
        nonlocal exit_code
        if not command:
            raise InvalidParameter("command", "", "give the command to run on host 0 after --")
        exit_code = launch(arguments, command)
        return {}

    return run_job(SliceArguments, run, flags, description=__doc__, print_summary=False) or exit_code


if __name__ == "__main__":
    sys.exit(main())
