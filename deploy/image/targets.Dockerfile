# syntax=docker/dockerfile:1
# The other two images deploy/compose.yaml runs, made from what `approxy setup` already has
# (build.sh --compose assembles the context). With a registry you would use upstream images
# instead (ghcr.io/ggml-org/llama.cpp:server, prom/prometheus).
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

# llama-server with Qwen2.5-Coder-1.5B-Instruct (Q4_K_M). Built for the CPU of the machine
# that ran `approxy setup` (README, "Which CPUs"): run it on the same kind of CPU.
FROM ${RUNTIME_IMAGE} AS llama-server
RUN useradd --system --no-log-init --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin llama
COPY llama/bin/ /opt/llama/bin/
COPY llama/models/target.gguf /models/target.gguf
ENV LD_LIBRARY_PATH=/opt/llama/bin
USER 10001:10001
EXPOSE 8081
ENTRYPOINT ["/opt/llama/bin/llama-server"]
CMD ["-m", "/models/target.gguf", "--alias", "qwen2.5-coder-1.5b-instruct", "--host", "0.0.0.0", "--port", "8081", "-c", "8192", "-np", "2", "-t", "2", "--cache-ram", "0", "--metrics"]

# Debian's Prometheus (the same sha256-pinned binary the tests use).
FROM ${RUNTIME_IMAGE} AS prometheus
COPY prometheus/prometheus /usr/local/bin/prometheus
USER 65534:65534
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/tmp/prometheus"]
