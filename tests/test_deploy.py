"""The deployment examples in deploy/ are checked, not only written: the Kubernetes manifests
against the Kubernetes schemas, the compose file against the compose specification (and by
`docker compose config` under `make test-docker`, which needs Docker Compose), their config by
the proxy's own loader, and what they must agree on with the image (uid, port, config path)
and with each other (names, keys, targets)."""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kubernetes

from proxy.config import load

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# Native sidecars (init containers that keep running) are on by default from 1.29.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes.latest_version())


def image() -> dict[str, Any]:
    """What the Dockerfile's final stage promises: its user, port and config path."""
    final = (ROOT / "Dockerfile").read_text().split("\nFROM ")[-1]
    user = re.search(r"^USER (\d+):(\d+)$", final, re.M)
    port = re.search(r"\bPORT=(\d+)", final)
    config = re.search(r"--config (/\S+)", final)
    assert user and port and config, "the Dockerfile no longer says its user, PORT or config"
    return {
        "uid": int(user[1]),
        "gid": int(user[2]),
        "port": int(port[1]),
        "config": Path(config[1]),
    }


# -- the config both examples use ------------------------------------------------------------------


def test_the_examples_config_passes_the_proxys_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "UPSTREAM_BASE_URL", "ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    config = load(DEPLOY / "config.yaml")
    assert config.store.url == "redis://redis:6379/0"
    assert config.listen.host == "0.0.0.0" and config.listen.port == image()["port"]
    # Listening on every interface is safe only because it holds no upstream key.
    assert [u.api_key for u in config.upstreams.values()] == [None]
    assert config.admin.token in (None, "")

    monkeypatch.setenv("ADMIN_TOKEN", "admin-secret")
    monkeypatch.setenv("REDIS_URL", "redis://cache.internal:6380/1")
    config = load(DEPLOY / "config.yaml")
    assert config.admin.token == "admin-secret"
    assert config.store.url == "redis://cache.internal:6380/1"


# -- Kubernetes ------------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return data


def manifests() -> list[dict[str, Any]]:
    """Every resource kustomization.yaml lists, and the ConfigMap its generator makes."""
    found = []
    for resource in kustomization()["resources"]:
        found += [doc for doc in yaml.safe_load_all((DEPLOY / resource).read_text()) if doc]
    for generator in kustomization()["configMapGenerator"]:
        data = {Path(f).name: (DEPLOY / f).read_text() for f in generator["files"]}
        meta = {"name": generator["name"]}
        found.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return found


def resource(kind: str, name: str) -> dict[str, Any]:
    (found,) = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [item for item in items if item["name"] == name]
    return found


def test_kustomization_lists_every_manifest() -> None:
    listed = sorted(kustomization()["resources"])
    assert listed == sorted(str(p.relative_to(DEPLOY)) for p in DEPLOY.glob("kubernetes/*.yaml"))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_manifests_match_the_schemas(version: str) -> None:
    kinds = []
    for manifest in manifests():
        kubernetes.validate(manifest, version, strict=True)
        kinds.append(manifest["kind"])
    assert sorted(kinds) == ["ConfigMap", "Deployment", "Deployment", "Secret", "Service"]


def test_the_schema_check_rejects_a_wrong_manifest() -> None:
    deployment = resource("Deployment", "chat-app")
    proxy = by_name(containers(deployment["spec"]["template"]["spec"]), "compaction-proxy")
    proxy["securityContext"]["runAsUser"] = "10001"  # a string
    with pytest.raises(kubernetes.ValidationError):
        kubernetes.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    del proxy["securityContext"]["runAsUser"]
    proxy["securityContext"]["readOnlyRootFileSystem"] = True  # misspelt
    with pytest.raises(kubernetes.ValidationError):
        kubernetes.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_the_sidecar_runs_the_image_as_it_is_built() -> None:
    built = image()
    pod = resource("Deployment", "chat-app")["spec"]["template"]["spec"]
    proxy = by_name(pod["initContainers"], "compaction-proxy")
    assert proxy["restartPolicy"] == "Always"  # a native sidecar: up before the app
    security = proxy["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (built["uid"], built["gid"])

    (port,) = proxy["ports"]
    assert port["containerPort"] == int(by_name(proxy["env"], "PORT")["value"]) == built["port"]
    probes = {kind: proxy[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe")}
    probes["livenessProbe"] = proxy["livenessProbe"]["httpGet"]
    assert {kind: probe["path"] for kind, probe in probes.items()} == {
        "startupProbe": "/readyz",
        "readinessProbe": "/healthz",
        "livenessProbe": "/healthz",
    }
    assert {probe["port"] for probe in probes.values()} == {port["name"]}

    (mount,) = proxy["volumeMounts"]
    assert Path(mount["mountPath"]) == built["config"].parent
    volume = by_name(pod["volumes"], mount["name"])
    config_map = resource("ConfigMap", volume["configMap"]["name"])
    assert built["config"].name in config_map["data"]

    app = by_name(pod["containers"], "app")
    base_url = by_name(app["env"], "OPENAI_BASE_URL")["value"]
    assert base_url == f"http://127.0.0.1:{built['port']}/v1"


def test_every_container_is_locked_down_and_sized() -> None:
    for deployment in (m for m in manifests() if m["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        for container in containers(pod):
            security = {**pod.get("securityContext", {}), **container["securityContext"]}
            where = f"{deployment['metadata']['name']}/{container['name']}"
            assert security["runAsNonRoot"] is True, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            resources = container["resources"]
            assert {"cpu", "memory"} <= resources["requests"].keys(), where
            assert "memory" in resources["limits"], where


def test_secrets_and_services_that_are_named_exist() -> None:
    secrets = {m["metadata"]["name"]: m["stringData"] for m in manifests() if m["kind"] == "Secret"}
    for deployment in (m for m in manifests() if m["kind"] == "Deployment"):
        for container in containers(deployment["spec"]["template"]["spec"]):
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], variable
    # The store URL of the config names the Redis Service and its port.
    redis = resource("Service", "redis")
    (port,) = redis["spec"]["ports"]
    assert "redis://redis:6379/" in (DEPLOY / "config.yaml").read_text()
    assert port["port"] == 6379


# -- docker compose --------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())
    return data


def compose_errors(document: dict[str, Any]) -> list[str]:
    """What the compose specification's JSON schema (the copy check-jsonschema ships) says
    is wrong with `document`."""
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendored.joinpath("compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def docker_compose() -> list[str]:
    """The Docker Compose command (the plugin, else the old standalone command)."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        found = subprocess.run([*command, "version"], capture_output=True, check=False)
        if found.returncode == 0:
            return command
    raise AssertionError("Docker Compose is needed: neither `docker compose` nor docker-compose")


def test_compose_file_matches_the_compose_specification() -> None:
    assert compose_errors(compose()) == []


# Needs Docker Compose, which the default run does not: `make test-docker` runs it.
@pytest.mark.docker
def test_docker_compose_reads_the_compose_file() -> None:
    checked = subprocess.run(
        [*docker_compose(), "-f", str(DEPLOY / "docker-compose.yaml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("service", "key", "value"),
    [("redis", "restart_policy", "always"), ("prometheus", "ports", "9090:9090")],
    ids=["unknown-key", "wrong-type"],
)
def test_the_compose_check_rejects_a_wrong_file(service: str, key: str, value: str) -> None:
    broken = compose()
    broken["services"][service][key] = value
    errors = compose_errors(broken)
    assert errors and all(key in error for error in errors), errors


def test_compose_runs_two_replicas_on_one_redis_and_prometheus_scrapes_both() -> None:
    built = image()
    services = compose()["services"]
    proxies = {n: s for n, s in services.items() if s.get("image") == "compaction-proxy:local"}
    assert len(proxies) == 2
    for service in proxies.values():
        assert (DEPLOY / service["build"] / "Dockerfile").is_file()
        assert f"./config.yaml:{built['config']}:ro" in service["volumes"]
        assert service["read_only"] is True
        assert service["depends_on"] == {"redis": {"condition": "service_healthy"}}
        assert [p.rsplit(":", 1)[1] for p in service["ports"]] == [str(built["port"])]
    assert "redis" in services

    (mount,) = services["prometheus"]["volumes"]
    local, inside = mount.removesuffix(":ro").split(":")
    assert inside == "/etc/prometheus"
    prometheus = yaml.safe_load((DEPLOY / local / "prometheus.yml").read_text())
    for rules in prometheus["rule_files"]:
        assert (DEPLOY / local / rules).is_file()
    (job,) = prometheus["scrape_configs"]
    (static,) = job["static_configs"]
    assert sorted(static["targets"]) == sorted(f"{name}:{built['port']}" for name in proxies)


# -- the image's build context -----------------------------------------------------------------


def dockerignore_matcher(text: str) -> Callable[[str], bool]:
    """Whether `.dockerignore` keeps a path out of the build context, as Docker reads it
    (moby's patternmatcher): the last pattern that matches the path or one of its parent
    folders decides, `!` re-includes, `**` spans folders, `*` and `?` stay within one."""
    rules: list[tuple[re.Pattern[str], bool]] = []
    for line in text.splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        include = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip().strip("/")
        parts = []
        for piece in re.split(r"(\*\*/?|\*|\?)", pattern):
            if piece in ("**", "**/"):
                parts.append("(?:.*/)?" if piece == "**/" else ".*")
            elif piece == "*":
                parts.append("[^/]*")
            elif piece == "?":
                parts.append("[^/]")
            else:
                parts.append(re.escape(piece))
        rules.append((re.compile("".join(parts)), include))

    def excluded(path: str) -> bool:
        prefixes = ["/".join(path.split("/")[: n + 1]) for n in range(path.count("/") + 1)]
        verdict = False
        for regex, include in rules:
            if any(regex.fullmatch(prefix) for prefix in prefixes):
                verdict = not include
        return verdict

    return excluded


def copied_sources() -> list[str]:
    """Every path a `COPY` of the Dockerfile takes from the build context (not --from a stage)."""
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def test_every_file_the_dockerfile_copies_is_in_the_build_context() -> None:
    excluded = dockerignore_matcher((ROOT / ".dockerignore").read_text())
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    sources = copied_sources()
    assert {"requirements", "proxy", "policies", "config.yaml"} <= {s.rstrip("/") for s in sources}
    for source in sources:
        source = source.rstrip("/")
        files = [f for f in tracked if f == source or f.startswith(source + "/")]
        assert files, f"the Dockerfile copies {source}, which the repository does not have"
        left_out = [f for f in files if excluded(f)]
        assert not left_out, f".dockerignore keeps {left_out[:3]} out of the image's COPY {source}"


def test_the_build_context_matcher_reads_dockerignore_as_docker_does() -> None:
    excluded = dockerignore_matcher("*\n!proxy/\n**/__pycache__\n!requirements*.lock\n")
    assert excluded("requirements/runtime.txt")  # the old defect: a folder the lock moved into
    assert not excluded("requirements.lock")
    assert not excluded("proxy/server/app.py")
    assert excluded("proxy/__pycache__/app.cpython-311.pyc")
    assert excluded(".venv/bin/python") and excluded("README.md")
