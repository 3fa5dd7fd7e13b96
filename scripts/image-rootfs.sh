#!/bin/sh
# Lays out the container image's whole root filesystem in DIR: the xcc binary, the shared
# libraries it links (each path `ldd` prints, copied to the same path: glibc, libm, libgcc_s and
# the dynamic loader), the CA bundle (the Kubernetes client falls back to system roots when a
# kubeconfig names no CA), the users of distroless (root, nobody, nonroot = 65532) and a
# world-writable /tmp. The image is this tree on `scratch`: no shell, no package manager.
#
# The Containerfile's Rust stage runs it, and so does CI (.ci/image.sh) on the host, so the two
# images hold the same files. Both take the libraries from Debian 12, where the binary was linked.
#
# usage: scripts/image-rootfs.sh BINARY DIR      (DIR must not exist yet)
set -eu
bin=$1
root=$2
if [ -e "$root" ]; then
    echo "$0: $root exists" >&2
    exit 1
fi
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
cp "$bin" "$root/usr/local/bin/xcc"
chmod 0555 "$root/usr/local/bin/xcc"
libs=$(ldd "$bin" | grep -o '/[^ ]*' | sort -u)
if [ -z "$libs" ]; then
    echo "$0: ldd lists no libraries for $bin" >&2
    exit 1
fi
for lib in $libs; do
    cp --dereference --parents "$lib" "$root/"
done
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
