# syntax=docker/dockerfile:1
# Multi-stage build of the spate broker and the spate-operator images:
#   docker build --target spate -t spate:0.1.0 .
#   docker build --target operator -t spate-operator:0.1.0 .
# Both run as uid 10001 (non-root).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spate-server -p spate-operator \
        --bin spate --bin spate-operator \
    && mkdir -p /out \
    && cp target/release/spate target/release/spate-operator /out/ \
    && strip /out/spate /out/spate-operator

# spate needs /bin/sh: the StatefulSet's entrypoint derives the node id and peers from the
# pod's name. Debian slim rather than distroless for that shell.
FROM debian:bookworm-slim AS spate
RUN groupadd -g 10001 spate && useradd -u 10001 -g 10001 -M -d /var/lib/spate spate \
    && mkdir -p /var/lib/spate /etc/spate && chown 10001:10001 /var/lib/spate
COPY --from=build /out/spate /usr/local/bin/spate
USER 10001:10001
WORKDIR /var/lib/spate
EXPOSE 9092 9093 9644
ENTRYPOINT ["/usr/local/bin/spate"]

FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/spate-operator /usr/local/bin/spate-operator
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/spate-operator"]
CMD ["run"]
