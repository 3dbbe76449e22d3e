"""The worker Deployment's probes against a real `tidal worker` process: the paths and port
the manifests use answer once the worker reports ready (tidal_worker_ready 1)."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from infra_helpers import REPO, find

from infra.render import render
from tests.worker.conftest import WorkerProcess, worker_env

pytestmark = pytest.mark.slow


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_probe_paths_answer_on_a_ready_worker(redis_server, s3_endpoint, tiny_model_dir, tmp_path):
    objects = render(REPO / "infra" / "k8s" / "overlays" / "prod")
    (container,) = find(objects, "Deployment", "tidal-worker")["spec"]["template"]["spec"][
        "containers"
    ]
    probes = [container[name]["httpGet"]["path"] for name in
              ("startupProbe", "livenessProbe", "readinessProbe")]  # fmt: skip
    worker = WorkerProcess(
        worker_env(redis_server.url, s3_endpoint, tiny_model_dir), tmp_path / "worker.log"
    )
    try:
        worker.wait_ready()  # polls /metrics until tidal_worker_ready 1.0
        for path in probes:
            assert http_status(worker.metrics_port, path) == 200, (path, worker.tail())
    finally:
        worker.stop()
