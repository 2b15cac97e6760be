#!/bin/bash
# A private CA, one certificate for the cluster's nodes and the two tokens, with openssl:
#
#   deploy/make_certs.sh DIR [NAME...]
#
# NAMEs are the host names and IP addresses the nodes are dialled by (default: localhost
# 127.0.0.1); the certificate carries them all, for TLS server and client use (mutual TLS).
# Writes, in DIR: ca.pem (give it to every process as --tls_ca), ca.key (keep it offline:
# it signs certificates), node.pem and node.key (--tls_cert, --tls_key), cluster.token
# (--token_file) and admin.token (--admin_token_file). Keys and tokens are mode 0600.
# Existing files are kept: run it on a fresh DIR to start over.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME...]   (NAME: host name or IP the nodes are dialled by)" >&2
  exit 2
fi
dir=$1
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1)
command -v openssl >/dev/null || { echo "$0: needs openssl (apt-get install openssl)" >&2; exit 2; }
mkdir -p "$dir"
umask 077
cd "$dir"

san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}

if [ ! -e ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
    -subj "/CN=pscluster CA" -keyout ca.key -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi
if [ ! -e node.pem ]; then
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=pscluster node" \
    -keyout node.key -out node.csr 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" > node.ext
  openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
    -extfile node.ext -out node.pem 2>/dev/null
  rm -f node.csr node.ext ca.srl
fi
[ -e cluster.token ] || openssl rand -hex 32 > cluster.token
[ -e admin.token ] || openssl rand -hex 32 > admin.token
chmod 0644 ca.pem node.pem
echo "certificates for ${names[*]} and tokens in $dir:"
echo "  --tls_ca=$dir/ca.pem --tls_cert=$dir/node.pem --tls_key=$dir/node.key"
echo "  --token_file=$dir/cluster.token [--admin_token_file=$dir/admin.token]"
