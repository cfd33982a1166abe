#!/bin/sh
# Write the Secrets' files that base/kustomization.yaml's secretGenerator reads: the tokens'
# signing key and coturn's shared secret, 32 random bytes each, hex. Existing files are kept
# (rotate by deleting one and applying again: the Secret's name changes and the pods roll).
# Another directory as the first argument: docker/secrets for docker/compose.yaml. The directory
# is the owner's alone; the files in it are readable by all, because Compose mounts them as they
# are into containers that run as other users (signaling 10001, coturn nobody).
set -eu
dir="${1:-$(dirname "$0")/base/secrets}"
mkdir -p "$dir"
chmod 700 "$dir"
for name in jwt-secret turn-secret; do
  if [ ! -s "$dir/$name" ]; then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$dir/$name")
    chmod 644 "$dir/$name"
    echo "wrote $dir/$name"
  fi
done
