#!/bin/sh
# Write the Secrets' files that base/kustomization.yaml's secretGenerator reads: the tokens'
# signing key and coturn's shared secret, 32 random bytes each, hex. Existing files are kept
# (rotate by deleting one and applying again: the Secret's name changes and the pods roll).
set -eu
dir="${1:-$(dirname "$0")/base/secrets}"
mkdir -p "$dir"
umask 077
for name in jwt-secret turn-secret; do
  if [ ! -s "$dir/$name" ]; then
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$dir/$name"
    echo "wrote $dir/$name"
  fi
done
