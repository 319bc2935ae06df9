#!/usr/bin/env bash
# Dead-code check (make lint). Two whole-program reachability runs of
# golang.org/x/tools/cmd/deadcode, from the main packages:
#   - without tests: every function must be reached by a program, except in
#     test-support packages (import paths ending in "test": meshtest,
#     onnxtest, ...) and the entries of scripts/deadcode-allow.txt. So an
#     exported function only tests call is reported: delete it or move it
#     into a _test.go file.
#   - with tests: nothing at all may be unreachable (a test-support helper
#     no test calls any more).
# Generated code (proto/gen) is left out by deadcode itself.
set -euo pipefail
cd "$(dirname "$0")/.."
allow=scripts/deadcode-allow.txt
fmt='{{range .Funcs}}{{printf "%s.%s %s\n" $.Path .Name .Position}}{{end}}'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
deadcode -f "$fmt" ./... >"$tmp/prod" &
prod=$!
deadcode -test -f "$fmt" ./... >"$tmp/test" &
test=$!
# Each wait on its own line: set -e stops at a run that failed (a missing
# tool among them), which an && list would let through as "clean".
wait "$prod"
wait "$test"
# Allowlist: one "package/path.Func" per line; '#' starts a comment.
sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$allow" | sort -u >"$tmp/allow"
awk '{print $1}' "$tmp/prod" | grep -v -E '^[^ ]*test\.' | sort -u | comm -23 - "$tmp/allow" >"$tmp/bad" || true
cat "$tmp/test" | awk '{print $1}' | sort -u >>"$tmp/bad"
# An allowlist entry nothing needs any more is an error too.
awk '{print $1}' "$tmp/prod" | sort -u | comm -13 - "$tmp/allow" >"$tmp/stale" || true
status=0
if [ -s "$tmp/bad" ]; then
  echo "deadcode: unreachable functions (delete them, move them into a _test.go file, or allow them in $allow with a reason):"
  grep -F -f "$tmp/bad" "$tmp/prod" "$tmp/test" | sed 's/^[^:]*://' | sort -u
  status=1
fi
if [ -s "$tmp/stale" ]; then
  echo "deadcode: $allow lists functions that are reachable or gone:"
  cat "$tmp/stale"
  status=1
fi
[ "$status" = 0 ] && echo "deadcode: clean"
exit "$status"
