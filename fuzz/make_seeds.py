#!/usr/bin/env python3
"""Writes the hand-made seed inputs of every fuzz target into fuzz/corpus/<target>/.

Protobuf messages are encoded by the few lines below (proto3 wire format: varints and
length-delimited fields) so no protobuf toolchain is needed. The first byte of a protobuf seed
selects the message type, as in fuzz/src/entries.rs. Campaigns start from these seeds and add
what they find to the same directory, which is then minimised (docs/fuzzing.md).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def f_varint(field, n):
    return varint(field << 3) + varint(n)


def entry(k, v):
    return f_bytes(1, k) + f_bytes(2, v)


def fs_v1alpha1():
    ep = f_bytes(1, "10.0.0.1") + f_varint(2, 443)
    return (f_bytes(1, "api") + f_bytes(5, "api.xcc.test") + f_bytes(9, ep)
            + f_bytes(4, entry("connectivity.tanzu.vmware.com/service-port", "443"))
            + f_bytes(4, entry("connectivity.tanzu.vmware.com/vip", "10.9.0.1")))


def fs_v1alpha1_ports(value):
    """A v1alpha1 FederatedService from an xcc exporter: its named ports in xcc's ports label."""
    return fs_v1alpha1() + f_bytes(4, entry("connectivity.tanzu.vmware.com/ports", value))


PORTS_OK = ('[{"name":"sql","port":5432,"protocol":"TCP","targetPort":15432},'
            '{"name":"stats","port":9187,"protocol":"UDP"}]')
# Every way a port can be bad in one list: duplicate name, port 0, a string port, an unknown
# protocol, a target of 0, a name that is no DNS label, no name beside others, not an object.
PORTS_BAD = ('[{"name":"a","port":1},{"name":"a","port":2},{"name":"b","port":0},'
             '{"name":"c","port":"80"},{"name":"d","port":3,"protocol":"ICMP"},'
             '{"name":"e","port":4,"targetPort":0},{"name":"-x","port":5},{"port":6},7,null]')


def fs_v1alpha2():
    ep = f_bytes(1, "fd00::1") + f_varint(2, 8443) + f_bytes(3, "zone=a")
    inst = f_bytes(1, "i1") + f_bytes(2, "https")
    return f_bytes(1, "api") + f_bytes(5, "api.xcc.test") + f_bytes(9, ep) + f_bytes(11, inst)


def any_of(name, value):
    return f_bytes(1, "type.googleapis.com/" + name) + f_bytes(2, value)


def hamlet():
    a1 = any_of("federation.types.v1alpha1.FederatedService", fs_v1alpha1())
    a2 = any_of("federation.types.v1alpha2.FederatedService", fs_v1alpha2())
    resp1 = f_bytes(1, "n1") + f_bytes(2, "type.googleapis.com/federation.types.v1alpha1.FederatedService") + f_bytes(3, a1) + f_varint(4, 1)
    resp2 = f_bytes(1, "n1") + f_bytes(3, "api") + f_bytes(4, a2) + f_varint(5, 1) + f_bytes(6, "ctx")
    status = f_varint(1, 3) + f_bytes(2, "bad")
    req1 = f_bytes(1, "type.googleapis.com/federation.types.v1alpha1.FederatedService") + f_bytes(2, "n1") + f_bytes(3, status)
    req2 = f_bytes(1, "type.googleapis.com/federation.types.v1alpha2.FederatedService") + f_bytes(4, "ctx")
    return {
        "v1alpha1_response": b"\x00" + resp1,
        "v1alpha2_response": b"\x01" + f_bytes(2, resp2),
        "v1alpha1_request": b"\x02" + req1,
        "v1alpha2_request": b"\x03" + f_bytes(1, req2),
        "v1alpha1_service": b"\x04" + fs_v1alpha1(),
        "v1alpha2_service": b"\x05" + fs_v1alpha2(),
        "v1alpha1_service_ports": b"\x04" + fs_v1alpha1_ports(PORTS_OK),
        "v1alpha1_service_bad_ports": b"\x04" + fs_v1alpha1_ports(PORTS_BAD),
        "v1alpha1_response_ports": b"\x00" + f_bytes(3, any_of(
            "federation.types.v1alpha1.FederatedService", fs_v1alpha1_ports(PORTS_OK))),
    }


def federation():
    port = f_bytes(1, "https") + f_varint(2, 443) + f_bytes(3, "TCP")
    ann = (f_bytes(1, "b1") + f_bytes(2, "shop") + f_bytes(3, "api") + f_bytes(4, "10.0.0.1:443")
           + f_bytes(4, "[fd00::1]:443") + f_bytes(5, "b2") + f_bytes(16, "api.shop.svc.clusterset.local")
           + f_bytes(17, port) + f_varint(18, 7) + f_bytes(19, entry("connectivity.tanzu.vmware.com/service-port", "443")))
    query = f_bytes(1, "shop") + f_bytes(2, "api") + f_bytes(3, "b1") + f_bytes(4, "web") + f_varint(16, 9)
    route = (f_bytes(1, "shop") + f_bytes(2, "api") + f_bytes(3, "b1") + f_bytes(4, "web")
             + f_varint(16, 1) + f_bytes(17, "b2") + f_bytes(18, "b"))
    hostile = (f_bytes(1, "../../x") + f_bytes(2, "api") + f_bytes(3, "b1") + f_bytes(4, "web")
               + f_varint(16, 2) + f_bytes(17, "b2") + f_bytes(18, "b"))
    return {
        "child_subtree": b"\x00" + f_bytes(1, f_bytes(1, "b1") + f_bytes(1, "b11")),
        "child_announcement": b"\x00" + f_bytes(10, ann),
        "child_query": b"\x00" + f_bytes(11, query),
        "child_ack": b"\x00" + f_bytes(3, f_varint(1, 1) + f_varint(2, 1)),
        "parent_ancestry": b"\x01" + f_bytes(2, f_bytes(1, "root") + f_bytes(1, "b")),
        "parent_route": b"\x01" + f_bytes(12, route),
        "parent_route_revoked": b"\x01" + f_bytes(12, route + f_varint(5, 1)),
        "parent_route_hostile": b"\x01" + f_bytes(12, hostile),
    }


def admin():
    return {
        "resolve_name": b"\x00" + f_bytes(2, "shop") + f_bytes(3, "api") + f_bytes(4, "b1") + f_bytes(5, "web"),
        "resolve_fqdn": b"\x00" + f_bytes(1, "api.shop.svc.clusterset.local"),
        "list": b"\x01" + f_bytes(1, "shop"),
        "get": b"\x02" + f_bytes(1, "b2") + f_bytes(2, "shop") + f_bytes(3, "api"),
        "watch": b"\x03",
    }


RECORD = """apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: ServiceRecord
metadata:
  name: api
  namespace: shop
  annotations:
    connectivity.tanzu.vmware.com/service-port: "443"
spec:
  fqdn: api.shop.svc.clusterset.local
  endpoints:
  - address: 10.0.0.1
    port: 443
  allowedRequesters: [b1, b1/web]
  ports:
  - name: https
    port: 443
    protocol: TCP
  origin:
    cluster: b2
    namespace: shop
    name: api
    kind: Service
"""

REMOTE = """apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: RemoteRegistry
metadata:
  name: east
  namespace: cross-cluster-connectivity
spec:
  address: registry.east.test:8443
  tlsConfig:
    serverName: registry.east.test
    serverCA: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K
  allowedDomains: ["*.xcc.test"]
  role: Parent
  materialize: Service
  imports:
  - fqdn: api.xcc.test
  - namespace: shop
    name: api
"""


def yaml():
    return {
        "service_record.yaml": RECORD,
        "remote_registry.yaml": REMOTE,
        "two_documents.yaml": RECORD + "---\n" + RECORD.replace("name: api\n  namespace", "name: web\n  namespace"),
        "hostile_namespace.yaml": RECORD.replace("namespace: shop\n  annotations", "namespace: ../../x\n  annotations"),
        "json.yaml": '{"apiVersion":"connectivity.tanzu.vmware.com/v1alpha1","kind":"ServiceRecord","metadata":{"name":"a"},"spec":{"fqdn":"a.test","endpoints":[{"address":"[::1]","port":1}]}}',
    }


def cedar():
    return {
        "forbid_cluster.cedar": '@id("no-c1")\nforbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource);\n',
        "permit_zone.cedar": '@id("zone")\npermit (principal, action == Xcc::Action::"announce", resource)\nwhen { resource.zones.contains("xcc.test") };\n',
        "labels.cedar": '@id("labels")\nforbid (principal, action in [Xcc::Action::"discover", Xcc::Action::"import"], resource)\nwhen { resource.labels.contains("tier=internal") && !(principal in Xcc::Cluster::"b1") } unless { context.calleeAdmits };\n',
        "workload.cedar": '@id("w")\npermit (principal == Xcc::Workload::"b1/web", action == Xcc::Action::"discover", resource == Xcc::Service::"b2/shop/api") when { principal.cluster == "b1" && resource.namespace like "sh*" };\n',
        "admin.cedar": '@id("a")\nforbid (principal is Xcc::Admin, action == Xcc::Action::"admin", resource);\n',
    }


def dns_query(qid, name, qtype, edns=False, flags=0x0100):
    qd = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l) + b"\x00"
    qd += struct.pack(">HH", qtype, 1)
    ar = b""
    if edns:
        ar = b"\x00" + struct.pack(">HHIH", 41, 1232, 0, 0)
    return struct.pack(">HHHHHH", qid, flags, 1, 0, 0, 1 if edns else 0) + qd + ar


def dns():
    return {
        "a.bin": dns_query(1, "api.xcc.test", 1),
        "aaaa_edns.bin": dns_query(2, "API.xcc.test", 28, edns=True),
        "srv.bin": dns_query(3, "_https._tcp.api.xcc.test", 33),
        "soa.bin": dns_query(4, "xcc.test", 6),
        "nx.bin": dns_query(5, "nope.xcc.test", 1),
        "short.bin": dns_query(6, "api", 1),
        "outside.bin": dns_query(7, "example.com", 1),
        "compressed.bin": struct.pack(">HHHHHH", 8, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + struct.pack(">HH", 1, 1),
    }


def write(target, files):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("hamlet_messages", hamlet())
write("federation_messages", federation())
write("admin_requests", admin())
write("yaml_records", yaml())
write("cedar_policies", cedar())
write("dns_packets", dns())
