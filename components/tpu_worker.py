"""Serve this host's accelerators to a TensorFlow program on another host: the gRPC worker server every host of a
TPU slice runs (as Cloud TPU VMs' own TPU worker does), which host 0's program reaches through
``TPUClusterResolver("grpc://...")``. Blocks until stopped. Started by ``python -m components.slice`` on each host;
this process loads the TPU runtime (libtpu) and owns the host's chips, host 0's program does not.

    python -m components.tpu_worker --task 0 --port 8470
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.lib import storage
from components.lib.job_runner import run_job
from components.lib.slice_hosts import HOSTS_FOLDER, SERVER_PORT

log = logging.getLogger("tpu_mlm.tpu_worker")


@dataclass
class WorkerArguments:
    task: int = field(default=0, metadata={"help": "This host's index in the slice (host 0 runs the program)."})
    port: int = field(default=SERVER_PORT, metadata={"help": "The port to serve on."})
    report_dir: str = field(
        default="", metadata={"help": "Folder where the devices served go, hosts/host-N-server.json (the smoke's)."}
    )


def serve(arguments: WorkerArguments) -> dict[str, Any]:
    import tensorflow as tf

    cluster = tf.train.ClusterSpec({"worker": {arguments.task: f"localhost:{arguments.port}"}})
    server = tf.distribute.Server(cluster, job_name="worker", task_index=arguments.task, protocol="grpc")
    devices = [device.name for device in tf.config.list_physical_devices()]
    log.info("host %d serving %s on port %d", arguments.task, devices, arguments.port)
    if arguments.report_dir:  # whether libtpu gave this server its chips, for the smoke test's report
        uri = storage.join(arguments.report_dir, HOSTS_FOLDER, f"host-{arguments.task}-server.json")
        storage.write_text_atomic(uri, json.dumps({"host": arguments.task, "devices": devices}) + "\n")
    server.join()  # until the launcher ends this process
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job(WorkerArguments, serve, argv, description=__doc__, print_summary=False)


if __name__ == "__main__":
    sys.exit(main())
