#!/usr/bin/env bash
# Sourced by .ci/run: makes the Go Hamlet reference peers (../shared/hamlet-reference, built from
# vmware/hamlet) runnable for the interop tests in registry/tests/it/hamlet_interop.rs, and exports
# XCC_HAMLET_REFERENCE naming the directory that holds them. Any failure here fails CI: with the
# variable set, the interop tests fail rather than skip when a peer cannot run.
set -euo pipefail

hamlet_ref_src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shared/hamlet-reference"
if [ ! -d "$hamlet_ref_src/bin" ]; then
    echo "hamlet.sh: $hamlet_ref_src/bin is missing (the shared folder must sit beside the clone)" >&2
    exit 1
fi
if ! command -v xz >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq xz-utils >/dev/null
fi
(cd "$hamlet_ref_src/bin" && sha256sum --quiet -c SHA256SUMS)
hamlet_ref_dir="$(mktemp -d "${TMPDIR:-/tmp}/xcc-hamlet-ref.XXXXXX")"
for peer in hamlet-go-fileserver hamlet-go-jsonclient; do
    xz -dc "$hamlet_ref_src/bin/$peer.xz" >"$hamlet_ref_dir/$peer"
    chmod +x "$hamlet_ref_dir/$peer"
    # `-h` prints the flags and exits 0: proof that the binary runs on this machine.
    if ! "$hamlet_ref_dir/$peer" -h >/dev/null 2>&1; then
        echo "hamlet.sh: $peer does not run here" >&2
        exit 1
    fi
done
export XCC_HAMLET_REFERENCE="$hamlet_ref_dir"
echo "hamlet reference peers: $XCC_HAMLET_REFERENCE"
