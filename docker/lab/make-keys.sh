#!/usr/bin/env bash
# Keys of the compose `lab` profile, made once on the machine that runs docker compose:
#   keys/<host>/ssh_host_ed25519_key   each lab host's own host key (mounted into that container only)
#   keys/<host>/authorized_keys        the client's public key
#   keys/client_ed25519                the key the controller (worker) logs in with
#   keys/known_hosts                   every lab host's key, pinned: alignflow rejects any other (never auto-adds)
# Nothing here is a secret worth keeping: the lab is for trying the pipeline over SSH, not for real hosts.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p keys
[ -f keys/client_ed25519 ] || ssh-keygen -q -t ed25519 -N '' -C alignflow-lab-client -f keys/client_ed25519
# The worker runs as another uid than the file's owner; OpenSSH only refuses group/world-readable keys that the
# *current* user owns, so the lab key is made readable for the container.
chmod 644 keys/client_ed25519
: > keys/known_hosts
for host in lab-ascend lab-cpu lab-cuda; do
  mkdir -p "keys/$host"
  [ -f "keys/$host/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "$host" -f "keys/$host/ssh_host_ed25519_key"
  cp keys/client_ed25519.pub "keys/$host/authorized_keys"
  echo "$host $(cut -d' ' -f1,2 "keys/$host/ssh_host_ed25519_key.pub")" >> keys/known_hosts
done
echo "lab keys in $(pwd)/keys"
