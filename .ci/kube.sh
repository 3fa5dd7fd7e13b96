# Sourced by .ci/run: the real Kubernetes test tier. Unpacks the control plane of
# ../shared/kube (etcd + kube-apiserver + kube-controller-manager) and points the tests at it
# (KUBEBUILDER_ASSETS); XCC_REQUIRE_KUBE=1 makes a test fail, not skip, when it cannot run.
# kubectl (Debian's package) renders deploy/ and applies it with --dry-run=server.
kube_shared="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/shared/kube"
missing=()
command -v kubectl >/dev/null || missing+=(kubectl)
command -v xz >/dev/null || missing+=(xz-utils)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
kube_assets="$(mktemp -d)"
"$kube_shared/control-plane" unpack "$kube_assets"
export KUBEBUILDER_ASSETS="$kube_assets/bin"
export XCC_REQUIRE_KUBE=1
echo "kubernetes tier: $("$KUBEBUILDER_ASSETS/kube-apiserver" --version), $(kubectl version --client 2>/dev/null | head -1)"
