# syntax=docker/dockerfile:1
# rustle's container image, built from the repository's root:
#   docker build -t rustle .
#   docker run --rm -p 3128:3128 -p 1080:1080 -p 9090:9090 rustle
# It runs as a user without privileges (65532) with the configuration at
# /etc/rustle/rustle.toml (contrib/docker/rustle.toml; mount your own over it). Kubernetes:
# contrib/kubernetes/.

# The toolchain the project is built and tested with.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target directories are caches of the builder (BuildKit), so a rebuild
# after a change compiles only what changed; the binary is copied out of the cache.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rustle \
    && install -D -m 0755 target/release/rustle /out/rustle \
    && /out/rustle check --no-bind --config contrib/docker/rustle.toml

# glibc, libgcc and CA certificates (TLS towards origins), no shell, no package manager;
# Debian 12, as the builder.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/rustle /usr/local/bin/rustle
COPY contrib/docker/rustle.toml /etc/rustle/rustle.toml
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
# HTTP and SOCKS (auto), SOCKS, admin (metrics, /healthz, /readyz).
EXPOSE 3128 1080 9090
# Reads /etc/rustle/rustle.toml; arguments are rustle's (`docker run rustle check`).
ENTRYPOINT ["/usr/local/bin/rustle"]
