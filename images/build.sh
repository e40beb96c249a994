#!/usr/bin/env bash
# Build llmfleet's container images with buildah, without Docker or a registry; print each image's digest.
#
#   images/build.sh [runtime|engine|all]      (default: runtime; `make images` runs it)
#
# runtime: images/runtime.Dockerfile. Its base is a Debian bookworm made here with debootstrap (python3 3.11,
#          cached as a tarball under $BUILD_DIR), unless RUNTIME_BASE names another (e.g. the public slim image).
# engine:  images/engine.Dockerfile on vLLM's published image; needs a registry that serves it.
#
# Each image is exported as an OCI layout, $BUILD_DIR/<image>.oci (layers compressed as a registry stores
# them). The digest printed is that layout's manifest digest: `images/push.sh` copies the layout without
# changing a byte, so it is the digest the stack pins (llmfleet:images.runtimeDigest / engineDigest).
#
# Environment: BUILD_DIR (default .build/images), RUNTIME_BASE, ENGINE_BASE, CA_BUNDLE (a CA bundle for pip
# inside the build, default the host's; set it empty to mount none), DEBIAN_MIRROR (for debootstrap).
# Needs root, buildah, podman and debootstrap (Debian: apt-get install -y buildah podman debootstrap).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-$ROOT/.build/images}"
CA_BUNDLE="${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
LOCAL_BASE="localhost/llmfleet-base:bookworm"
WHAT="${1:-runtime}"

die() { echo "images/build.sh: $*" >&2; exit 1; }

case "$WHAT" in runtime|engine|all) ;; *) die "unknown image '$WHAT' (runtime, engine or all)";; esac
[ "$(id -u)" = "0" ] || die "needs root (buildah's chroot isolation)"
for tool in buildah podman; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y buildah podman debootstrap)"
done
mkdir -p "$BUILD_DIR"

# A Debian bookworm root filesystem with python3 (3.11) and CA certificates, trimmed of package caches and
# docs, imported as $LOCAL_BASE. The tarball is kept, so later builds only re-import it when it is missing.
local_base() {
    local tarball="$BUILD_DIR/base-bookworm.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install -y debootstrap)"
        local rootfs="$BUILD_DIR/rootfs.tmp"
        rm -rf "$rootfs"
        echo "debootstrap: bookworm minbase with python3 into $rootfs" >&2
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$rootfs" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$BUILD_DIR/debootstrap.log" 2>&1 \
            || die "debootstrap failed; see $BUILD_DIR/debootstrap.log"
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
            "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
        tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
        podman rmi --force "$LOCAL_BASE" >/dev/null 2>&1 || true
    fi
    if ! podman image exists "$LOCAL_BASE"; then
        podman import --quiet "$tarball" "$LOCAL_BASE" >/dev/null
    fi
    echo "$LOCAL_BASE"
}

# build NAME BASE: build images/NAME.Dockerfile FROM BASE as localhost/llmfleet-NAME:VERSION, export, report.
build() {
    local name="$1" base="$2"
    local tag="localhost/llmfleet-$name:$VERSION" layout="$BUILD_DIR/$name.oci"
    local args=(--layers --isolation chroot --build-arg "BASE=$base" -f "images/$name.Dockerfile" -t "$tag")
    if [ -n "$CA_BUNDLE" ] && [ -f "$CA_BUNDLE" ]; then
        # pip inside the build trusts the host's CAs (a TLS-inspecting proxy's CA is often only there).
        args+=(-v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
    fi
    local started=$SECONDS
    buildah bud "${args[@]}" --iidfile "$BUILD_DIR/$name.iid" . >"$BUILD_DIR/$name.build.log" 2>&1 \
        || { tail -n 40 "$BUILD_DIR/$name.build.log" >&2; die "building $name failed; see $BUILD_DIR/$name.build.log"; }
    rm -rf "$layout"
    buildah push --quiet --format oci "$tag" "oci:$layout:$VERSION" >/dev/null
    local digest
    digest="$(grep -o '"digest":"sha256:[0-9a-f]\{64\}"' "$layout/index.json" | head -n 1 | cut -d'"' -f4)"
    [ -n "$digest" ] || die "no manifest digest in $layout/index.json"
    echo "$digest" >"$BUILD_DIR/$name.digest"
    echo "$name: $tag  id $(cat "$BUILD_DIR/$name.iid")  digest $digest  ($((SECONDS - started)) s)"
}

if [ "$WHAT" = runtime ] || [ "$WHAT" = all ]; then
    build runtime "${RUNTIME_BASE:-$(local_base)}"
fi
if [ "$WHAT" = engine ] || [ "$WHAT" = all ]; then
    build engine "${ENGINE_BASE:-docker.io/vllm/vllm-openai:v$(sed -n 's/.*"vllm==\([^"]*\)".*/\1/p' pyproject.toml)}"
fi
echo "Pin them: llmfleet:images.<image>Digest in stacks/Pulumi.<env>.yaml, or"
echo "  pulumi config set --path 'llmfleet:images.runtimeDigest' \"\$(cat $BUILD_DIR/runtime.digest)\" -s <env>"
