# Shared helpers of the scripts/assets*.sh scripts, which source this file
# after setting:
#   CACHE       the cache root (npm tarballs go to $CACHE/npm)
#   sums        the sha256 sums file, lines "SUM  KEY"
#   assets_tag  the prefix of error messages (the script's name)

check() { # check FILE KEY: compare with the recorded sum
  local want got
  want=$(awk -v k="$2" '$2==k {print $1}' "$sums")
  [ -n "$want" ] || { echo "$assets_tag: no recorded sha256 for $2" >&2; return 1; }
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "$assets_tag: sha256 mismatch for $2: want $want got $got" >&2; return 1; }
}

ok() { check "$1" "$2" >/dev/null 2>&1; } # ok FILE KEY: check, quietly

pack() { # pack NAME VERSION TGZ -> path of the verified tarball in the cache
  local tgz="$CACHE/npm/$3"
  if [ ! -f "$tgz" ] || ! ok "$tgz" "$3"; then
    rm -f "$tgz"
    (cd "$CACHE/npm" && npm pack --silent "$1@$2" >/dev/null 2>&1)
    check "$tgz" "$3"
  fi
  echo "$tgz"
}
