# The spate broker and spate-operator images. Built offline by scripts/image.sh, which is the
# way to build them (see docs/container-image.md):
#   scripts/image.sh                 # -> localhost/spate:<version>, localhost/spate-operator:<version>
# The build context is not the repository but a directory image.sh fills: the two release
# binaries (built on the host with cargo, debug info stripped) and scripts/image/rootfs.sh.
# BASE is a Debian minbase image image.sh makes with debootstrap and imports (no registry is
# needed or reachable); it is only a build stage, never shipped.
#
# Both images are FROM scratch: the binary, the glibc libraries it links (from BASE, so they
# match the release the binary was built against), /etc/passwd with uid 10001, and for the
# broker /bin/sh. glibc rather than a static musl build: spate allocates through the system
# allocator, and musl's is much slower under many threads; a second (musl) toolchain and
# build would also double the build. The images hold no package manager and no setuid files.
ARG BASE=spate-base:bookworm

FROM ${BASE} AS rootfs
COPY rootfs.sh spate spate-operator /build/
# The broker keeps a shell: the Helm chart's StatefulSet and the operator's pods start it with
# `/bin/sh -c` (node id from the pod's ordinal, peers from the headless Service's names, then
# `exec spate`, so spate is pid 1 and receives the engine's SIGTERM itself).
RUN sh /build/rootfs.sh /out/spate /build/spate --shell --data-dir /var/lib/spate \
    && mkdir -p /out/spate/etc/spate \
    && sh /build/rootfs.sh /out/operator /build/spate-operator --ca-certificates

FROM scratch AS spate
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="spate" \
      org.opencontainers.image.description="Kafka-wire-compatible event-streaming broker" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=rootfs /out/spate/ /
USER 10001:10001
WORKDIR /var/lib/spate
EXPOSE 9092 9093 9644
ENTRYPOINT ["/usr/local/bin/spate"]
# spate's own defaults listen on loopback, which nobody outside the container reaches. Flags,
# not ENV: an environment variable would override the chart's config file (flags > env >
# file); and Kubernetes drops CMD when a pod sets `command`, as the chart and operator do.
CMD ["--listen", "0.0.0.0:9092", "--http-listen", "0.0.0.0:9644", "--data-dir", "/var/lib/spate/data"]

FROM scratch AS operator
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="spate-operator" \
      org.opencontainers.image.description="Kubernetes operator for spate clusters" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=rootfs /out/operator/ /
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/spate-operator"]
CMD ["run"]
