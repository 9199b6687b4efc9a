#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only
"""Drives the manager's Redfish service with OpenStack's sushy, as a deployment tool would:
logs in with sushy's default authentication (a Redfish session), reads the fabric, its
endpoints and its zones, composes a zone by a PATCH with If-Match, sees a stale If-Match
refused with 412, and logs out (the token then no longer works). Exits non-zero, saying what
differed, when the service does not behave as Documentation/manager-api.rst says.

usage: sushy_client.py URL CAFILE USER PASSWORD
"""
import sys

import requests
import sushy
from sushy import exceptions

FABRIC = "/redfish/v1/Fabrics/PCIe"


def fail(msg):
    print(f"sushy client: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    url, cafile, user, password = sys.argv[1:5]
    s = sushy.Sushy(url, username=user, password=password, verify=cafile)
    auth = s._auth
    token = auth.get_session_key() if isinstance(auth, sushy.auth.SessionAuth) else None
    if not token:
        fail(f"sushy did not open a session ({type(auth).__name__}); it fell back to Basic")
    fabrics = s.get_fabric_collection()
    if fabrics.members_identities != (FABRIC,):
        fail(f"fabrics: {fabrics.members_identities}")
    fabric = s.get_fabric(FABRIC)
    if fabric.identity != "PCIe":
        fail(f"fabric Id {fabric.identity}")
    endpoints = fabric.endpoints.get_members()
    targets = [e for e in endpoints if not e.identity.startswith("host")]
    initiators = [e for e in endpoints if e.identity.startswith("host")]
    if len(initiators) != 3 or not targets:
        fail(f"endpoints: {[e.identity for e in endpoints]}")
    conn = s._conn
    zones = conn.get(f"{FABRIC}/Zones").json()
    zone_ids = [m["@odata.id"] for m in zones["Members"]]
    if zone_ids != [f"{FABRIC}/Zones/{h}" for h in range(3)]:
        fail(f"zones: {zone_ids}")

    # Compose: zone 2 gets the first whole device, with the zone's ETag.
    zone2 = f"{FABRIC}/Zones/2"
    r = conn.get(zone2)
    etag = r.headers.get("ETag")
    if not etag:
        fail("the zone has no ETag")
    pf = next(e for e in targets if e.json.get("Oem", {}).get("Pcifab", {}).get("PhysicalFunction") is None)
    eps = r.json()["Links"]["Endpoints"] + [{"@odata.id": pf.path}]
    r = conn.patch(zone2, data={"Links": {"Endpoints": eps}}, headers={"If-Match": etag})
    after = [e["@odata.id"] for e in r.json()["Links"]["Endpoints"]]
    if after != [f"{FABRIC}/Endpoints/host2", pf.path]:
        fail(f"zone 2 after the PATCH: {after}")
    if conn.get(pf.path).json()["Links"]["Zones"] != [{"@odata.id": zone2}]:
        fail(f"{pf.path} is not in zone 2 after the PATCH")

    # The old ETag is stale now: 412, and nothing changes.
    try:
        conn.patch(zone2, data={"Links": {"Endpoints": []}}, headers={"If-Match": etag})
        fail("a PATCH with a stale If-Match was applied")
    except exceptions.HTTPError as e:
        if e.status_code != 412:
            fail(f"a PATCH with a stale If-Match: HTTP {e.status_code}, expected 412")
    if [e["@odata.id"] for e in conn.get(zone2).json()["Links"]["Endpoints"]] != after:
        fail("a refused PATCH changed zone 2")

    # Log out: the session's token no longer opens anything.
    auth.close()
    r = requests.get(f"{url}{FABRIC}", headers={"X-Auth-Token": token}, verify=cafile)
    if r.status_code != 401:
        fail(f"the token of a closed session: HTTP {r.status_code}, expected 401")
    print(f"sushy client: {len(endpoints)} endpoints, {len(zone_ids)} zones, composed {pf.path} into zone 2, logged out")


if __name__ == "__main__":
    main()
