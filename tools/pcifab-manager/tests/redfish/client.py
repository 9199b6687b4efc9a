#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only
"""Drives the manager's Redfish view with DMTF's `redfish` client library, as an
operator's tool would: walks the fabric, composes a zone by PATCH, and is refused where its
principal may not go. Prints one JSON object of what it saw; exits non-zero, saying what
differed, when the service does not behave as Documentation/manager-api.rst says.

usage: client.py URL CAFILE ADMIN_TOKEN TENANT0_TOKEN
"""
import json
import sys

import redfish

FABRIC = "/redfish/v1/Fabrics/PCIe"


def fail(msg):
    print(f"redfish client: {msg}", file=sys.stderr)
    sys.exit(1)


def expect(resp, status, what):
    if resp.status != status:
        fail(f"{what}: HTTP {resp.status}, expected {status}: {resp.text}")
    return resp.dict


def members(c, path):
    d = expect(c.get(path), 200, f"GET {path}")
    if d.get("Members@odata.count") != len(d.get("Members", [])):
        fail(f"{path}: Members@odata.count does not count Members")
    return [m["@odata.id"] for m in d["Members"]]


def main():
    url, cafile, admin_token, tenant0_token = sys.argv[1:5]
    admin = redfish.redfish_client(base_url=url, sessionkey=admin_token, cafile=cafile)
    seen = {"root": admin.root.get("@odata.type")}
    fabrics = members(admin, "/redfish/v1/Fabrics")
    if fabrics != [FABRIC]:
        fail(f"fabrics: {fabrics}")
    fabric = expect(admin.get(FABRIC), 200, "GET fabric")
    seen["fabric_type"] = fabric["FabricType"]
    seen["endpoints"] = members(admin, fabric["Endpoints"]["@odata.id"])
    seen["zones"] = members(admin, fabric["Zones"]["@odata.id"])
    switches = members(admin, fabric["Switches"]["@odata.id"])
    sw = expect(admin.get(switches[0]), 200, "GET switch")
    seen["ports"] = members(admin, sw["Ports"]["@odata.id"])
    for e in seen["endpoints"]:
        expect(admin.get(e), 200, f"GET {e}")

    # Compose: zone 1 gets the first target endpoint.
    target = next(e for e in seen["endpoints"] if not e.rsplit("/", 1)[1].startswith("host"))
    zone1 = f"{FABRIC}/Zones/1"
    z = expect(admin.get(zone1), 200, "GET zone 1")
    eps = z["Links"]["Endpoints"] + [{"@odata.id": target}]
    z = expect(admin.patch(zone1, body={"Links": {"Endpoints": eps}}), 200, "PATCH zone 1")
    seen["zone1_after_patch"] = [e["@odata.id"] for e in z["Links"]["Endpoints"]]
    seen["connections"] = members(admin, fabric["Connections"]["@odata.id"])
    ep = expect(admin.get(target), 200, "GET target")
    seen["target_zones"] = [x["@odata.id"] for x in ep["Links"]["Zones"]]

    # h0's tenant: may not compose zone 1, and zone 0 cannot have a device zone 1 holds.
    tenant0 = redfish.redfish_client(base_url=url, sessionkey=tenant0_token, cafile=cafile)
    r = tenant0.patch(zone1, body={"Links": {"Endpoints": []}})
    seen["tenant0_patch_zone1"] = r.status
    seen["tenant0_patch_zone1_error"] = r.dict["error"]["message"]
    r = tenant0.patch(f"{FABRIC}/Zones/0", body={"Links": {"Endpoints": [{"@odata.id": target}]}})
    seen["tenant0_patch_taken"] = r.status
    seen["tenant0_patch_taken_error"] = r.dict["error"]["message"]
    r = tenant0.patch(f"{FABRIC}/Zones/0", body={"Links": {"Endpoint": []}})
    seen["tenant0_patch_malformed"] = r.status

    # No credentials: the service root only.
    anon = redfish.redfish_client(base_url=url, cafile=cafile)
    seen["anonymous_root"] = anon.root.get("Id")
    seen["anonymous_fabric"] = anon.get(FABRIC).status
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
