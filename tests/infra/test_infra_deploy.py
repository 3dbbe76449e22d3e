"""The invariants of the deployment that the issue spells out, checked on both overlays."""

from __future__ import annotations

import yaml
from infra_helpers import REPO, find

from worker.settings import WorkerSettings

SHUTDOWN_MARGIN_S = 15  # restore unacked messages + exit, after the soft shutdown window


def worker_container(objects):
    spec = find(objects, "Deployment", "tidal-worker")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def config(objects) -> dict[str, str]:
    return find(objects, "ConfigMap", "tidal-config")["data"]


def test_config_keys_are_worker_settings(overlay):
    _, objects = overlay
    fields = {name.upper() for name in WorkerSettings.model_fields}
    tidal_keys = [k for k in config(objects) if k.startswith("TIDAL_")]
    unknown = [k for k in tidal_keys if k.removeprefix("TIDAL_") not in fields]
    assert not unknown, f"ConfigMap keys the worker does not read: {unknown}"
    # and the values parse as the worker would parse them
    env = {k: v for k, v in config(objects).items() if k.startswith("TIDAL_")}
    settings = WorkerSettings(**{k.removeprefix("TIDAL_").lower(): v for k, v in env.items()})
    assert settings.queue_prefix == "tidal"


def test_grace_period_covers_soft_shutdown(overlay):
    _, objects = overlay
    spec, container = worker_container(objects)
    soft_s = float(config(objects)["TIDAL_SOFT_SHUTDOWN_TIMEOUT_S"])
    assert spec["terminationGracePeriodSeconds"] >= soft_s + SHUTDOWN_MARGIN_S
    assert config(objects)["REMAP_SIGTERM"] == "SIGQUIT"
    pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "kill -QUIT 1" in pre_stop and "while kill -0 1" in pre_stop


def test_probes_use_the_metrics_port(overlay):
    _, objects = overlay
    _, container = worker_container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(config(objects)["TIDAL_METRICS_PORT"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_worker_gpu_non_root_and_scaled_by_keda(overlay):
    _, objects = overlay
    deployment = find(objects, "Deployment", "tidal-worker")
    spec, container = worker_container(objects)
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    cache_dir = config(objects)["TRITON_CACHE_DIR"]
    cache_mount = next(p for p in mounts if cache_dir.startswith(p + "/"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "persistentVolumeClaim" in volumes[mounts[cache_mount]], "compile cache must persist"
    assert config(objects)["TIDAL_MODEL"].startswith("/models/")
    assert "persistentVolumeClaim" in volumes[mounts["/models"]]


def test_beat_is_a_singleton(overlay):
    _, objects = overlay
    beat = find(objects, "Deployment", "tidal-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    # `tidal beat` refuses to start without a warm-up schedule
    assert len(config(objects)["TIDAL_WARMUP_CRON"].split()) == 5


def test_no_secret_is_committed(overlay):
    _, objects = overlay
    assert not [o for o in objects if o["kind"] == "Secret"]
    secret_keys = ("PASSWORD", "SECRET", "BROKER_URL", "ACCESS_KEY")
    assert not [k for k in config(objects) if any(s in k for s in secret_keys)]
    for kind, name in (("Deployment", "tidal-worker"), ("Deployment", "tidal-beat")):
        (container,) = find(objects, kind, name)["spec"]["template"]["spec"]["containers"]
        assert {"secretRef": {"name": "tidal-secrets"}} in container["envFrom"]
        assert all("value" not in e for e in container.get("env", []))


def test_dev_redis_is_persistent_and_never_evicts():
    from infra.render import render

    objects = render(REPO / "infra" / "k8s" / "overlays" / "dev")
    (container,) = find(objects, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs["--appendonly"] == "yes"
    assert pairs["--maxmemory-policy"] == "noeviction"
    prod = render(REPO / "infra" / "k8s" / "overlays" / "prod")
    assert not [o for o in prod if o["metadata"]["name"] == "redis"], "prod uses an external Redis"


def test_compose_matches_the_worker_settings():
    compose = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())
    services = compose["services"]
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command
    fields = {name.upper() for name in WorkerSettings.model_fields}
    for name in ("worker", "beat"):
        env = services[name]["environment"]
        unknown = [k for k in env if k.startswith("TIDAL_") and k[6:] not in fields]
        assert not unknown, f"{name}: keys the worker does not read: {unknown}"
    assert len(services["beat"]["environment"]["TIDAL_WARMUP_CRON"].split()) == 5
    worker = services["worker"]
    grace_s = int(worker["stop_grace_period"].removesuffix("s"))
    soft_s = float(worker["environment"]["TIDAL_SOFT_SHUTDOWN_TIMEOUT_S"])
    assert grace_s >= soft_s + SHUTDOWN_MARGIN_S
    assert worker["stop_signal"] == "SIGQUIT"
