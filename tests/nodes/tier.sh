#!/usr/bin/env bash
# The real-nodes tier: xcc installed from deploy/ as pods on two clusters with real
# nodes, and requests that cross by name. No xcc host process: `xcc certs` is the only xcc
# command run on the host (a workstation tool in deploy/README.md).
#
#   tests/nodes/tier.sh            (root; run from anywhere)
#
# Two control planes (../shared/kube/control-plane) with one node each (../shared/kube/node):
# `east` exports, `west` imports, as in deploy/README.md, whose `<!-- step: NAME -->` blocks
# are run here as written (`step NAME`), so the document is what is tested. Then traffic from a
# busybox client pod in west, resolved by `xcc dns` (deploy/dns) as the pod's nameserver, and
# the changes of the issue: server pod replaced, exporting registry away and back, binder
# restarted, certificate Secret replaced in place, an HTTPProxy export, unexport; then MCS mode
# on both clusters (a ServiceExport's ServiceImport IP, a headless export's per-pod names), and
# both ways: one service exported and imported by both clusters, TCP and UDP per port and DNS
# (A, AAAA, SRV) asked from a pod in each; then a CA rotation of both registries' Secrets in place.
# Every xcc container is checked for its uid, capabilities and read-only root, and at the end
# for 0 restarts. Every wait is on an event or a bounded re-check (`eventually`, see there).
#
# Env:
#   XCC_IMAGE_ARCHIVE   the image as an archive (podman save) tagged docker.io/library/xcc:<crate
#                       version>, e.g. from .ci/image.sh (XCC_IMAGE_ARCHIVE set there too)
#   XCC_BIN             a host xcc binary for `xcc certs` (default target/image/xcc, else
#                       target/debug/xcc)
#   XCC_KUBE_SHARED     the directory with control-plane and node (default ../shared/kube next
#                       to the repository)
#   XCC_REQUIRE_NODES=1 fail, not skip, when something the tier needs is missing (CI sets it)
#   XCC_NODES_KEEP=1    leave the work directory (logs) behind; clusters are always torn down
#   XCC_NODES_POD_CIDRS the two pod CIDRs (default "10.244.41.0/24 10.244.42.0/24")
#   XCC_NODES_BENCH=N   also measure N exports and N pod replacements (docs/benchmarks.md)
#   XCC_NODES_ROLLOUT   how the bench replaces the server pod: surge (default) or recreate
#   XCC_NODES_TRACE=DIR with XCC_NODES_BENCH: keep a packet capture, conntrack's events,
#                       kube-proxy's log and iptables-save of west's node during the exports
#   TMPDIR              where the work directory (clusters, nodes, containerd) goes (default
#                       /tmp); the kubelets evict pods when its filesystem has under 1% free
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$REPO/tests/nodes"
t0=$(date +%s%N)
ms() { echo $(( $(date +%s%N) / 1000000 )); }
elapsed() { echo "$(( ($(date +%s%N) - t0) / 1000000000 )) s"; }
say() { echo "nodes tier [$(elapsed)]: $*"; }

unavailable() {
  if [ "${XCC_REQUIRE_NODES:-}" = 1 ]; then
    echo "nodes tier: FAIL (XCC_REQUIRE_NODES=1): $*" >&2
    exit 1
  fi
  echo "nodes tier: SKIPPED: $* (set XCC_REQUIRE_NODES=1 to make this a failure)"
  exit 0
}
[ "$(id -u)" = 0 ] || unavailable "needs root (containerd, network namespaces)"
KUBE_SHARED=${XCC_KUBE_SHARED:-$REPO/../shared/kube}
[ -x "$KUBE_SHARED/node" ] && [ -x "$KUBE_SHARED/control-plane" ] ||
  unavailable "no control-plane/node scripts in $KUBE_SHARED (set XCC_KUBE_SHARED)"
for c in kubectl openssl python3 containerd runc iptables ip nsenter xz curl busybox gcc; do
  command -v "$c" >/dev/null || unavailable "needs $c (see .ci/nodes.sh for the packages)"
done
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)
IMAGE=docker.io/library/xcc:$VERSION
[ -n "${XCC_IMAGE_ARCHIVE:-}" ] && [ -f "$XCC_IMAGE_ARCHIVE" ] ||
  unavailable "XCC_IMAGE_ARCHIVE does not name an image archive (.ci/image.sh writes one)"
XCC_BIN=${XCC_BIN:-}
if [ -z "$XCC_BIN" ]; then
  for b in "$REPO/target/image/xcc" "$REPO/target/debug/xcc"; do
    [ -x "$b" ] && { XCC_BIN=$b; break; }
  done
fi
[ -n "$XCC_BIN" ] && [ -x "$XCC_BIN" ] || unavailable "no xcc binary for \`xcc certs\` (XCC_BIN)"
read -r CIDR_EAST CIDR_WEST <<<"${XCC_NODES_POD_CIDRS:-10.244.41.0/24 10.244.42.0/24}"

W=$(mktemp -d "${TMPDIR:-/tmp}/xcc-nodes.XXXXXX")
mkdir -p "$W/bin" "$W/xt"
ln -s "$XCC_BIN" "$W/bin/xcc"
ln -s "$REPO/deploy" "$W/deploy"
export PATH="$W/bin:$PATH"
export KUBECONFIG="$W/kubeconfig"
RELAYS=()
fail=0
cleanup() {
  local rc=$?
  set +e
  if [ $rc != 0 ] || [ $fail != 0 ]; then
    for c in east west; do
      echo "---- $c: pods"
      kubectl --context $c get pods -A -o wide 2>&1 | head -40
      for d in xcc-registry xcc-publisher xcc-binder xcc-dns; do
        kubectl --context $c -n cross-cluster-connectivity logs deployment/$d --tail=30 2>/dev/null |
          sed "s/^/$c $d: /"
      done
    done
  fi
  for pid in "${RELAYS[@]}"; do kill "$pid" 2>/dev/null; done
  "$KUBE_SHARED/node" down "$W/n-east" >/dev/null 2>&1
  "$KUBE_SHARED/node" down "$W/n-west" >/dev/null 2>&1
  "$KUBE_SHARED/control-plane" down "$W/cp-east" >/dev/null 2>&1
  "$KUBE_SHARED/control-plane" down "$W/cp-west" >/dev/null 2>&1
  if [ "${XCC_NODES_KEEP:-}" = 1 ]; then echo "nodes tier: work directory kept: $W"; else rm -rf "$W"; fi
  echo "nodes tier: $(elapsed) in all"
  exit $rc
}
trap cleanup EXIT
# The UDP server and client of the pods (tests/nodes/udp.c), static: busybox pods mount it.
gcc -static -O2 -o "$W/xt/udp" "$HERE/udp.c" || unavailable "cannot build tests/nodes/udp.c (gcc, libc6-dev)"

die() { echo "nodes tier: FAIL: $*" >&2; fail=1; exit 1; }
check() { # name expected actual
  if [ "$2" = "$3" ]; then say "PASS $1"; else say "FAIL $1: want '$2', got '$3'"; fail=1; fi
}
# A bounded re-check, for what a shell cannot wait on as one event: state that appears in the
# other cluster, a kubelet's volume refresh, kube-proxy programming a node's iptables.
eventually() { # seconds command...: true once command succeeds, false after seconds
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt $deadline ] || return 1
    sleep 0.2
  done
}

# The deploy/README.md block after `<!-- step: NAME -->`, run here in this shell (variables
# it sets stay set), from the work directory (deploy -> the repository's deploy/).
step() {
  local block
  block=$(awk -v m="<!-- step: $1 -->" '
    $0 == m { want = 1; next }
    want && /^```sh$/ { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' "$REPO/deploy/README.md")
  [ -n "$block" ] || die "deploy/README.md has no block '<!-- step: $1 -->'"
  say "deploy/README.md step '$1'"
  # In this shell (set -e: a failing command fails the tier), so what it sets stays set.
  pushd "$W" >/dev/null
  eval "$block"
  popd >/dev/null
}

# ---- two clusters, one real node each -----------------------------------------------------
say "control planes"
"$KUBE_SHARED/control-plane" up "$W/cp-east" --gc >/dev/null &
up1=$!
CP_SERVICE_CIDR=10.97.0.0/16 "$KUBE_SHARED/control-plane" up "$W/cp-west" --gc >/dev/null &
up2=$!
wait $up1 || die "control plane east did not start"
wait $up2 || die "control plane west did not start"

# One kubeconfig with the contexts deploy/README.md names.
for c in east west; do
  server=$(kubectl --kubeconfig "$W/cp-$c/kubeconfig" config view --raw -o jsonpath='{.clusters[0].cluster.server}')
  token=$(kubectl --kubeconfig "$W/cp-$c/kubeconfig" config view --raw -o jsonpath='{.users[0].user.token}')
  kubectl config set-cluster $c --server="$server" --certificate-authority="$W/cp-$c/pki/ca.crt" --embed-certs >/dev/null
  kubectl config set-credentials $c-admin --token="$token" >/dev/null
  kubectl config set-context $c --cluster=$c --user=$c-admin >/dev/null
done

say "nodes"
"$KUBE_SHARED/node" up "$W/n-east" --kubeconfig "$W/cp-east/kubeconfig" --name node-east --pod-cidr "$CIDR_EAST" >/dev/null ||
  die "node east did not come up"
"$KUBE_SHARED/node" up "$W/n-west" --kubeconfig "$W/cp-west/kubeconfig" --name node-west --pod-cidr "$CIDR_WEST" >/dev/null ||
  die "node west did not come up"

# Pods reach the API server (../shared/kube/README.md): the serving certificate re-issued with
# the `kubernetes` Service IP and the node-facing address, a relay from that address to the
# loopback one, and the `kubernetes` endpoints pointing at it.
api_for_pods() { # cluster service-ip
  local c=$1 svc_ip=$2 node_ip host_ip port pki="$W/cp-$1/pki"
  node_ip=$(kubectl --context $c get node node-$c -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
  host_ip=${node_ip%.2}.1
  port=$(kubectl config view -o jsonpath="{.clusters[?(@.name==\"$c\")].cluster.server}")
  port=${port##*:}
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
    "$svc_ip" "$host_ip" >"$pki/pods-san.cnf"
  openssl req -new -key "$pki/apiserver.key" -subj /CN=kube-apiserver -out "$pki/pods.csr" 2>/dev/null
  openssl x509 -req -in "$pki/pods.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/pods-san.cnf" -out "$pki/apiserver.crt.new" 2>/dev/null
  mv "$pki/apiserver.crt.new" "$pki/apiserver.crt"
  python3 "$HERE/relay.py" "$host_ip" "$port" >"$W/relay-$c.log" 2>&1 &
  RELAYS+=($!)
  kubectl --context $c apply -f - >/dev/null <<YAML
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-nodes-tier
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: nodes-tier.xcc.test}
addressType: IPv4
ports: [{name: https, port: $port, protocol: TCP}]
endpoints: [{addresses: ["$host_ip"], conditions: {ready: true}}]
---
apiVersion: v1
kind: Endpoints
metadata:
  name: kubernetes
  namespace: default
  labels: {endpointslice.kubernetes.io/skip-mirror: "true"}
subsets: [{addresses: [{ip: "$host_ip"}], ports: [{name: https, port: $port, protocol: TCP}]}]
YAML
}
api_for_pods east 10.96.0.1
api_for_pods west 10.97.0.1

say "images"
"$KUBE_SHARED/node" images "$W/n-east" "$XCC_IMAGE_ARCHIVE" >/dev/null || die "image import (east)"
"$KUBE_SHARED/node" images "$W/n-west" "$XCC_IMAGE_ARCHIVE" >/dev/null || die "image import (west)"
for n in n-east n-west; do
  "$KUBE_SHARED/node" ctr "$W/$n" images ls -q | grep -x "$IMAGE" >/dev/null ||
    die "$XCC_IMAGE_ARCHIVE holds no $IMAGE (what deploy/ names)"
done
for c in east west; do
  eventually 30 kubectl --context $c get serviceaccount default || die "no default ServiceAccount in $c"
done

# east runs "Contour" for the HTTPProxy export: its CRD, and the ingress Service the publisher
# reads (its load-balancer address, set by hand: no Contour data plane here, objects only).
kubectl --context east apply --server-side -f "$KUBE_SHARED/crds/projectcontour.io_httpproxies.yaml" >/dev/null
kubectl --context east create namespace projectcontour >/dev/null
kubectl --context east -n projectcontour apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: envoy, namespace: projectcontour}
spec:
  type: LoadBalancer
  selector: {app: envoy}
  ports: [{name: https, port: 443, targetPort: 8443}]
YAML
kubectl --context east -n projectcontour patch service envoy --subresource=status --type=merge \
  -p '{"status":{"loadBalancer":{"ingress":[{"ip":"10.250.200.1"}]}}}' >/dev/null

# ---- deploy/README.md, step by step ---------------------------------------------------------
step certificates
step exporter
step registry-address
say "east's registry: $EAST_REGISTRY"
step importer
step remote-registry

# ---- what deploy/ runs is what it says --------------------------------------------------------
# Each xcc container, from the node's side: uid/gid 65532, no capabilities, read-only root.
pods_as_deployed() { # node-dir cluster
  local n=$1 c=$2 id pid count=0
  while read -r id img; do
    [ "$img" = "$IMAGE" ] || continue
    pid=$("$KUBE_SHARED/node" ctr "$W/$n" tasks ls | awk -v id="$id" '$1 == id && $3 == "RUNNING" { print $2 }')
    [ -n "$pid" ] || continue
    count=$((count + 1))
    check "$c container ${id:0:12}: uid" "65532 65532 65532 65532" \
      "$(awk '/^Uid:/ { print $2, $3, $4, $5 }' /proc/$pid/status)"
    check "$c container ${id:0:12}: effective/permitted capabilities" "0000000000000000 0000000000000000" \
      "$(awk '/^CapEff:/ { e = $2 } /^CapPrm:/ { p = $2 } END { print e, p }' /proc/$pid/status)"
    check "$c container ${id:0:12}: root filesystem read-only" ro \
      "$(awk '$5 == "/" { split($6, o, ","); print o[1]; exit }' /proc/$pid/mountinfo)"
  done < <("$KUBE_SHARED/node" ctr "$W/$n" containers ls | awk 'NR > 1 { print $1, $2 }')
  say "$c: $count xcc containers checked"
}
pods_as_deployed n-east east
pods_as_deployed n-west west

# ---- an exported NodePort Service in east, a client in west -----------------------------------
# An HTTP server pod answering "east <name>". With a preStop delay (seconds), as deploy/README.md
# advises for rollouts: deleted, it keeps serving that long while the kube-proxies (and, for an
# MCS export, xcc) drop its address, then stops at once on SIGTERM.
web_pod() { # name [preStop seconds]
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: shop, labels: {app: web}}
spec:
  terminationGracePeriodSeconds: $(( ${2:-0} + 1 ))
  containers:
  - name: httpd
    image: localhost/busybox:1
    imagePullPolicy: Never
    command:
    - sh
    - -c
    - |
      mkdir -p /www && echo east $1 > /www/index.html
      httpd -f -p 8080 -h /www &
      trap 'kill \$!; exit 0' TERM
      wait
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
YAML
  if [ "${2:-0}" -gt 0 ]; then echo "    lifecycle: {preStop: {sleep: {seconds: $2}}}"; fi
}
kubectl --context east create namespace shop >/dev/null
{ web_pod web-1; cat <<YAML; } | kubectl --context east apply -f - >/dev/null
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  annotations: {connectivity.tanzu.vmware.com/fqdn: web.xcc.test}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
kubectl --context east -n shop wait --for=condition=Ready pod/web-1 --timeout=60s >/dev/null || die "web-1 not Ready"

DNS_IP=$(kubectl --context west -n cross-cluster-connectivity get service xcc-dns -o jsonpath='{.spec.clusterIP}')
kubectl --context west apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  dnsPolicy: None
  dnsConfig: {nameservers: ["$DNS_IP"], options: [{name: ndots, value: "1"}]}
  containers:
  - name: client
    image: localhost/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "100000"]
YAML
kubectl --context west wait --for=condition=Ready pod/client --timeout=60s >/dev/null || die "client not Ready"
get() { # url: the page, from the client pod in west
  kubectl --context west exec client -- timeout 5 wget -qO- "$1" 2>/dev/null
}
answers() { # url expected
  [ "$(get "$1")" = "$2" ]
}
resolves() { # name: true when xcc dns answers it with an address
  kubectl --context west exec client -- nslookup "$1" "$DNS_IP" 2>/dev/null | grep '^Address: [0-9]' >/dev/null
}
imported_services() { # the binder's Services in west: name=fqdn, sorted
  kubectl --context west -n cross-cluster-connectivity get services -l app.kubernetes.io/managed-by=xcc-binder \
    -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.connectivity\.tanzu\.vmware\.com/fqdn}{"\n"}{end}' | sort
}

step export
t=$(ms)
eventually 60 answers http://web.xcc.test/ "east web-1" || true
check "west's client gets east's page at the export's FQDN (web.xcc.test)" "east web-1" "$(get http://web.xcc.test/)"
say "export -> first page in west: $(( $(ms) - t )) ms"
check "... and at web.shop.svc.clusterset.local" "east web-1" "$(get http://web.shop.svc.clusterset.local/)"
check "xcc dns answers web.xcc.test with an address" yes "$(resolves web.xcc.test && echo yes || echo no)"
step import
IMPORTED=$(imported_services)
check "the binder's Service is named after the FQDN, which is its annotation" \
  "web-xcc-test-$(printf %s "$IMPORTED" | sed -n 's/^web-xcc-test-\([0-9a-f]\{8\}\)=.*/\1/p')=web.xcc.test" "$IMPORTED"

# ---- a labelled HTTPProxy: west gets the record and the binder's objects ------------------
kubectl --context east -n shop apply -f - >/dev/null <<YAML
apiVersion: projectcontour.io/v1
kind: HTTPProxy
metadata:
  name: web-proxy
  namespace: shop
  labels: {connectivity.tanzu.vmware.com/export: ""}
spec:
  virtualhost: {fqdn: www.shop.xcc.test}
  routes: [{services: [{name: web, port: 80}]}]
YAML
proxy_slice() { # the addresses of the binder's EndpointSlices for the proxy's Service in west
  kubectl --context west -n cross-cluster-connectivity get endpointslices \
    -l kubernetes.io/service-name="$(imported_services | sed -n 's/=www.shop.xcc.test$//p')" \
    -o jsonpath='{range .items[*].endpoints[*]}{.addresses[0]}{end}{" "}{range .items[*].ports[*]}{.port}{end}'
}
proxy_imported() { [ "$(proxy_slice)" = "10.250.200.1 443" ]; }
eventually 60 proxy_imported || true
check "an exported HTTPProxy: west's binder Service for www.shop.xcc.test points at east's ingress" \
  "10.250.200.1 443" "$(proxy_slice)"

# ---- the server pod replaced (new IP) -----------------------------------------------------
OLD_IP=$(kubectl --context east -n shop get pod web-1 -o jsonpath='{.status.podIP}')
kubectl --context east -n shop delete pod web-1 --wait=true >/dev/null
web_pod web-2 3 | kubectl --context east apply -f - >/dev/null
kubectl --context east -n shop wait --for=condition=Ready pod/web-2 --timeout=60s >/dev/null || die "web-2 not Ready"
NEW_IP=$(kubectl --context east -n shop get pod web-2 -o jsonpath='{.status.podIP}')
[ "$OLD_IP" != "$NEW_IP" ] || say "note: web-2 got web-1's address $OLD_IP"
t=$(ms)
eventually 30 answers http://web.xcc.test/ "east web-2" || true
check "the server pod replaced ($OLD_IP -> $NEW_IP): west reaches the new pod" "east web-2" "$(get http://web.xcc.test/)"
say "pod replaced -> first page from the new pod: $(( $(ms) - t )) ms"

# ---- the exporting registry restarted: west keeps serving, and resyncs ------------------------
say "east's registry scaled to 0"
kubectl --context east -n cross-cluster-connectivity scale deployment/xcc-registry --replicas=0 >/dev/null
kubectl --context east -n cross-cluster-connectivity wait --for=delete pod -l app.kubernetes.io/name=xcc-registry --timeout=60s >/dev/null
check "while east has no registry, west still serves the import" "east web-2" "$(get http://web.xcc.test/)"
# A second export while it is away: west has it once the registry is back and resynced.
kubectl --context east -n shop apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata:
  name: web2
  namespace: shop
  labels: {connectivity.tanzu.vmware.com/export: ""}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
YAML
kubectl --context east -n cross-cluster-connectivity scale deployment/xcc-registry --replicas=1 >/dev/null
kubectl --context east -n cross-cluster-connectivity rollout status deployment/xcc-registry --timeout=120s >/dev/null ||
  die "east's registry did not come back"
eventually 60 answers http://web2.shop.svc.clusterset.local/ "east web-2" || true
check "after east's registry is back, west has what was exported meanwhile" "east web-2" \
  "$(get http://web2.shop.svc.clusterset.local/)"
check "... and still the first export" "east web-2" "$(get http://web.xcc.test/)"

# ---- a certificate Secret replaced in place (new key, same CA) --------------------------------
# Started now; the kubelet brings the new files within its sync period (checked further down),
# into the same pod: the registry reloads them, with no restart, and west's connection stays.
say "east's certificate replaced in place"
REGISTRY_POD=$(kubectl --context east -n cross-cluster-connectivity get pods -l app.kubernetes.io/name=xcc-registry -o jsonpath='{.items[*].metadata.uid}')
connected_since() {
  kubectl --context west -n cross-cluster-connectivity get remoteregistry east \
    -o jsonpath='{.status.conditions[?(@.type=="Connected")].status} {.status.conditions[?(@.type=="Connected")].lastTransitionTime}'
}
CONNECTED=$(connected_since)
xcc certs issue --ca-dir "$W/pki" --cluster east --dns east.registry.xcc.example --out "$W/pki/east-2" >/dev/null
kubectl --context east -n cross-cluster-connectivity create secret generic xcc-registry-tls \
  --from-file="$W/pki/east-2/ca.crt" --from-file="$W/pki/east-2/tls.crt" --from-file="$W/pki/east-2/tls.key" \
  --dry-run=client -o yaml | kubectl --context east replace -f - >/dev/null
NEW_FP=$(openssl x509 -in "$W/pki/east-2/tls.crt" -noout -fingerprint -sha256)
served_fp() {
  openssl s_client -connect "$EAST_REGISTRY" -servername east.registry.xcc.example \
    -cert "$W/pki/west/tls.crt" -key "$W/pki/west/tls.key" -CAfile "$W/pki/ca.crt" </dev/null 2>/dev/null |
    openssl x509 -noout -fingerprint -sha256 2>/dev/null
}

# ---- the binder restarted: nothing in west removed ----------------------------------------
binder_objects() { # uid of every Service and EndpointSlice the binder made
  for kind in services endpointslices; do
    kubectl --context west -n cross-cluster-connectivity get $kind -l app.kubernetes.io/managed-by=xcc-binder \
      -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}'
  done | sort
}
BEFORE=$(binder_objects)
say "west's binder pod deleted"
kubectl --context west -n cross-cluster-connectivity delete pod -l app.kubernetes.io/name=xcc-binder --wait=true >/dev/null
kubectl --context west -n cross-cluster-connectivity rollout status deployment/xcc-binder --timeout=120s >/dev/null ||
  die "west's binder did not come back"
# Ready means the new binder finished its first full sync, i.e. it has decided about every object.
kubectl --context west -n cross-cluster-connectivity wait --for=condition=Ready pod -l app.kubernetes.io/name=xcc-binder --timeout=60s >/dev/null
check "after the binder's restart, the same Services and EndpointSlices (by uid)" "$BEFORE" "$(binder_objects)"
check "... and the import answers" "east web-2" "$(get http://web.xcc.test/)"

# ---- the replaced certificate is served, with no restart ----------------------------------
cert_replaced() { [ "$(served_fp)" = "$NEW_FP" ]; }
eventually 150 cert_replaced || true
check "east's registry serves the certificate of the replaced Secret" "$NEW_FP" "$(served_fp)"
check "... by the same registry pod (not restarted, not replaced)" "$REGISTRY_POD" \
  "$(kubectl --context east -n cross-cluster-connectivity get pods -l app.kubernetes.io/name=xcc-registry -o jsonpath='{.items[*].metadata.uid}')"
check "west's RemoteRegistry stayed Connected throughout (same transition time)" "$CONNECTED" "$(connected_since)"
check "... and requests continue" "east web-2" "$(get http://web.xcc.test/)"

# ---- unexport: the name stops answering and west's Service goes ---------------------------
step unexport
unimported() { ! imported_services | grep '=web.xcc.test$' >/dev/null && ! resolves web.xcc.test; }
eventually 60 unimported || true
IMPORTED=$(imported_services)
check "after unexport, west's binder Service for web.xcc.test is gone" "" \
  "$(printf '%s\n' "$IMPORTED" | grep '=web.xcc.test$' || true)"
check "... and web.xcc.test no longer resolves" no "$(resolves web.xcc.test && echo yes || echo no)"
check "... web2 still answers" "east web-2" "$(get http://web2.shop.svc.clusterset.local/)"

# ---- MCS mode: deploy/overlays/mcs on both clusters; a ServiceExport, a headless export ------
# east keeps its registry Service a LoadBalancer (its own overlay, as deploy/README.md says to
# combine overlays), so west's RemoteRegistry keeps its address.
say "MCS mode on both clusters"
mkdir -p "$W/east-mcs"
cat >"$W/east-mcs/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../deploy/overlays/mcs]
patches:
  - target: {kind: Service, name: xcc-registry}
    patch: |-
      - op: replace
        path: /spec/type
        value: LoadBalancer
YAML
for c in east west; do
  (cd "$W" && kubectl --context $c apply --server-side -k deploy/mcs/crds >/dev/null)
  kubectl --context $c wait --for=condition=Established crd/clusterproperties.about.k8s.io \
    crd/serviceexports.multicluster.x-k8s.io crd/serviceimports.multicluster.x-k8s.io --timeout=60s >/dev/null
  # The cluster's MCS name: the same as its certificate's (a mismatch stops start-up).
  kubectl --context $c apply -f - >/dev/null <<YAML
apiVersion: about.k8s.io/v1alpha1
kind: ClusterProperty
metadata: {name: cluster.clusterset.k8s.io}
spec: {value: $c}
YAML
done
# west's registry becomes reachable from east the same way (its node port) for the two-way
# section below, where east imports from west too.
mkdir -p "$W/west-mcs"
sed 's/value: LoadBalancer/value: NodePort/' "$W/east-mcs/kustomization.yaml" >"$W/west-mcs/kustomization.yaml"
kubectl --context east apply -k "$W/east-mcs" >/dev/null
kubectl --context west apply -k "$W/west-mcs" >/dev/null
for c in east west; do
  for d in xcc-registry xcc-publisher xcc-binder; do
    kubectl --context $c -n cross-cluster-connectivity rollout status deployment/$d --timeout=120s >/dev/null ||
      die "$c: $d not rolled out in MCS mode"
  done
done
check "east's registry Service kept its node port" "$EAST_PORT" \
  "$(kubectl --context east -n cross-cluster-connectivity get service xcc-registry -o jsonpath='{.spec.ports[?(@.name=="grpc")].nodePort}')"

# east: a ClusterIP Service exported by a ServiceExport alone (MCS mode exports its ready pods'
# addresses: reachable on this flat pod network), and a headless one with two named pods.
db_pod() { # name [cluster, default east]
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: shop, labels: {app: db}}
spec:
  hostname: $1
  subdomain: db
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: localhost/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo ${2:-east} $1 > /www/index.html && exec httpd -f -p 8080 -h /www"]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
YAML
}
kubectl --context west create namespace shop >/dev/null  # ServiceImports live in the origin's namespace
{ db_pod db-0; echo ---; db_pod db-1; cat <<YAML; } | kubectl --context east apply -f - >/dev/null
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{name: http, port: 8080, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: api, namespace: shop}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: db, namespace: shop}
YAML
kubectl --context east -n shop wait --for=condition=Ready pod/db-0 pod/db-1 --timeout=60s >/dev/null || die "db pods not Ready"
service_import_ip() {
  kubectl --context west -n shop get serviceimport api -o jsonpath='{.spec.ips[0]}' 2>/dev/null
}
import_ip_answers() { [ -n "$(service_import_ip)" ] && answers "http://$(service_import_ip)/" "east web-2"; }
eventually 60 import_ip_answers || true
SI_IP=$(service_import_ip)
check "MCS: west's ServiceImport shop/api has a ClusterSetIP" yes "$([ -n "$SI_IP" ] && echo yes || echo no)"
check "MCS: the ServiceImport's IP answers with east's pod" "east web-2" "$(get "http://$SI_IP/")"
check "MCS: ... and api.shop.svc.clusterset.local" "east web-2" "$(get http://api.shop.svc.clusterset.local/)"
check "MCS: east's ServiceExport api is Valid" True \
  "$(kubectl --context east -n shop get serviceexport api -o jsonpath='{.status.conditions[?(@.type=="Valid")].status}')"
headless_answers() {
  answers http://db-0.east.db.shop.svc.clusterset.local:8080/ "east db-0" &&
    answers http://db-1.east.db.shop.svc.clusterset.local:8080/ "east db-1"
}
eventually 60 headless_answers || true
for p in db-0 db-1; do
  check "MCS headless: $p.east.db.shop.svc.clusterset.local answers with that pod" "east $p" \
    "$(get http://$p.east.db.shop.svc.clusterset.local:8080/)"
done
check "MCS: west's ServiceImport shop/db is Headless" Headless \
  "$(kubectl --context west -n shop get serviceimport db -o jsonpath='{.spec.type}')"

# ---- MCS both ways (KEP-1645): each cluster exports and imports one service -------------------
# east imports from west too (a RemoteRegistry for west's registry, by its node port) and its
# pods resolve clusterset names through its own xcc dns (deploy/dns), as west's do. `echo` in
# namespace shop is exported by a ServiceExport in both clusters, one pod each, on ports `tcp`
# 7000/TCP and `udp` 7000/UDP (both clusters), `east-tcp` 7001/TCP and `east-udp` 7001/UDP (east
# only), `west-tcp` 7002/TCP and `west-udp` 7002/UDP (west only); each port answers
# "<cluster> <proto> <port>" (busybox httpd for TCP; tests/nodes/udp.c for UDP, as busybox's nc
# has none). The headless `db` gets a third pod, db-0 in west (the same hostname as east's).
say "MCS both ways: east imports from west, echo and db exported by both"
WEST_REGISTRY=$(kubectl --context west get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}'):$(
  kubectl --context west -n cross-cluster-connectivity get service xcc-registry -o jsonpath='{.spec.ports[?(@.name=="grpc")].nodePort}')
(cd "$W" && kubectl --context east apply -k deploy/dns >/dev/null)
kubectl --context east apply -f - >/dev/null <<YAML
apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: RemoteRegistry
metadata: {name: west, namespace: cross-cluster-connectivity}
spec:
  address: $WEST_REGISTRY
  tlsConfig: {serverCA: "", serverName: west.registry.xcc.example}
  allowedDomains: [svc.clusterset.local]
YAML
echo_pod() { # cluster port-of-its-own
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: echo-$1, namespace: shop, labels: {app: echo}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: xt, hostPath: {path: "$W/xt", type: Directory}}]
  containers:
  - name: echo
    image: localhost/busybox:1
    imagePullPolicy: Never
    volumeMounts: [{name: xt, mountPath: /xt, readOnly: true}]
    command:
    - sh
    - -c
    - |
      for p in 7000 $2; do
        mkdir -p /www/\$p && echo "$1 tcp \$p" >/www/\$p/index.html
        httpd -f -p \$p -h /www/\$p &
        /xt/udp serve \$p "$1 udp \$p" &
      done
      wait
    readinessProbe: {httpGet: {path: /, port: 7000}, periodSeconds: 1}
YAML
}
echo_service() { # cluster port-of-its-own
  cat <<YAML
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: shop}
spec:
  selector: {app: echo}
  ports:
  - {name: tcp, port: 7000, protocol: TCP}
  - {name: udp, port: 7000, protocol: UDP}
  - {name: $1-tcp, port: $2, protocol: TCP}
  - {name: $1-udp, port: $2, protocol: UDP}
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: echo, namespace: shop}
YAML
}
probe_pod() { # nameserver: a client whose resolver is xcc dns
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  dnsPolicy: None
  dnsConfig: {nameservers: ["$1"], options: [{name: ndots, value: "1"}]}
  volumes: [{name: xt, hostPath: {path: "$W/xt", type: Directory}}]
  containers:
  - name: probe
    image: localhost/busybox:1
    imagePullPolicy: Never
    volumeMounts: [{name: xt, mountPath: /xt, readOnly: true}]
    command: ["sleep", "100000"]
YAML
}
{ echo_pod east 7001; echo ---; echo_service east 7001; } | kubectl --context east apply -f - >/dev/null
{ echo_pod west 7002; echo ---; echo_service west 7002; echo ---; db_pod db-0 west; cat <<YAML; } |
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{name: http, port: 8080, targetPort: 8080}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: db, namespace: shop}
YAML
  kubectl --context west apply -f - >/dev/null
kubectl --context east -n cross-cluster-connectivity rollout status deployment/xcc-dns --timeout=120s >/dev/null ||
  die "east: xcc-dns not rolled out"
for c in east west; do
  dns_ip=$(kubectl --context $c -n cross-cluster-connectivity get service xcc-dns -o jsonpath='{.spec.clusterIP}')
  probe_pod "$dns_ip" | kubectl --context $c apply -f - >/dev/null
done
kubectl --context east -n cross-cluster-connectivity wait remoteregistry/west --for=condition=Synced --timeout=120s >/dev/null ||
  die "east's RemoteRegistry west not Synced"
for c in east west; do
  kubectl --context $c -n shop wait --for=condition=Ready pod/echo-$c --timeout=60s >/dev/null || die "echo-$c not Ready"
  kubectl --context $c wait --for=condition=Ready pod/probe --timeout=60s >/dev/null || die "$c: probe not Ready"
done
kubectl --context west -n shop wait --for=condition=Ready pod/db-0 --timeout=60s >/dev/null || die "west db-0 not Ready"

# What TRIES connections from CLUSTER's probe pod to echo.shop.svc.clusterset.local:PORT got,
# distinct and sorted, comma-separated; "fail" for a try that got no answer. The name is
# resolved by the pod's resolver (xcc dns) for each try: wget's for TCP, nslookup's for UDP.
reach() { # cluster proto port tries
  kubectl --context $1 exec probe -- sh -c '
    n=echo.shop.svc.clusterset.local
    i=0
    while [ $i -lt $3 ]; do
      i=$((i + 1))
      if [ "$1" = tcp ]; then timeout 2 wget -qO- "http://$n:$2/" || echo fail
      else ip=$(nslookup $n | sed -n "s/^Address: \([0-9.]*\)$/\1/p"); /xt/udp ask "$ip" "$2" || echo fail
      fi
    done 2>/dev/null' sh "$2" "$3" "$4" 2>/dev/null | LC_ALL=C sort -u | paste -sd, -
}
# The answer wanted from each port: both clusters on the shared ones, else its exporter only.
wanted() { # proto port
  case $2 in
    7000) echo "east $1 7000,west $1 7000" ;;
    7001) echo "east $1 7001" ;;
    7002) echo "west $1 7002" ;;
  esac
}
# Settled: each cluster's ServiceImport lists both clusters and every port answers as wanted
# (a bounded re-check: the other cluster's records, the binder's slices and each node's
# kube-proxy arrive on their own schedules; 6 tries, so a shared port may need another round).
settled() {
  local c proto port
  for c in east west; do
    [ "$(kubectl --context $c -n shop get serviceimport echo -o jsonpath='{.status.clusters[*].cluster}')" = "east west" ] || return 1
    for proto in tcp udp; do
      for port in 7000 7001 7002; do
        [ "$(reach $c $proto $port 6)" = "$(wanted $proto $port)" ] || return 1
      done
    done
  done
}
eventually 120 settled || true
for c in east west; do
  check "MCS both ways: $c's ServiceImport shop/echo lists both clusters" "east west" \
    "$(kubectl --context $c -n shop get serviceimport echo -o jsonpath='{.status.clusters[*].cluster}')"
  check "MCS both ways: $c's ServiceImport shop/echo has the union of the ports" \
    "east-tcp 7001 TCP,east-udp 7001 UDP,tcp 7000 TCP,udp 7000 UDP,west-tcp 7002 TCP,west-udp 7002 UDP" \
    "$(kubectl --context $c -n shop get serviceimport echo -o jsonpath='{range .spec.ports[*]}{.name} {.port} {.protocol}{"\n"}{end}' | LC_ALL=C sort | paste -sd, -)"
  for proto in tcp udp; do
    for port in 7000 7001 7002; do
      check "MCS both ways: from $c, 16 $proto connections to echo.shop.svc.clusterset.local:$port reach" \
        "$(wanted $proto $port)" "$(reach $c $proto $port 16)"
    done
  done
done

# DNS asked from each cluster's probe pod (busybox nslookup, its resolver xcc dns): A, AAAA
# and SRV of the ClusterSetIP name, the headless name and a pod's name, each type's answers
# sorted: "Address: <ip>" for A and AAAA, "<priority> <weight> <port> <target>" for SRV; an
# empty answer section shows as nothing (busybox prints "can't find" lines for NXDOMAIN or
# other errors, which would show). The clusters are IPv4-only, so every AAAA is NODATA.
dns_answers() { # cluster name
  kubectl --context $1 exec probe -- sh -c '
    for t in A AAAA SRV; do
      echo "$t:"
      nslookup -type=$t "$1" 2>&1 | sed "1,/^\$/d" |
        sed -n -e "s/^Address: /Address: /p" -e "s/.*service = //p" -e "/find\|NXDOMAIN\|SERVFAIL\|REFUSED/p" | sort
    done' sh "$2" 2>/dev/null | paste -sd' ' -
}
pod_ip() { kubectl --context $1 -n shop get pod $2 -o jsonpath='{.status.podIP}'; }
DB_ADDRESSES=$(for a in "$(pod_ip east db-0)" "$(pod_ip east db-1)" "$(pod_ip west db-0)"; do echo "Address: $a"; done | LC_ALL=C sort | paste -sd' ' -)
for c in east west; do
  echo_ip=$(kubectl --context $c -n shop get serviceimport echo -o jsonpath='{.spec.ips[*]}')
  # SRV: one per port number; `tcp` and `udp` share 7000, and one SRV record cannot tell the
  # protocols apart, so they are one record (the name's RRset has no duplicates).
  check "MCS DNS from a pod in $c: echo.shop.svc.clusterset.local (ClusterSetIP) A, AAAA, SRV" \
    "A: Address: $echo_ip AAAA: SRV: 0 100 7000 echo.shop.svc.clusterset.local 0 100 7001 echo.shop.svc.clusterset.local 0 100 7002 echo.shop.svc.clusterset.local" \
    "$(dns_answers $c echo.shop.svc.clusterset.local)"
  check "MCS DNS from a pod in $c: db.shop.svc.clusterset.local (headless, 3 pods in 2 clusters) A, AAAA, SRV" \
    "A: $DB_ADDRESSES AAAA: SRV: 0 100 8080 db-0.east.db.shop.svc.clusterset.local 0 100 8080 db-0.west.db.shop.svc.clusterset.local 0 100 8080 db-1.east.db.shop.svc.clusterset.local" \
    "$(dns_answers $c db.shop.svc.clusterset.local)"
  for p in east/db-0 east/db-1 west/db-0; do
    check "MCS DNS from a pod in $c: ${p#*/}.${p%/*}.db.shop.svc.clusterset.local A, AAAA, SRV" \
      "A: Address: $(pod_ip ${p%/*} ${p#*/}) AAAA: SRV:" "$(dns_answers $c ${p#*/}.${p%/*}.db.shop.svc.clusterset.local)"
  done
done

# ---- a CA rotation, Secrets replaced in place (docs/operations.md, "Rotating the CA") ---------
# Both registries (each serves the other now) go through the three steps, each applied to both
# clusters' Secrets before the next: (1) the new CA added to every bundle, (2) every leaf
# reissued from the new CA, (3) the old CA removed. After each step, once both registry pods
# have reloaded (their xcc_certificate_reloads_total{result="ok"} went up; the kubelet brings a
# replaced Secret within its sync period): no reload refused, each RemoteRegistry still Connected
# since before (its streams went on), a new export in each cluster reaches the other, and what a
# new connection presents is accepted or refused as the step says. TLS 1.2 for those probes, so
# that a refused client certificate fails the handshake itself.
say "CA rotation on both clusters"
ROT=$W/rot
mkdir -p "$ROT/east" "$ROT/west"
cp "$W/pki/east-2/ca.crt" "$W/pki/east-2/tls.crt" "$W/pki/east-2/tls.key" "$ROT/east/"
cp "$W/pki/west/ca.crt" "$W/pki/west/tls.crt" "$W/pki/west/tls.key" "$ROT/west/"
xcc certs init --trust-domain xcc.example --out "$W/pki-2" >/dev/null
# Clients of each registry, as its peer: the other cluster's certificate of the old CA and one
# of the new CA, and a bundle of both CAs to verify whichever the server presents.
for c in east west; do
  xcc certs issue --ca-dir "$W/pki-2" --cluster $c --dns $c.registry.xcc.example --out "$ROT/new-$c" >/dev/null
done
OLD_CLIENT_east=$ROT/old-west OLD_CLIENT_west=$ROT/old-east
NEW_CLIENT_east=$ROT/new-west NEW_CLIENT_west=$ROT/new-east
cp -r "$ROT/west" "$ROT/old-west"
cp -r "$ROT/east" "$ROT/old-east"
cat "$W/pki/ca.crt" "$W/pki-2/ca.crt" >"$ROT/both-cas.crt"
REGISTRY_ADDRESS_east=$EAST_REGISTRY
REGISTRY_ADDRESS_west=$WEST_REGISTRY
accepts() { # cluster old|new: yes when that cluster's registry completes a handshake with a
  # client (its peer's identity) of the old or the new CA
  local a=REGISTRY_ADDRESS_$1 k=${2^^}_CLIENT_$1
  openssl s_client -tls1_2 -connect "${!a}" -servername $1.registry.xcc.example -cert "${!k}/tls.crt" \
    -key "${!k}/tls.key" -CAfile "$ROT/both-cas.crt" -verify_return_error </dev/null >/dev/null 2>&1 && echo yes || echo no
}
presents() { # cluster CA-file: the fingerprint of the certificate its registry serves, verified
  # against that CA alone (empty when it does not verify)
  local a=REGISTRY_ADDRESS_$1 k=NEW_CLIENT_$1
  openssl s_client -connect "${!a}" -servername $1.registry.xcc.example -cert "${!k}/tls.crt" \
    -key "${!k}/tls.key" -CAfile "$2" -verify_return_error </dev/null 2>/dev/null |
    openssl x509 -noout -fingerprint -sha256 2>/dev/null
}
reloads() { # cluster result: the registry pod's xcc_certificate_reloads_total{result=...}
  local ip m
  ip=$(kubectl --context $1 -n cross-cluster-connectivity get pods -l app.kubernetes.io/name=xcc-registry -o jsonpath='{.items[0].status.podIP}')
  m=$(curl -fsS "http://$ip:9090/metrics") || { echo "no metrics from $ip"; return; }
  printf '%s\n' "$m" | awk -v k="xcc_certificate_reloads_total{result=\"$2\"}" '$1 == k { print $2; f = 1 } END { if (!f) print 0 }'
}
connected_since_on() { # cluster remote
  kubectl --context $1 -n cross-cluster-connectivity get remoteregistry $2 \
    -o jsonpath='{.status.conditions[?(@.type=="Connected")].status} {.status.conditions[?(@.type=="Connected")].lastTransitionTime}'
}
put_secret() { # cluster
  kubectl --context $1 -n cross-cluster-connectivity create secret generic xcc-registry-tls \
    --from-file="$ROT/$1/ca.crt" --from-file="$ROT/$1/tls.crt" --from-file="$ROT/$1/tls.key" \
    --dry-run=client -o yaml | kubectl --context $1 replace -f - >/dev/null
}
CONNECTED_WEST_ON_EAST=$(connected_since_on east west)
CONNECTED_EAST_ON_WEST=$(connected_since_on west east)
check "before the rotation: east's registry refuses a client of the new CA" no "$(accepts east new)"
check "... and accepts one of the old CA" yes "$(accepts east old)"
rotation_step() { # n what: after the Secrets of both clusters were replaced
  local n=$1 what=$2 c other
  for c in east west; do
    eval "reloaded_$c() { [ \"\$(reloads $c ok)\" -gt ${RELOADS[$c]} ]; }"
    eventually 90 reloaded_$c || true
    check "CA rotation step $n ($what): $c's registry pod reloaded its files" yes \
      "$([ "$(reloads $c ok)" -gt "${RELOADS[$c]}" ] && echo yes || echo no)"
    check "... none refused" 0 "$(reloads $c error)"
    RELOADS[$c]=$(reloads $c ok)
  done
  check "... east's RemoteRegistry west Connected throughout (same transition)" "$CONNECTED_WEST_ON_EAST" "$(connected_since_on east west)"
  check "... west's RemoteRegistry east Connected throughout (same transition)" "$CONNECTED_EAST_ON_WEST" "$(connected_since_on west east)"
  # A new export in each cluster, through the streams that went on.
  for c in east west; do
    kubectl --context $c -n shop apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: rot$n-$c, namespace: shop}
spec:
  selector: {app: echo}
  ports: [{name: tcp, port: 7000, protocol: TCP}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: rot$n-$c, namespace: shop}
YAML
  done
  for c in east west; do
    other=west; [ $c = east ] || other=east
    eval "imported_$c() { [ \"\$(kubectl --context $other -n shop get serviceimport rot$n-$c -o jsonpath='{.status.clusters[*].cluster}')\" = $c ]; }"
    eventually 60 imported_$c || true
    check "... $c's new export rot$n-$c is imported by $other" $c \
      "$(kubectl --context $other -n shop get serviceimport rot$n-$c -o jsonpath='{.status.clusters[*].cluster}' 2>/dev/null)"
  done
  check "... and east's echo still answers from west" "east tcp 7001" "$(reach west tcp 7001 4)"
}
declare -A RELOADS=([east]=$(reloads east ok) [west]=$(reloads west ok))
# Step 1: the new CA in every bundle.
for c in east west; do xcc certs bundle add --bundle "$ROT/$c/ca.crt" --ca "$W/pki-2/ca.crt" >/dev/null; put_secret $c; done
rotation_step 1 "both CAs in every bundle"
for c in east west; do
  check "... $c's registry accepts a client of the new CA" yes "$(accepts $c new)"
  check "... and one of the old CA" yes "$(accepts $c old)"
done
# Step 2: every leaf reissued from the new CA.
for c in east west; do
  xcc certs issue --ca-dir "$W/pki-2" --cluster $c --dns $c.registry.xcc.example --out "$ROT/$c" >/dev/null
  put_secret $c
done
rotation_step 2 "leaves of the new CA"
for c in east west; do
  check "... $c's registry presents its leaf of the new CA" \
    "$(openssl x509 -in "$ROT/$c/tls.crt" -noout -fingerprint -sha256)" "$(presents $c "$W/pki-2/ca.crt")"
  check "... and still accepts a client of the old CA" yes "$(accepts $c old)"
done
# Step 3: the old CA removed.
for c in east west; do xcc certs bundle remove --bundle "$ROT/$c/ca.crt" --ca "$W/pki/ca.crt" >/dev/null; put_secret $c; done
rotation_step 3 "the old CA removed"
for c in east west; do
  check "... $c's registry refuses a client of the old CA" no "$(accepts $c old)"
  check "... and accepts one of the new CA" yes "$(accepts $c new)"
done
pods_as_deployed n-east east
pods_as_deployed n-west west

# ---- bench (XCC_NODES_BENCH=N; docs/benchmarks.md): export -> first answer by name, N times ---
# Measured in the client pod against /proc/uptime (one kernel, so the host's clock too; 10 ms
# steps: busybox's date has no sub-second format): from just before `kubectl label` to the
# first A answer of xcc dns (which comes only once west's Service and a ready slice exist:
# xcc's share), and from there to the first page (west's kube-proxy programming the new
# cluster IP, and the client's retry).
#
# The client's request loop (busybox sh in the client pod; $1 the URL, $2 the page wanted or
# empty for any): one `wget` after another, 10 ms apart, each given 300 ms (busybox's
# `timeout` counts whole seconds, so a killer in the background), as a client that retries
# should do. A connection sent to a new cluster IP before the node's kube-proxy has
# programmed it (kube-proxy syncs at most once per minSyncPeriod, 1 s by default, after a
# burst of 2) leaves the node unrewritten, and conntrack then sends every retransmission of
# that connection the same way even once the rules are in: only a new connection gets
# through (with `timeout 2`, as before, such a try cost 2 s). One rejected (kube-proxy has the
# Service, not yet its endpoints) would wait for TCP's retransmission a second later. Prints
# Each loop has its own page file (/tmp/page.<pid>): two run at once in the pod replacements.
# "page <uptime when the try that succeeded began> <uptime at its page> <tries> <tries that
# timed out> <tries that failed (timed out, refused, ...)>", after a line "try <start> <end> <exit code> <page>" per try (for traces).
fetch_loop='n=0; slow=0; failed=0
  while :; do
    n=$((n + 1)); s=$(cut -d" " -f1 /proc/uptime)
    rm -f /tmp/page.$$
    wget -qO /tmp/page.$$ "$1" 2>/dev/null & w=$!
    ( usleep 300000; kill $w 2>/dev/null ) & k=$!
    wait $w; rc=$?
    kill $k 2>/dev/null; wait $k 2>/dev/null
    echo "try $s $(cut -d" " -f1 /proc/uptime) $rc $(cat /tmp/page.$$ 2>/dev/null)"
    if [ $rc = 0 ] && { [ -z "$2" ] || [ "$(cat /tmp/page.$$)" = "$2" ]; }; then break; fi
    if [ $rc = 143 ]; then slow=$((slow + 1)); fi
    if [ $rc != 0 ]; then failed=$((failed + 1)); fi
    usleep 10000
  done
  echo "page $s $(cut -d" " -f1 /proc/uptime) $n $slow $failed"'
if [ -n "${XCC_NODES_BENCH:-}" ]; then
  say "bench: $XCC_NODES_BENCH exports"
  uptime_s() { cut -d' ' -f1 /proc/uptime; }
  : >"$W/bench.txt"
  # XCC_NODES_TRACE=DIR: what happens on west's node during the exports, kept in DIR (a packet
  # capture, conntrack's events, iptables-save, kube-proxy's log: its syncs show from --v=4).
  if [ -n "${XCC_NODES_TRACE:-}" ]; then
    mkdir -p "$XCC_NODES_TRACE"
    west_ns=knode$(. "$W/n-west/state"; echo "$IDX")
    nsenter --net=/run/netns/$west_ns tcpdump -i any -n -tt -U -w "$XCC_NODES_TRACE/west.pcap" \
      'tcp port 80 or tcp port 8080 or icmp or udp port 53' >"$XCC_NODES_TRACE/tcpdump.log" 2>&1 &
    RELAYS+=($!)
    nsenter --net=/run/netns/$west_ns conntrack -E -p tcp -o timestamp,id >"$XCC_NODES_TRACE/conntrack.log" 2>&1 &
    RELAYS+=($!)
    echo "epoch $(date +%s.%N) uptime $(uptime_s)" >"$XCC_NODES_TRACE/clock"
  fi
  for i in $(seq 1 "$XCC_NODES_BENCH"); do
    kubectl --context east -n shop create service nodeport b$i --tcp=80:8080 >/dev/null
    kubectl --context east -n shop patch service b$i --type=merge -p '{"spec":{"selector":{"app":"web"}}}' >/dev/null
    rm -f "$W/bench-$i.out"
    kubectl --context west exec client -- sh -c '
      echo go
      until nslookup "$3" "$4" 2>/dev/null | grep "^Address: [0-9]" >/dev/null; do usleep 10000; done
      echo "named $(cut -d" " -f1 /proc/uptime)"
      '"$fetch_loop" sh "http://b$i.shop.svc.clusterset.local/" "" "b$i.shop.svc.clusterset.local" "$DNS_IP" \
      >"$W/bench-$i.out" 2>&1 &
    bench_exec=$!
    bench_started() { grep -x go "$W/bench-$i.out"; }
    eventually 30 bench_started || die "bench: the client's loop did not start"
    t=$(uptime_s)
    kubectl --context east -n shop label service b$i connectivity.tanzu.vmware.com/export= >/dev/null
    wait $bench_exec || die "bench: export b$i never answered"
    # export->name, export->page, name->page (ms), tries, tries timed out
    awk -v t="$t" '$1 == "named" { d = $2 } $1 == "page" { e = $3; n = $4; o = $5 }
      END { printf "%d %d %d %d %d\n", (d - t) * 1000, (e - t) * 1000, (e - d) * 1000, n, o }' \
      "$W/bench-$i.out" >>"$W/bench.txt"
  done
  stats() { # column: p50 p99 max of that column of bench.txt, in ms
    sort -n -k"$1" "$W/bench.txt" | awk -v c="$1" '{ v[NR] = $c } END {
      p50 = v[int((NR + 1) / 2)]; i99 = int(NR * 0.99 + 0.999); if (i99 > NR) i99 = NR
      printf "p50 %d ms, p99 %d ms, max %d ms (n=%d)", p50, v[i99], v[NR], NR }'
  }
  tries() { # tries (column), timed out (column): totals over the samples
    awk -v n="$1" -v s="$2" '{ t += $n; o += $s; if ($s > 0) k++ } END {
      printf "%d tries in all, %d timed out (in %d samples)", t, o, k }' "$W/bench.txt"
  }
  failed() { # column: failed tries over the samples
    awk -v f="$1" '{ t += $f; if ($f > 0) k++ } END { printf "%d (in %d samples)", t, k }' "$W/bench.txt"
  }
  say "bench: export -> name answers (xcc's share):          $(stats 1)"
  say "bench: name answers -> first page (west's kube-proxy): $(stats 3)"
  say "bench: export -> first page in west:                  $(stats 2)"
  say "bench: client: $(tries 4 5)"
  # kube-proxy's own account of its rule syncs on west's node (its metrics, in the node's netns).
  "$KUBE_SHARED/node" exec "$W/n-west" curl -fsS http://127.0.0.1:10249/metrics 2>/dev/null |
    awk '/^kubeproxy_sync_proxy_rules_duration_seconds_(sum|count) / { v[$1] = $2 }
      END { c = v["kubeproxy_sync_proxy_rules_duration_seconds_count"]
            if (c > 0) printf "nodes tier: bench: west kube-proxy: %d rule syncs, mean %.0f ms each\n",
              c, 1000 * v["kubeproxy_sync_proxy_rules_duration_seconds_sum"] / c }' || true
  if [ -n "${XCC_NODES_TRACE:-}" ]; then
    cp "$W"/bench-*.out "$W/n-west/kube-proxy.log" "$XCC_NODES_TRACE/"
    kubectl --context west -n cross-cluster-connectivity logs deployment/xcc-binder --timestamps \
      >"$XCC_NODES_TRACE/xcc-binder.log" 2>&1
    nsenter --net=/run/netns/$west_ns iptables-save >"$XCC_NODES_TRACE/iptables-save" 2>&1
  fi
  for i in $(seq 1 "$XCC_NODES_BENCH"); do
    kubectl --context east -n shop delete service b$i --wait=false >/dev/null
  done
  # Server pod replaced -> first page from the new pod, from the moment the new pod is created,
  # through two exports of the same pods at once: `web2` (NodePort: its record names the nodes,
  # so xcc changes nothing; pod start-up, readiness, east's EndpointSlice and kube-proxy) and
  # `api` (a ServiceExport in MCS mode: its record carries the pod addresses, so xcc's whole
  # chain runs on every replacement). XCC_NODES_ROLLOUT says how the pod is replaced:
  # `surge` (the default; a Deployment's rollout with maxSurge 1, maxUnavailable 0, as
  # deploy/README.md advises): the old pod is deleted once the new one is Ready, and serves for
  # its preStop delay (3 s) while the kube-proxies and xcc drop it; `recreate`: the old pod
  # (no preStop) is deleted as the new one is created.
  rollout=${XCC_NODES_ROLLOUT:-surge}
  case $rollout in surge|recreate) ;; *) die "XCC_NODES_ROLLOUT: surge or recreate, not '$rollout'" ;; esac
  say "bench: $XCC_NODES_BENCH server pod replacements ($rollout)"
  : >"$W/bench-pods.txt"
  prev=web-2
  # XCC_NODES_TRACE: the same on east's node for the replacements (its kube-proxy routes the
  # NodePort export's connections to the pods).
  if [ -n "${XCC_NODES_TRACE:-}" ]; then
    east_ns=knode$(. "$W/n-east/state"; echo "$IDX")
    nsenter --net=/run/netns/$east_ns tcpdump -i any -n -tt -U -w "$XCC_NODES_TRACE/east.pcap" \
      'tcp port 8080 or arp or icmp' >"$XCC_NODES_TRACE/tcpdump-east.log" 2>&1 &
    RELAYS+=($!)
    nsenter --net=/run/netns/$east_ns conntrack -E -p tcp -o timestamp,id >"$XCC_NODES_TRACE/conntrack-east.log" 2>&1 &
    RELAYS+=($!)
    kubectl --context east -n shop get pods -w -o wide --output-watch-events 2>&1 |
      while IFS= read -r l; do echo "$(date +%s.%N) $l"; done >"$XCC_NODES_TRACE/east-pods.log" &
    RELAYS+=($!)
  fi
  for i in $(seq 3 $((XCC_NODES_BENCH + 2))); do
    for svc in web2 api; do
      rm -f "$W/bench-pod-$svc.out"
      kubectl --context west exec client -- sh -c '
        echo go
        '"$fetch_loop" sh "http://$svc.shop.svc.clusterset.local/" "east web-$i" >"$W/bench-pod-$svc.out" 2>&1 &
      eval "exec_$svc=\$!"
    done
    pod_loops_started() { grep -x go "$W/bench-pod-web2.out" && grep -x go "$W/bench-pod-api.out"; }
    eventually 30 pod_loops_started || die "bench: the client's loops did not start"
    t=$(uptime_s)
    if [ "$rollout" = recreate ]; then
      web_pod web-$i | kubectl --context east apply -f - >/dev/null
      kubectl --context east -n shop delete pod $prev --wait=false >/dev/null
    else
      web_pod web-$i 3 | kubectl --context east apply -f - >/dev/null
    fi
    # When the new pod turns Ready (seen through a watch): the kubelet's part ends there.
    ready=$(kubectl --context east -n shop wait --for=condition=Ready pod/web-$i --timeout=60s >/dev/null && uptime_s)
    if [ "$rollout" = surge ]; then
      kubectl --context east -n shop delete pod $prev --wait=false >/dev/null
    fi
    wait "$exec_web2" || die "bench: web-$i never answered through web2"
    wait "$exec_api" || die "bench: web-$i never answered through api"
    printf '%s %s\n' "$(grep '^page ' "$W/bench-pod-web2.out")" "$(grep '^page ' "$W/bench-pod-api.out")" |
      awk -v t="$t" -v ready="$ready" '{ printf "%d %d %d %d %d %d %d %d %d %d\n", ($3 - t) * 1000,
        ($3 - ready) * 1000, ($9 - t) * 1000, ($9 - ready) * 1000, $4, $5, $10, $11, $6, $12 }' >>"$W/bench-pods.txt"
    if [ -n "${XCC_NODES_TRACE:-}" ]; then
      for svc in web2 api; do cp "$W/bench-pod-$svc.out" "$XCC_NODES_TRACE/pod-$i-$svc.out"; done
      echo "web-$i start $t ready $ready" >>"$XCC_NODES_TRACE/pods-clock"
    fi
    prev=web-$i
  done
  if [ -n "${XCC_NODES_TRACE:-}" ]; then
    cp "$W/bench-pods.txt" "$XCC_NODES_TRACE/"
    cp "$W/n-east/kube-proxy.log" "$XCC_NODES_TRACE/kube-proxy-east.log"
  fi
  cp "$W/bench-pods.txt" "$W/bench.txt"
  say "bench: pod replaced -> first page from the new pod, NodePort export: $(stats 1)"
  say "bench: ... of which new pod Ready -> first page:                   $(stats 2)"
  say "bench: pod replaced -> first page from the new pod, MCS export:      $(stats 3)"
  say "bench: ... of which new pod Ready -> first page:                   $(stats 4)"
  say "bench: client, NodePort export: $(tries 5 6); MCS export: $(tries 7 8)"
  say "bench: tries that failed (no page), NodePort export: $(failed 9); MCS export: $(failed 10)"
fi

# ---- 0 restarts over the whole tier -------------------------------------------------------
for c in east west; do
  restarts=$(kubectl --context $c -n cross-cluster-connectivity get pods \
    -o jsonpath='{range .items[*]}{range .status.containerStatuses[*]}{.restartCount}{"\n"}{end}{end}' | sort -u | tr '\n' ' ')
  check "$c: every xcc container restarted 0 times" "0 " "$restarts"
done
pods_as_deployed n-east east
pods_as_deployed n-west west

[ $fail = 0 ] || exit 1
say "all passed"
