"""The Dockerfiles agree with the manifests (user, port, cache paths, PID 1) and never bake
a model or a secret in. The images themselves are not built in CI (no Docker there)."""

from __future__ import annotations

import re

from infra_helpers import REPO, find

from infra.render import render

DOCKER = REPO / "infra" / "docker"


def instructions(name: str) -> list[tuple[str, str]]:
    text = (DOCKER / name).read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def final_stage(name: str) -> list[tuple[str, str]]:
    steps = instructions(name)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def env_of(steps) -> dict[str, str]:
    env = {}
    for op, arg in steps:
        if op == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", arg))
    return env


def test_worker_image_matches_the_deployment():
    objects = render(REPO / "infra" / "k8s" / "overlays" / "prod")
    spec = find(objects, "Deployment", "tidal-worker")["spec"]["template"]["spec"]
    config = find(objects, "ConfigMap", "tidal-config")["data"]
    steps = final_stage("Dockerfile")
    env = env_of(steps)
    (user,) = [arg for op, arg in steps if op == "USER"]
    assert user.split(":")[0] == str(spec["securityContext"]["runAsUser"]) != "0"
    assert env["TRITON_CACHE_DIR"] == config["TRITON_CACHE_DIR"]
    assert env["TIDAL_METRICS_PORT"] == config["TIDAL_METRICS_PORT"]
    assert [arg for op, arg in steps if op == "EXPOSE"] == [config["TIDAL_METRICS_PORT"]]
    (entrypoint,) = [arg for op, arg in steps if op == "ENTRYPOINT"]
    assert "tini" in entrypoint, "the preStop hook signals PID 1, which must forward it"
    assert steps[0][1].startswith("${CUDA_IMAGE}")
    assert "runtime" in next(arg for op, arg in instructions("Dockerfile") if op == "ARG")


def test_images_carry_no_model_and_no_secret():
    for name in ("Dockerfile", "Dockerfile.cpu"):
        steps = instructions(name)
        copied = " ".join(arg for op, arg in steps if op in ("COPY", "ADD"))
        assert not re.search(r"\.(gguf|safetensors|bin)\b", copied), name
        assert not [k for k in env_of(steps) if re.search("KEY|SECRET|PASSWORD|TOKEN", k)], name
        assert any(op == "USER" and not arg.startswith("0") for op, arg in final_stage(name))
