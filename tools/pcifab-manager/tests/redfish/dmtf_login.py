#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-only
"""Logs in to the manager's Redfish service with DMTF's `redfish` library as its users do:
login() with a session, then with HTTP Basic; each reads the zones; the session's logout()
ends it (its token is refused afterwards). Exits non-zero, saying what differed.

usage: dmtf_login.py URL CAFILE USER PASSWORD
"""
import sys

import redfish
import requests


def fail(msg):
    print(f"redfish library: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    url, cafile, user, password = sys.argv[1:5]
    zones = "/redfish/v1/Fabrics/PCIe/Zones"
    for auth in ("session", "basic"):
        c = redfish.redfish_client(base_url=url, username=user, password=password, cafile=cafile)
        c.login(auth=auth)
        r = c.get(zones)
        if r.status != 200 or not r.dict.get("Members"):
            fail(f"{auth} login: GET {zones}: HTTP {r.status} {r.text}")
        token = c.get_session_key() if auth == "session" else None
        if auth == "session" and not token:
            fail("login(auth='session') opened no session")
        c.logout()
        if token:
            r = requests.get(f"{url}{zones}", headers={"X-Auth-Token": token}, verify=cafile)
            if r.status_code != 401:
                fail(f"the token of a logged-out session: HTTP {r.status_code}, expected 401")
    print("redfish library: session and Basic logins read the zones; logout ends the session")


if __name__ == "__main__":
    main()
