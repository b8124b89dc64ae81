"""The slice launcher rehearsed on this machine: TensorFlow worker servers on localhost stand in for a TPU slice's
hosts, each host's launcher a process of its own, found from the workers' variables (as GKE sets them) or from a
stand-in of the Compute Engine metadata server. What only a slice can show (libtpu in each server, TPUStrategy
over the remote TPUs) is not here: MirroredStrategy refuses remote devices in one eager program ("In-graph
multi-worker training with MirroredStrategy is not supported in eager mode"), so no strategy trains over them."""

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import PROJECT_ROOT, run_module

from components.lib.slice_hosts import (
    METADATA_REPORTED,
    SliceFailed,
    SliceHosts,
    discover,
    metadata_attribute,
    wait_for_servers,
)


class MetadataStandIn(http.server.ThreadingHTTPServer):
    """The instance metadata server's attributes, refused without its header, as the real one does."""

    def __init__(self, attributes: dict[str, str]):
        attributes_served = attributes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.removeprefix("/computeMetadata/v1/instance/attributes/")
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403)
                elif name not in attributes_served:
                    self.send_error(404)
                else:
                    body = attributes_served[name].encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


def test_the_hosts_come_from_the_workers_variables_else_from_the_instance_metadata(monkeypatch):
    environment = {"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "t1v-w-0,t1v-w-1,t1v-w-2,t1v-w-3"}
    hosts = discover(environment, lambda name: None, 4)
    assert hosts == SliceHosts(2, ("t1v-w-0", "t1v-w-1", "t1v-w-2", "t1v-w-3"), hosts.source)
    assert hosts.endpoints() == "grpc://t1v-w-0:8470,grpc://t1v-w-1:8470,grpc://t1v-w-2:8470,grpc://t1v-w-3:8470"

    endpoints = ",".join(f"unknown:unknown:10.130.0.{i}" for i in range(4))
    metadata = MetadataStandIn({"agent-worker-number": "1", "worker-network-endpoints": endpoints})
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
    hosts = discover({}, metadata_attribute, 4)
    assert hosts.index == 1 and hosts.addresses == tuple(f"10.130.0.{i}" for i in range(4))
    assert "instance metadata" in hosts.source
    with pytest.raises(SliceFailed, match=r"host '1' of .*; this slice has 8 hosts"):
        discover({}, metadata_attribute, 8)  # a v5e-32's job on a v5e-16's hosts
    metadata.shutdown()

    monkeypatch.setenv("GCE_METADATA_HOST", MetadataStandIn({}).host)
    with pytest.raises(SliceFailed, match="found no TPU slice hosts: TPU_WORKER_ID and TPU_WORKER_HOSTNAMES are not"):
        discover({}, metadata_attribute, 4)


def test_vertex_ai_s_cluster_spec_names_the_hosts_when_nothing_else_does_and_it_lists_the_slice_s():
    """Vertex AI documents CLUSTER_SPEC for distributed jobs; whether a TPU slice's pool lists its hosts there is not
    documented: read when its task's pool has the slice's number of hosts, passed over (to the metadata) when not."""
    pool = [f"cmle-training-workerpool0-ab12-{host}:2222" for host in range(4)]
    spec = {"cluster": {"workerpool0": pool}, "environment": "cloud", "task": {"type": "workerpool0", "index": 3}}
    hosts = discover({"CLUSTER_SPEC": json.dumps(spec)}, lambda name: None, 4)  # no metadata server answers
    assert hosts.index == 3 and hosts.source == "CLUSTER_SPEC (Vertex AI)"
    assert hosts.endpoints() == ",".join(f"grpc://cmle-training-workerpool0-ab12-{host}:8470" for host in range(4))
    # the workers' variables come first, then the TPU VM's metadata (where libtpu learns a host's place); a spec
    # of one replica (the pool's replica_count) is not the slice's hosts
    workers = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3", "CLUSTER_SPEC": json.dumps(spec)}
    assert discover(workers, lambda name: None, 4).addresses == ("w0", "w1", "w2", "w3")
    endpoints = ",".join(f"unknown:unknown:10.130.0.{i}" for i in range(4))
    metadata = {"agent-worker-number": "1", "worker-network-endpoints": endpoints}
    from_metadata = discover({"CLUSTER_SPEC": json.dumps(spec)}, metadata.get, 4)
    assert from_metadata.index == 1 and "instance metadata" in from_metadata.source
    one = {**spec, "cluster": {"workerpool0": pool[:1]}, "task": {"type": "workerpool0", "index": 0}}
    for cluster_spec in (json.dumps(one), "not json"):
        with pytest.raises(SliceFailed, match="found no TPU slice hosts"):
            discover({"CLUSTER_SPEC": cluster_spec}, lambda name: None, 4)


def test_each_worker_server_gets_the_slice_s_hosts_and_the_mesh_controller_only_when_asked():
    hosts = SliceHosts(2, ("10.0.0.1", "10.0.0.2", "10.0.0.3:9000", "10.0.0.4"), "test")
    pjrt = hosts.server_environment()
    assert pjrt == {
        "CLOUD_TPU_TASK_ID": "2",
        "TPU_WORKER_ID": "2",
        "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4",
        "TPU_LOCK_DEVICE": "true",
    }
    stream_executor = hosts.server_environment(mesh_controller=True)
    assert stream_executor == {
        **pjrt,
        "TPU_MESH_CONTROLLER_ADDRESS": "10.0.0.1:8476",
        "TPU_MESH_CONTROLLER_PORT": "8476",
        "TPU_HOSTNAME_OVERRIDE": "10.0.0.3",
    }


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for probe in sockets:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in sockets]
    for probe in sockets:
        probe.close()
    return ports


def launch_host(
    index: int | str,
    ports: list[int],
    status_port: int,
    *command: str,
    timeout_minutes=2.0,
    linger=60,
    report_dir="",
    env: dict[str, str] | None = None,
):
    """Host ``index``'s launcher of a v5e-16 (4 hosts) whose hosts are localhost servers on ``ports``, with ``env``
    on top of this process's; no metadata server answers (a closed port)."""
    hostnames = ",".join(f"127.0.0.1:{port}" for port in ports)
    env = {**os.environ, **(env or {}), "TPU_WORKER_ID": str(index), "TPU_WORKER_HOSTNAMES": hostnames}
    env["GCE_METADATA_HOST"] = f"127.0.0.1:{status_port + 1 if status_port < 65535 else 1}"
    flags = ["--tpu_type", "v5e-16", "--status_port", str(status_port), "--report_dir", report_dir]
    flags += ["--hosts_timeout_minutes", str(timeout_minutes), "--linger_seconds", str(linger)]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "components.slice", *flags, "--", *command],
        cwd=PROJECT_ROOT,
        env={**env, "PYTHONPATH": str(PROJECT_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its server and program with it: a failed test ends them all (end_hosts)
    )
    LAUNCHED.append(launcher)
    return launcher


LAUNCHED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def end_hosts():
    """Whatever a test's outcome, no stand-in host outlives it: each launcher's process group is killed."""
    yield
    while LAUNCHED:
        launcher = LAUNCHED.pop()
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


# Host 0's program in the rehearsal: it prepares its runtime as the train step does, connects to every host's server
# through TPUClusterResolver, runs an op on each, writes what it saw, then waits for a SIGTERM and exits 42.
PROBE = """
import json, os, signal, sys, time
from components.lib.devices import prepare_runtime, slice_or
prepare_runtime("tpu")
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(slice_or("local"))
tf.config.experimental_connect_to_cluster(resolver)
results = {}
for task in range(4):
    with tf.device(f"/job:worker/replica:0/task:{task}/device:CPU:0"):
        value = tf.constant(task) * 10
    results[value.device] = int(value)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))
report = {"tpu": slice_or("local"), "load_libtpu": os.environ.get("TPU_LOAD_LIBRARY"), "ran": results}
with open(sys.argv[1] + ".tmp", "w") as out:
    json.dump(report, out)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


@pytest.mark.slow  # four launchers, four TensorFlow servers and a TensorFlow program on two cores
def test_host_zero_runs_the_program_against_every_host_s_server_and_every_host_ends_with_it(tmp_path):
    *ports, status_port = free_ports(5)
    report = tmp_path / "probe.json"
    launchers = [launch_host(0, ports, status_port, sys.executable, "-c", PROBE, str(report))]
    launchers += [launch_host(index, ports, status_port, "false") for index in (1, 2, 3)]
    deadline = time.monotonic() + 240
    while not report.exists() and time.monotonic() < deadline and launchers[0].poll() is None:
        time.sleep(0.5)
    assert report.exists(), launchers[0].communicate(timeout=60)[1][-3000:]
    seen = json.loads(report.read_text())
    assert seen["tpu"] == ",".join(f"grpc://127.0.0.1:{port}" for port in ports)
    assert seen["load_libtpu"] == "0"  # the program keeps off libtpu: each host's server owns its chips
    assert seen["ran"] == {f"/job:worker/replica:0/task:{task}/device:CPU:0": task * 10 for task in range(4)}

    launchers[1].send_signal(signal.SIGTERM)  # another host told to stop serves on until host 0's program ends
    time.sleep(1)
    assert launchers[1].poll() is None
    launchers[0].send_signal(signal.SIGTERM)  # reaches host 0's program, as on one host
    outcomes = [launcher.communicate(timeout=120) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [42] * 4, [err[-2000:] for _, err in outcomes]
    assert "host 0's command ended with exit code 42" in outcomes[3][1]


@pytest.mark.slow  # four launchers and TensorFlow servers on two cores
def test_a_refused_input_on_host_zero_ends_every_host_with_status_2(tmp_path):
    """The train step on host 0 refuses its input (no tokenizer there): every host's container exits 2, the status
    the TPU task's launcher reads as "do not replace the job", whichever host's status Vertex AI reports."""
    *ports, status_port = free_ports(5)
    train = [sys.executable, "-m", "components.train", "--tokenizer", str(tmp_path / "no-tokenizer-here")]
    train += ["--train_shards", str(tmp_path / "shards"), "--accelerator", "cpu", "--output", str(tmp_path / "model")]
    launchers = [launch_host(0, ports, status_port, *train)]
    launchers += [launch_host(index, ports, status_port, "false") for index in (1, 2, 3)]
    outcomes = [launcher.communicate(timeout=300) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [2] * 4, [err[-2000:] for _, err in outcomes]
    refused = [line for line in outcomes[0][1].splitlines() if line.startswith("error: ")]
    assert refused == [
        f"error: --tokenizer='{tmp_path / 'no-tokenizer-here'}': is not a tokenizer folder (no tokenizer.json in it)"
    ]
    assert "host 0's command ended with exit code 2" in outcomes[3][1]
    assert not (tmp_path / "model").exists()


@pytest.mark.slow  # four launchers and servers, and the smoke test's training on two cores
def test_the_smoke_test_on_a_slice_reports_every_host_and_the_devices_host_zero_reaches(tmp_path):
    """``tpu-mlm smoke --tpu_type v5e-16``'s job rehearsed: every host's launcher writes what it found beside the
    report, and the smoke test on host 0 connects to every host's server before it trains (here on its CPU)."""
    *ports, status_port = free_ports(5)
    scratch = str(tmp_path / "smoke")
    smoke = [sys.executable, "-m", "pipelines.smoke_job", "--scratch", scratch, "--accelerator", "cpu"]
    smoke += ["--model_config", "tiny", "--per_replica_batch_size", "8", "--steps", "6", "--vocab_size", "2000"]
    smoke += ["--max_length", "32"]
    launchers = [launch_host(0, ports, status_port, *smoke, report_dir=scratch)]
    launchers += [launch_host(index, ports, status_port, "false", report_dir=scratch) for index in (1, 2, 3)]
    outcomes = [launcher.communicate(timeout=600) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0] * 4, outcomes[0][1][-3000:]
    report = json.loads((tmp_path / "smoke" / "smoke.json").read_text())
    assert report["verdict"] == "pass", report
    seen = report["stages"]["slice"]
    assert seen["endpoints"] == ",".join(f"grpc://127.0.0.1:{port}" for port in ports)
    assert seen["devices_by_host"] == {str(task): ["CPU:0"] for task in range(4)}
    hosts = seen["host_reports"]
    assert [host["host"] for host in hosts] == [0, 1, 2, 3]
    assert all(host["source"] == "TPU_WORKER_ID and TPU_WORKER_HOSTNAMES" for host in hosts)
    assert all(host["environment"]["TPU_WORKER_ID"] == str(host["host"]) for host in hosts)
    assert all(host["metadata"] == dict.fromkeys(METADATA_REPORTED) for host in hosts)  # no metadata server here
    assert "every_server_up_after_seconds" in hosts[0] and all(host["server_port"] for host in hosts)
    assert all("/physical_device:CPU:0" in host["server_devices"] for host in hosts)  # each server's own devices
    assert hosts[0]["environment"]["TPU_WORKER_HOSTNAMES"].count(",") == 3
    # what each host's worker server was given: the slice's hosts, no StreamExecutor mesh controller by default
    assert all(
        host["server_environment"]["TPU_WORKER_HOSTNAMES"] == "127.0.0.1,127.0.0.1,127.0.0.1,127.0.0.1"
        for host in hosts
    )
    assert not any("TPU_MESH_CONTROLLER_ADDRESS" in host["server_environment"] for host in hosts)
    assert "slice: 4 host report(s), hosts found from TPU_WORKER_ID and TPU_WORKER_HOSTNAMES" in outcomes[0][1]


@pytest.mark.slow  # 3 s or more: out of the fast tier (docs/testing.md, Two tiers)
def test_host_zero_fails_in_bounded_time_when_a_host_never_comes_up(tmp_path):
    *ports, status_port = free_ports(5)
    started = time.monotonic()
    # 3 s: hosts 1 to 3 never come up; host 0's own server (a TensorFlow import) may not have either
    launcher = launch_host(0, ports, status_port, "true", timeout_minutes=0.05, linger=1, report_dir=str(tmp_path))
    _, stderr = launcher.communicate(timeout=180)
    assert launcher.returncode == 3, stderr[-3000:]  # a slice that did not come up: another job meets it again
    assert time.monotonic() - started < 60
    named = [re.escape(f"{host} (127.0.0.1:{ports[host]})") for host in range(4)]
    failure = rf"the worker server of host\(s\) ({named[0]}, )?{', '.join(named[1:])} did not come up in 3 s"
    last = stderr.splitlines()[-1] if stderr.strip() else ""
    assert re.fullmatch(f"error: {failure}", last), stderr[-3000:]  # last: its worker server stopped before it
    reported = json.loads((tmp_path / "hosts" / "host-0.json").read_text())  # what the smoke test gathers
    assert re.fullmatch(failure, reported["failed"])


@pytest.mark.slow  # two launchers and their TensorFlow servers
@pytest.mark.parametrize("failing", ["host 0 waits for the others", "host 0 finds no hosts"])
def test_a_slice_that_does_not_come_up_ends_every_host_cleanly_with_the_tpu_job_s_verdict(tmp_path, failing):
    """In the launcher's TPU job (its verdict file named), a slice whose hosts 2 and 3 never come up, or whose host 0
    finds no slice hosts, is a verdict (3): host 0 writes it, and every host ends with 0, the one that follows host 0
    too (told by host 0, or finding the verdict when host 0 is gone), so that no host's exit has Vertex AI restart
    the job to wait again."""
    *ports, status_port = free_ports(5)
    job = {"TPU_MLM_VERDICT": str(tmp_path / "verdict.json")}
    host_zero = 0 if failing == "host 0 waits for the others" else "9"  # no host 9 on a v5e-16
    launchers = [
        launch_host(host_zero, ports, status_port, "true", timeout_minutes=0.05, linger=5, env=job),
        launch_host(1, ports, status_port, "true", timeout_minutes=0.05, linger=5, env=job),
    ]
    outcomes = [launcher.communicate(timeout=240) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], [err[-2000:] for _, err in outcomes]
    written = json.loads((tmp_path / "verdict.json").read_text())
    # the launcher's one line, last: its worker server, a child sharing its stderr, is stopped before it
    assert written["status"] == 3 and outcomes[0][1].splitlines()[-1:] == [f"error: {written['line']}"], outcomes[0][1]
    told = "host 0's command ended with exit code 0"
    ending = told if host_zero == 0 else "host 0 ended the TPU job with its verdict"
    assert ending in outcomes[1][1], outcomes[1][1][-2000:]


def test_the_launcher_refuses_a_one_host_tpu_and_a_missing_command():
    for flags, message in (
        (["--tpu_type", "v5e-8", "--", "true"], "--tpu-type='v5e-8': is one host: run the command itself"),
        (["--tpu_type", "v5e-16"], "--command='': give the command to run on host 0 after --"),
    ):
        result = run_module("components.slice", *flags)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]


def test_host_zero_stops_waiting_for_the_hosts_when_its_own_server_has_ended():
    """A server that could not start (libtpu refused it, say) ends the wait at once, not after its timeout."""
    hosts = SliceHosts(0, ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"), "test")
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ended.wait()
    started = time.monotonic()
    with pytest.raises(SliceFailed, match="this host's worker server ended with exit code 3"):
        wait_for_servers(hosts, 8470, 600, ended)
    assert time.monotonic() - started < 10
