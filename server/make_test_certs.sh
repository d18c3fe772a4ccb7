#!/usr/bin/env bash
# Make TLS material for testing a coordinator on this machine (never for production):
#
#   server/make_test_certs.sh [OUT_DIR]        (default OUT_DIR: ./certs)
#
# writes, all PEM:
#   ca.pem / ca.key          a throwaway local certificate authority
#   server.pem / server.key  the coordinator's certificate, for localhost / 127.0.0.1 / ::1 (SAN)
#   client.pem / client.key  a client certificate (CN "fedlink-client") for mutual TLS
#
# Needs the openssl command line tool. Keys are unencrypted and certificates last 30 days.
set -euo pipefail

out="${1:-certs}"
days=30
mkdir -p "$out"
cd "$out"
umask 077

openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
    -keyout ca.key -out ca.pem -subj "/CN=fedlink test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

issue() {  # issue NAME CN EXTENSIONS
    local name="$1" cn="$2" ext="$3"
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$name.key" -out "$name.csr" \
        -subj "/CN=$cn" 2>/dev/null
    printf '%s\n' "$ext" > "$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days "$days" -sha256 -out "$name.pem" -extfile "$name.ext" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

issue server localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
issue client fedlink-client "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
rm -f ca.srl
chmod 644 ./*.pem
echo "wrote ca.pem, server.pem/.key and client.pem/.key to $(pwd)"
