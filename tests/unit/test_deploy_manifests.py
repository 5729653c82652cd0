"""The container files (config/Dockerfile, config/kubernetes.yaml; docs/deploy.md explains
them) agree with the code: the ConfigMap's config is valid, the environment variable for the
static membership really sets kafka.consumer group.instance.id, the probes ask for endpoints
the admin server serves on the port it listens on, the grace period is longer than the
shutdown, the shm volume holds what the config needs, and the image builds the wheel with the
C speedups and runs the config the pod mounts. No container runs here (no Docker engine)."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime.config import load_settings
from runtime.ops.admin_server import PATHS
from runtime.supervisor.daemon.run import shm_needed

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "config" / "kubernetes.yaml"
DOCKERFILE = ROOT / "config" / "Dockerfile"


def documents() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def pod() -> dict[str, Any]:
    spec: dict[str, Any] = documents()["StatefulSet"]["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    [c] = pod()["containers"]
    return c  # type: ignore[no-any-return]


def quantity_bytes(q: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", q)
    assert m, q
    return int(m.group(1)) * {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[m.group(2)]


def env_of(c: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet sets it for a pod called ``pod_name``."""
    out = {}
    for e in c.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        else:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", e
            out[e["name"]] = pod_name
    return out


@pytest.fixture()
def settings(tmp_path: Path) -> Any:
    """The ConfigMap's config, loaded as the pod ringmaster-1 loads it."""
    cfg = tmp_path / "ringmaster.toml"
    cfg.write_text(documents()["ConfigMap"]["data"]["ringmaster.toml"])
    return load_settings(cfg, env=env_of(container(), "ringmaster-1"))


def test_the_pod_runs_the_config_it_mounts() -> None:
    c = container()
    args = c["args"]
    assert args[:2] == ["run", "-c"]
    config_path = Path(args[2])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["config"]["mountPath"] == str(config_path.parent)
    volumes = {v["name"]: v for v in pod()["volumes"]}
    assert volumes["config"]["configMap"]["name"] == documents()["ConfigMap"]["metadata"]["name"]
    assert config_path.name in documents()["ConfigMap"]["data"]


def test_static_membership_takes_the_pods_name(settings: Any) -> None:
    assert settings.kafka.consumer["group.instance.id"] == "ringmaster-1"
    assert documents()["StatefulSet"]["kind"] == "StatefulSet", "pod names survive a replacement"


def test_the_probes_ask_the_admin_server_for_what_it_serves(settings: Any) -> None:
    c = container()
    port = int(settings.admin.listen.rsplit(":", 1)[1])
    assert settings.admin.allow_remote, "the kubelet probes from outside the pod's loopback"
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named["admin"] == port
    probes = {kind: c[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    for get in probes.values():
        assert get["path"] in PATHS
        assert named.get(get["port"], get["port"]) == port
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= settings.workers.setup_timeout_s, \
        "the workers' setup() may take workers.setup_timeout_s before the probes start"


def test_the_grace_period_outlasts_a_clean_stop(settings: Any) -> None:
    grace = pod()["terminationGracePeriodSeconds"]
    assert grace > settings.supervisor.shutdown_timeout_s + 5


def test_the_shm_volume_holds_the_rings_the_config_needs(settings: Any) -> None:
    c = container()
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["shm"] == settings.supervisor.shm_dir
    shm = {v["name"]: v for v in pod()["volumes"]}["shm"]["emptyDir"]
    assert shm["medium"] == "Memory"
    # Without workers.processes the workers follow the CPU limit (the cgroup quota).
    assert "processes" not in settings.workers.model_fields_set
    cpus = math.floor(float(c["resources"]["limits"]["cpu"]))
    need = shm_needed(settings, cpus + 1)
    assert quantity_bytes(shm["sizeLimit"]) >= need
    assert quantity_bytes(c["resources"]["limits"]["memory"]) > quantity_bytes(shm["sizeLimit"])
    stated = re.search(r"([\d.]+) MiB for (\d+) workers", MANIFEST.read_text())
    assert stated and int(stated.group(2)) == cpus and float(stated.group(1)) == round(need / 2**20, 1)


def test_the_default_shm_is_too_small_from_seven_workers_as_the_comment_says(settings: Any) -> None:
    assert "too small from 7 workers on" in MANIFEST.read_text()
    assert shm_needed(settings, 7 + 1) > 64 * 2**20 >= shm_needed(settings, 6 + 1)


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_image_builds_the_wheel_with_the_c_speedups_and_runs_as_the_pod_expects() -> None:
    steps = instructions()
    runs = [arg for op, arg in steps if op == "RUN"]
    assert any("RINGMASTER_REQUIRE_SPEEDUPS=1" in r and "pip wheel" in r for r in runs)
    assert sum(op == "FROM" for op, _ in steps) == 2, "a build stage with a compiler, a runtime without"
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]
    assert not any("gcc" in arg for op, arg in final if op == "RUN"), "no compiler in the runtime image"
    entry = [x for op, arg in final if op == "ENTRYPOINT" for x in yaml.safe_load(arg)]
    cmd = [x for op, arg in final if op == "CMD" for x in yaml.safe_load(arg)]
    assert entry == ["ringmaster"]
    assert cmd == container()["args"], "the image's default command is the pod's"
    user = [arg for op, arg in final if op == "USER"]
    assert user and user[-1] == str(pod()["securityContext"]["runAsUser"])
    assert ("STOPSIGNAL", "SIGTERM") in final


def test_the_dockerfiles_run_example_gives_the_shm_the_default_config_needs() -> None:
    """--shm-size and --cpus in the comment's `docker run` fit each other."""
    line = next(x for x in DOCKERFILE.read_text().splitlines() if "docker run" in x)
    argv = shlex.split(line.lstrip("# "))
    size = next(a.split("=", 1)[1] for a in argv if a.startswith("--shm-size="))
    cpus = int(next(a.split("=", 1)[1] for a in argv if a.startswith("--cpus=")))
    from runtime.config import Settings
    s = Settings.model_validate({"kafka": {"bootstrap_servers": "k:9092", "group_id": "g", "topics": ["t"]},
                                 "workers": {"plugin": "workers.enrich", "processes": cpus}})
    assert size.endswith("m") and int(size[:-1]) * 2**20 >= shm_needed(s, cpus + 1)


def test_the_build_context_leaves_out_what_was_built_here() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in (".venv", "**/*.so", "dist", "mutants"):
        assert path in ignored


def test_docs_deploy_explains_both_files() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for name in ("config/Dockerfile", "config/kubernetes.yaml",
                 "RINGMASTER__KAFKA__CONSUMER__GROUP_INSTANCE_ID", "terminationGracePeriodSeconds",
                 "sizeLimit", "/healthz", "/readyz"):
        assert name in text, name


def test_the_systemd_unit_waits_longer_than_a_clean_stop(settings: Any) -> None:
    unit = (ROOT / "config" / "ringmaster.service").read_text()
    stop = re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    assert stop and int(stop.group(1)) > settings.supervisor.shutdown_timeout_s + 5
