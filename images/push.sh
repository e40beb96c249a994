#!/usr/bin/env bash
# Push the images images/build.sh built to a registry without changing their digests; print each digest to pin.
#
#   images/push.sh REGISTRY [runtime|engine|device-plugin|all]      (default: runtime)
#
# REGISTRY is the stack's: on aws the stack output imageRegistry (<account>.dkr.ecr.<region>.amazonaws.com/
# llmfleet-<env>), on kubernetes llmfleet:images.registry. Each image goes to REGISTRY/<image> (runtime, engine,
# nvidia-device-plugin), where the Pulumi program pulls it by digest.
#
# runtime, engine: the OCI layout $BUILD_DIR/<image>.oci, tagged <version>-<first 12 digits of the digest> (ECR
#                  tags are immutable: a new build gets a new tag).
# device-plugin:   NVIDIA's release named in fleet/protocol/contract.py (DEVICE_PLUGIN_SOURCE), every platform, same tag.
#
# skopeo copies with --preserve-digests, so a copy that would change the manifest fails instead; the script then
# reads the pushed manifest back and checks its digest. Log in first (ECR: aws ecr get-login-password | skopeo
# login --username AWS --password-stdin <account>.dkr.ecr.<region>.amazonaws.com).
# Environment: BUILD_DIR (default .build/images). Needs skopeo (Debian: apt-get install -y skopeo).
# Checked against a local registry (Docker's distribution, plain HTTP via registries.conf); not yet run against ECR.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-$ROOT/.build/images}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"

die() { echo "images/push.sh: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: images/push.sh REGISTRY [runtime|engine|device-plugin|all]"
REGISTRY="${1%/}"
WHAT="${2:-runtime}"
case "$WHAT" in runtime|engine|device-plugin|all) ;; *) die "unknown image '$WHAT' (runtime, engine, device-plugin or all)";; esac
command -v skopeo >/dev/null || die "skopeo not found (apt-get install -y skopeo)"

# copy SOURCE DEST DIGEST [skopeo options]: copy unless DEST already holds DIGEST, then check what DEST holds.
copy() {
    local source="$1" dest="$2" digest="$3"
    shift 3
    local manifest
    manifest="$(mktemp)"
    if ! { skopeo inspect --raw "docker://$dest" >"$manifest" 2>/dev/null \
            && [ "$(skopeo manifest-digest "$manifest")" = "$digest" ]; }; then
        skopeo copy --quiet --preserve-digests "$@" "$source" "docker://$dest"
        skopeo inspect --raw "docker://$dest" >"$manifest"
    fi
    local pushed
    pushed="$(skopeo manifest-digest "$manifest")"
    rm -f "$manifest"
    [ "$pushed" = "$digest" ] || die "$dest has digest $pushed, expected $digest"
    echo "$dest  digest $digest"
}

# push_built NAME: the layout images/build.sh exported for NAME.
push_built() {
    local name="$1" layout="$BUILD_DIR/$1.oci" digest
    [ -s "$BUILD_DIR/$name.digest" ] && [ -d "$layout" ] || die "no $layout: run images/build.sh $name first"
    digest="$(cat "$BUILD_DIR/$name.digest")"
    copy "oci:$layout:$VERSION" "$REGISTRY/$name:$VERSION-${digest:7:12}" "$digest"
}

if [ "$WHAT" = runtime ] || [ "$WHAT" = all ]; then push_built runtime; fi
if [ "$WHAT" = engine ] || [ "$WHAT" = all ]; then push_built engine; fi
if [ "$WHAT" = device-plugin ] || [ "$WHAT" = all ]; then
    # fleet.protocol.contract imports nothing outside the standard library: any python3 reads it.
    source_ref="$(python3 -c 'from fleet.protocol.contract import DEVICE_PLUGIN_SOURCE; print(DEVICE_PLUGIN_SOURCE)')"
    named="${source_ref%@*}" digest="${source_ref#*@}"  # repository:tag, sha256:...
    # By digest alone: skopeo takes no reference with both a tag and a digest.
    copy "docker://${named%:*}@$digest" "$REGISTRY/nvidia-device-plugin:${named##*:}" "$digest" --all
fi
