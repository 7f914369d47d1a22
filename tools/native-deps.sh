#!/usr/bin/env bash
# The header the KV tiers' compiled copy-and-checksum is built on (worker/kvtier/native):
# xxhash.h, from Debian's libxxhash-dev. Installed with apt where this machine has apt and may
# use it (root, or sudo without a password); elsewhere it says what to install, and the tiers
# take their Python path, as without a C compiler. Never fails the build; a no-op once present.
set -uo pipefail
PACKAGE=libxxhash-dev

found() {
  local dir
  local paths="${C_INCLUDE_PATH:-}:${CPATH:-}"
  for dir in ${paths//:/ } /usr/local/include /usr/include; do
    if [ -f "$dir/xxhash.h" ]; then echo "$dir/xxhash.h"; return 0; fi
  done
  return 1
}

if header=$(found); then echo "native-deps: $header"; exit 0; fi
missing="native-deps: no xxhash.h (the KV tiers' copies take the Python path until it is there)"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "$missing; install xxhash's development header ($PACKAGE, xxhash-devel, xxhash)"
  exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! sudo -n true 2>/dev/null; then
    echo "$missing; run: sudo apt-get install $PACKAGE"
    exit 0
  fi
  as_root=(sudo -n)
fi
echo "native-deps: apt-get install $PACKAGE"
if ! "${as_root[@]}" apt-get install -y -q "$PACKAGE" >/dev/null 2>&1; then
  "${as_root[@]}" apt-get update -q >/dev/null 2>&1
  "${as_root[@]}" apt-get install -y -q "$PACKAGE" >/dev/null 2>&1
fi
if header=$(found); then echo "native-deps: $header"; else echo "$missing; apt-get could not install $PACKAGE"; fi
exit 0
