#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Checks the manager's Redfish service with DMTF's tools and a standard client
# (Documentation/manager-api.rst, "Redfish conformance"):
#   1. DMTF's Redfish Protocol Validator (rf_protocol_validator): any FAIL fails this script;
#   2. OpenStack's sushy with its default (session) authentication: reads the fabric, its
#      endpoints and zones, composes by a zone PATCH with If-Match, and logs out;
#   3. DMTF's redfish library's login() with a session and with Basic, and logout().
# The manager runs natively on a loopback port with its simulated executor, a throwaway
# certificate and a throwaway credentials file, all in a temporary directory removed at the
# end. The Python tools live in a virtual environment in $PCIFAB_CACHE/venv-redfish, at the
# pinned versions below.
#
# usage: redfish-check.sh [MANAGER_BINARY]   (default: $PCIFAB_MANAGER_BIN, else cargo builds one)
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
VENV=$CACHE/venv-redfish
PINS="redfish-protocol-validator==1.3.2 sushy==5.14.0 redfish==3.4.2"
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=$(cd "$HERE/.." && pwd)

say() { printf 'redfish-check: %s\n' "$*" >&2; }
die() { printf 'redfish-check: error: %s\n' "$*" >&2; exit 1; }

# The virtual environment, made again when the pins change.
if [ "$(cat "$VENV/.pins" 2>/dev/null)" != "$PINS" ]; then
	say "installing $PINS into $VENV"
	rm -rf "$VENV"
	python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
	# shellcheck disable=SC2086
	"$VENV/bin/pip" install -q --disable-pip-version-check $PINS \
		|| die "pip cannot install $PINS from PyPI: check the network"
	printf '%s' "$PINS" >"$VENV/.pins"
fi

BIN=${1:-${PCIFAB_MANAGER_BIN:-}}
if [ -z "$BIN" ]; then
	cargo build -q --manifest-path "$TOOLS/Cargo.toml" -p pcifab-manager
	BIN=${CARGO_TARGET_DIR:-$TOOLS/target}/debug/pcifab-manager
fi
[ -x "$BIN" ] || die "$BIN is not an executable pcifab-manager"

DIR=$(mktemp -d /tmp/pcifab-redfish-check.XXXXXX)
PID=
cleanup() {
	if [ -n "$PID" ]; then
		kill "$PID" 2>/dev/null || true
		wait "$PID" 2>/dev/null || true
	fi
	rm -rf "$DIR"
}
trap cleanup EXIT

# A throwaway CA and server certificate for 127.0.0.1.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
	-subj "/CN=redfish-check CA" -keyout "$DIR/ca.key" -out "$DIR/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
	-keyout "$DIR/server.key" -out "$DIR/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' >"$DIR/ext"
openssl x509 -req -in "$DIR/server.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
	-CAcreateserial -days 1 -extfile "$DIR/ext" -out "$DIR/server.crt" 2>/dev/null

# The users: an admin (the validator, sushy) and a reader (the validator's 403 checks).
PASS=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
RPASS=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
{
	printf '[[users]]\nname = "ops"\npassword_pbkdf2 = "%s"\n\n' \
		"$(printf '%s\n' "$PASS" | "$BIN" --hash-password --iterations 10000)"
	printf '[[users]]\nname = "watcher"\npassword_pbkdf2 = "%s"\n' \
		"$(printf '%s\n' "$RPASS" | "$BIN" --hash-password --iterations 10000)"
} >"$DIR/users.toml"

cat >"$DIR/manager.toml" <<EOF
[manager]
hosts = 3
default_lease_s = 600
max_lease_s = 3600

[[pools]]
name = "gpus"
mode = "hybrid"

[[pools.devices]]
pf = 0x0120
vfs = [0x0121, 0x0122]
profile = "half"

[[pools.devices]]
pf = 0x0140
vfs = [0x0141, 0x0142]
profile = "half"

[api]
listen = "127.0.0.1:0"
cert = "$DIR/server.crt"
key = "$DIR/server.key"

[api.redfish]
users = "$DIR/users.toml"
session_timeout_s = 300

[[principals]]
name = "ops"
role = "admin"

[[principals]]
name = "watcher"
role = "reader"
EOF

"$BIN" --config "$DIR/manager.toml" --state "$DIR/state" --socket "$DIR/manager.sock" \
	--executor sim 2>"$DIR/manager.log" &
PID=$!
URL=
for _ in $(seq 100); do
	URL=$(sed -n 's|.*API on \(https://[0-9.:]*\)/v1.*|\1|p' "$DIR/manager.log")
	[ -n "$URL" ] && break
	kill -0 "$PID" 2>/dev/null || { cat "$DIR/manager.log" >&2; die "the manager did not start"; }
	sleep 0.1
done
[ -n "$URL" ] || { cat "$DIR/manager.log" >&2; die "the manager did not listen within 10 s"; }
say "manager on $URL"

# requests lets REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE override a session's own CA file.
unset REQUESTS_CA_BUNDLE CURL_CA_BUNDLE

# 1. DMTF's protocol validator.
mkdir -p "$DIR/report"
"$VENV/bin/rf_protocol_validator" -r "$URL" -u ops -p "$PASS" --ca-bundle "$DIR/ca.crt" \
	--report-dir "$DIR/report" --report-type tsv >"$DIR/validator.out" 2>&1 \
	|| { cat "$DIR/validator.out" >&2; die "rf_protocol_validator did not run to its end"; }
cat "$DIR/validator.out"
TSV=$(ls "$DIR"/report/*.tsv 2>/dev/null | head -1)
[ -n "$TSV" ] || die "rf_protocol_validator wrote no report"
count() { awk -F'\t' -v r="$1" 'NR > 1 && $5 == r' "$TSV" | wc -l; }
PASSES=$(count PASS); WARNS=$(count WARN); FAILS=$(count FAIL); NOT_TESTED=$(count NOT_TESTED)
echo "rf_protocol_validator: $PASSES passed, $WARNS warnings, $FAILS failed, $NOT_TESTED not tested"
if [ "$FAILS" -ne 0 ]; then
	awk -F'\t' 'NR == 1 || $5 == "FAIL"' "$TSV" >&2
	die "rf_protocol_validator found $FAILS failures"
fi

# 2. sushy, as an operator's script would use it.
"$VENV/bin/python3" "$TOOLS/pcifab-manager/tests/redfish/sushy_client.py" \
	"$URL" "$DIR/ca.crt" ops "$PASS" || die "the sushy client failed (above)"
# 3. DMTF's redfish library logging in.
"$VENV/bin/python3" "$TOOLS/pcifab-manager/tests/redfish/dmtf_login.py" \
	"$URL" "$DIR/ca.crt" ops "$PASS" || die "the redfish library's login failed (above)"
if grep -q "panicked" "$DIR/manager.log"; then
	cat "$DIR/manager.log" >&2
	die "the manager panicked"
fi
echo "redfish-check: 3 passed, 0 failed"
