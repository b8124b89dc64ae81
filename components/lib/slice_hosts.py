"""A TPU slice's hosts, as TensorFlow's single controller needs them: which host this is, every host's address, the
TensorFlow worker server that owns a host's chips, and the status host 0 gives the others while its program runs.

On a slice of several hosts, TensorFlow runs one program, on host 0, which reaches every host's chips through the
gRPC worker server each host runs (``TPUClusterResolver("grpc://h0:8470,grpc://h1:8470,...")``). The hosts are found,
in this order, from ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES`` (GKE sets them for TPU slices), from the Compute
Engine metadata the TPU VM's own worker reads (``agent-worker-number``, ``worker-network-endpoints``), else from
Vertex AI's documented ``CLUSTER_SPEC`` (its task's pool and index; whether Vertex AI lists a TPU slice's hosts there
is not documented, so a pool of another size than the slice's is passed over).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from components.lib import storage
from components.lib.errors import Refused, ServiceFailed

log = logging.getLogger("tpu_mlm.slice")

SERVER_PORT = 8470  # the TPU worker's gRPC port on Cloud TPU VMs
# host 0's status, which the other hosts follow: outside the ports libtpu and the TPU runtime take (8466-8480:
# 8471 is libtpu's slice builder, 8476 the mesh controller; 8080, 8431)
STATUS_PORT = 8491
MESH_CONTROLLER_PORT = 8476
# Set by the slice launcher for host 0's program: the endpoints that take the place of --tpu local there.
ENDPOINTS_VARIABLE = "TPU_SLICE_ENDPOINTS"
# "true" in the job's environment (compile or smoke --tpu_env): each worker server also gets the variables
# TensorFlow's own TPU worker sets for the StreamExecutor runtime's mesh controller
MESH_CONTROLLER_VARIABLE = "TPU_MLM_MESH_CONTROLLER"
METADATA_TIMEOUT_SECONDS = 5.0
METADATA_TRIES = 3


@dataclass(frozen=True)
class SliceHosts:
    """This host's index and every host's address in the slice's order (host 0 first), and where they were
    found. An address may carry its port (``host:port``), which takes the place of the server's port for that
    host: several stand-in hosts on one machine."""

    index: int
    addresses: tuple[str, ...]
    source: str

    def server(self, host: int, port: int = SERVER_PORT) -> tuple[str, int]:
        name, _, own_port = self.addresses[host].partition(":")
        return name, int(own_port or port)

    def server_environment(self, mesh_controller: bool = False) -> dict[str, str]:
        """What the TPU runtime of this host's worker server reads to join the slice: its index and every host's
        name (``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``, as GKE sets them for libtpu), its task as TensorFlow's own
        TPU worker (``tensorflow/python/tools/grpc_tpu_worker.py``) sets it, and the chips locked to it. With
        ``mesh_controller``: also host 0's mesh controller and this host's address, which grpc_tpu_worker.py sets
        for the StreamExecutor TPU runtime; whether the PJRT runtimes of this project's images read them is not
        verified (no public source says either way): off unless asked."""
        environment = {
            "CLOUD_TPU_TASK_ID": str(self.index),
            "TPU_WORKER_ID": str(self.index),
            "TPU_WORKER_HOSTNAMES": ",".join(self.server(host)[0] for host in range(len(self.addresses))),
            "TPU_LOCK_DEVICE": "true",
        }
        if mesh_controller:
            environment.update(
                TPU_MESH_CONTROLLER_ADDRESS=f"{self.server(0)[0]}:{MESH_CONTROLLER_PORT}",
                TPU_MESH_CONTROLLER_PORT=str(MESH_CONTROLLER_PORT),
                TPU_HOSTNAME_OVERRIDE=self.server(self.index)[0],
            )
        return environment

    def endpoints(self, port: int = SERVER_PORT) -> str:
        """Every host's worker server, as ``TPUClusterResolver`` takes them."""
        return ",".join("grpc://{}:{}".format(*self.server(host, port)) for host in range(len(self.addresses)))


class SliceFailed(ServiceFailed):
    """The slice failed under the launcher: a host's server ended, host 0 lost, a stop while waiting."""


class SliceNotUp(SliceFailed, Refused):
    """The slice did not come up: its hosts not found, or a host's server not answering in time. Another job with
    the same settings meets it again: a known outcome (the job's verdict), not a failure to restart."""


def discover(environ: Mapping[str, str], metadata: Callable[[str], str | None], hosts: int) -> SliceHosts:
    """This host and its slice's ``hosts`` hosts, from the environment, else the instance metadata."""
    if environ.get("TPU_WORKER_ID") and environ.get("TPU_WORKER_HOSTNAMES"):
        index, addresses = environ["TPU_WORKER_ID"], environ["TPU_WORKER_HOSTNAMES"].split(",")
        source = "TPU_WORKER_ID and TPU_WORKER_HOSTNAMES"
    else:
        # the TPU VM's metadata before CLUSTER_SPEC: it is where libtpu itself learns a host's place in the slice,
        # while CLUSTER_SPEC's order is Vertex AI's replicas', not known to be the same
        index, endpoints = metadata("agent-worker-number"), metadata("worker-network-endpoints")
        cluster = cluster_spec_hosts(environ.get("CLUSTER_SPEC", ""), hosts)
        if index is not None and endpoints:
            # "unknown:unknown:10.130.0.7,unknown:unknown:10.130.0.8": the address is each entry's third field
            addresses = [entry.split(":")[2] for entry in endpoints.split(",")]
            source = "the instance metadata (agent-worker-number, worker-network-endpoints)"
        elif cluster is not None:
            index, addresses = cluster
            source = "CLUSTER_SPEC (Vertex AI)"
        else:
            raise SliceNotUp(
                "found no TPU slice hosts: TPU_WORKER_ID and TPU_WORKER_HOSTNAMES are not set, the instance metadata "
                "has no agent-worker-number or worker-network-endpoints, and CLUSTER_SPEC does not list the slice's "
                "hosts (is this a TPU VM of a slice?)"
            )
    addresses = [address.strip() for address in addresses]
    if not index.strip().isdigit() or int(index) >= len(addresses) or len(addresses) != hosts or not all(addresses):
        raise SliceNotUp(f"{source} say host {index!r} of {addresses}; this slice has {hosts} hosts")
    return SliceHosts(int(index), tuple(addresses), source)


def cluster_spec_hosts(cluster_spec: str, hosts: int) -> tuple[str, list[str]] | None:
    """This host's index and the hosts' names from Vertex AI's ``CLUSTER_SPEC`` (``{"cluster": {"workerpool0":
    ["host:port", ...]}, "task": {"type": "workerpool0", "index": 0}}``), or None where it is absent, not of that
    form, or lists another number of hosts in this task's pool than the slice has. Its ports are Vertex AI's, not the
    worker servers'."""
    try:
        spec = json.loads(cluster_spec) if cluster_spec else {}
        pool, index = spec["task"]["type"], spec["task"]["index"]
        addresses = [entry.rsplit(":", 1)[0] for entry in spec["cluster"][pool]]
    except (ValueError, KeyError, TypeError, AttributeError):
        if cluster_spec:
            log.warning("CLUSTER_SPEC is not of the form Vertex AI documents: not read (%s)", cluster_spec[:200])
        return None
    if len(addresses) != hosts:
        log.info("CLUSTER_SPEC lists %d host(s) in %s, not this slice's %d: not read", len(addresses), pool, hosts)
        return None
    return str(index), addresses


HOSTS_FOLDER = "hosts"  # under a launcher's --report_dir: host-<index>.json from each host
METADATA_REPORTED = ("accelerator-type", "agent-worker-number", "worker-network-endpoints")


class HostReport:
    """What one host's launcher found, written to ``report_dir/hosts/host-<index>.json`` as it goes (none without a
    ``report_dir``): where the hosts came from, the TPU variables and metadata it saw, its server's start, and
    on host 0 every host's server coming up. The smoke test gathers them."""

    def __init__(self, report_dir: str):
        self.report_dir = report_dir
        self.name = f"host-unknown-{socket.gethostname()}"
        self.values: dict = {
            "hostname": socket.gethostname(),
            "environment": {
                name: value for name, value in os.environ.items() if name.startswith("TPU_") or name == "CLUSTER_SPEC"
            },
        }

    def found(self, hosts: SliceHosts, **values: object) -> None:
        self.name = f"host-{hosts.index}"
        self.update(host=hosts.index, addresses=list(hosts.addresses), source=hosts.source, **values)

    def update(self, **values: object) -> None:
        self.values.update(values)
        if self.report_dir:
            uri = storage.join(self.report_dir, HOSTS_FOLDER, f"{self.name}.json")
            storage.write_text_atomic(uri, json.dumps(self.values, indent=2) + "\n")


def metadata_attribute(name: str, tries: int = METADATA_TRIES) -> str | None:
    """An attribute of this VM's instance metadata (``GCE_METADATA_HOST``: another server, as Google's clients
    take it), None where it is not set or the server cannot be reached in ``tries``."""
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/attributes/{name}", headers={"Metadata-Flavor": "Google"}
    )
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT_SECONDS) as response:
                return response.read().decode()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
        except OSError:
            pass
        if attempt + 1 < tries:
            time.sleep(attempt + 1)
    return None


def wait_for_servers(hosts: SliceHosts, port: int, timeout_seconds: float, own_server: Any = None) -> None:
    """Returns once every host's worker server accepts connections; fails, naming the hosts that did not, after
    ``timeout_seconds``, or at once when this host's own server (a ``subprocess.Popen``) has ended."""
    deadline = time.monotonic() + timeout_seconds
    waiting = set(range(len(hosts.addresses)))
    while waiting:
        if own_server is not None and own_server.poll() is not None:
            raise SliceFailed(f"this host's worker server ended with exit code {own_server.returncode}")
        waiting = {host for host in waiting if not _accepts(*hosts.server(host, port))}
        if waiting and time.monotonic() > deadline:
            names = ", ".join(f"{host} ({hosts.addresses[host]})" for host in sorted(waiting))
            raise SliceNotUp(f"the worker server of host(s) {names} did not come up in {timeout_seconds:.0f} s")
        if waiting:
            time.sleep(1.0)


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2.0):
            return True
    except OSError:
        return False


class StatusServer:
    """Host 0's status for the other hosts: one JSON line a connection, ``{"running": true}`` while its program
    runs, then ``{"running": false, "exit_code": N}``."""

    def __init__(self, port: int):
        status = self.status = {"running": True}
        self.asked_after_end: set[str] = set()
        asked = self.asked_after_end

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.sendall((json.dumps(status) + "\n").encode())
                if not status["running"]:
                    asked.add(self.client_address[0] + self.request.recv(64).decode().strip())

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def end(self, exit_code: int, hosts: int, linger_seconds: float) -> None:
        """Says the program ended with ``exit_code``, and stays up until the ``hosts - 1`` others have read it
        or ``linger_seconds`` have passed."""
        self.status.update(running=False, exit_code=exit_code)
        deadline = time.monotonic() + linger_seconds
        while len(self.asked_after_end) < hosts - 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        self._server.shutdown()
        self._server.server_close()


def host_zero_status(hosts: SliceHosts, status_port: int) -> dict | None:
    """Host 0's status, None when it cannot be reached."""
    address = hosts.server(0)[0]
    try:
        with socket.create_connection((address, status_port), timeout=5.0) as connection:
            status = json.loads(connection.makefile().readline())
            if not status["running"]:
                connection.sendall(f":{hosts.index}\n".encode())  # read: host 0 may stop waiting for this host
            return status
    except (OSError, ValueError):
        return None
