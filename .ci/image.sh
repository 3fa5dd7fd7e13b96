#!/usr/bin/env bash
# CI: build the container image from the current tree without any registry, then run it the
# way deploy/ runs it (non-root, read-only root filesystem, no capabilities). Any failure fails CI.
#
# The Containerfile's Rust stage starts from an official Rust image, which CI cannot pull, so
# the same steps run here on the host (Debian 12, like that image): the binary with the cargo
# profile `image`, its tree with scripts/image-rootfs.sh, then the Containerfile's `prebuilt`
# target on the same `scratch` base. Called from .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# The image's budget, in podman's units (1 MB = 10^6 bytes); docs/image.md has the
# measured size.
max_bytes=$((40 * 1000 * 1000))
tag=localhost/xcc:ci

echo "== image: podman + runc"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends podman runc >/dev/null
export CONTAINERS_CONF="$PWD/.ci/containers.conf"
podman --version

echo "== image: binary (cargo profile \`image\`) and the image's tree"
cargo build --locked --profile image --bin xcc
bin=target/image/xcc
if readelf --section-headers "$bin" | grep '\.symtab' >/dev/null; then
    echo "$bin is not stripped" >&2
    exit 1
fi
rm -rf target/image/rootfs
scripts/image-rootfs.sh "$bin" target/image/rootfs

work=$(mktemp -d)
# The image is rebuilt on every run: drop it rather than pile copies up on the machine.
# XCC_IMAGE_ARCHIVE: also save the image there for the real-nodes tier (.ci/nodes.sh), named as
# deploy/ names it without a registry: docker.io/library/xcc:<crate version>.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
deploy_tag=docker.io/library/xcc:$version
trap 'rm -rf "$work"; podman rmi --force "$tag" "$deploy_tag" >/dev/null 2>&1 || true' EXIT

echo "== image: build (target prebuilt; --pull=never: no registry)"
podman build --pull=never --target prebuilt -f Containerfile -t "$tag" .

size=$(podman image inspect --format '{{.Size}}' "$tag")
user=$(podman image inspect --format '{{.Config.User}}' "$tag")
echo "image $tag: $size bytes, user $user"
[ "$size" -le "$max_bytes" ] || { echo "image is $size bytes, over $max_bytes" >&2; exit 1; }
[ "$user" = 65532:65532 ] || { echo "image user is '$user', not 65532:65532" >&2; exit 1; }

echo "== image: contents (no shell)"
ctr=$(podman create "$tag")
podman export "$ctr" | tar -t >"$work/files"
podman rm "$ctr" >/dev/null
cat "$work/files"
if grep -E '(^|/)(ba|da)?sh$' "$work/files"; then
    echo "the image has a shell" >&2
    exit 1
fi

# deploy/'s pod security: read-only root filesystem (podman then mounts a tmpfs on /tmp, where
# the demo keeps its PKI and state; deploy/ mounts an emptyDir there), no capabilities, no
# privilege escalation. No network: the demo talks to itself over loopback.
run=(podman run --rm --network none --read-only --cap-drop all
    --security-opt no-new-privileges)

echo "== image: xcc --version (as the image's user)"
"${run[@]}" "$tag" --version

echo "== image: xcc demo (as user 65534)"
"${run[@]}" --user 65534:65534 "$tag" demo
echo "image ok: $tag, $size bytes"

if [ -n "${XCC_IMAGE_ARCHIVE:-}" ]; then
    podman tag "$tag" "$deploy_tag"
    podman save -o "$XCC_IMAGE_ARCHIVE" "$deploy_tag"
    echo "saved as $deploy_tag in $XCC_IMAGE_ARCHIVE"
fi
