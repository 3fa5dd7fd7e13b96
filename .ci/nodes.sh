#!/usr/bin/env bash
# CI: the real-nodes tier (tests/nodes/tier.sh): two clusters with one real node each
# (../shared/kube/node: containerd, runc, CNI bridge, kubelet, kube-proxy), the image .ci/image.sh
# built (XCC_IMAGE_ARCHIVE) loaded into both, xcc installed from deploy/ as deploy/README.md says,
# and requests from a pod in one cluster to a pod in the other, by name. Required: a missing
# piece fails CI. Called from .ci/run after .ci/image.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== real nodes: packages"
# What ../shared/kube/node needs (its README); gcc + libc6-dev build its pause binary and the
# tier's static UDP server/client (tests/nodes/udp.c).
pkgs=(containerd runc containernetworking-plugins iptables iproute2 util-linux python3 xz-utils
    curl busybox-static gcc libc6-dev openssl)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "== real nodes: tier"
# target/image/xcc: the image's own binary, for `xcc certs` on the "workstation" (the host).
XCC_REQUIRE_NODES=1 XCC_BIN="$PWD/target/image/xcc" tests/nodes/tier.sh
