#!/usr/bin/env bash
# Put the sglang-xpu series into an installed sglang: the whole of what
# docker/Dockerfile does in the image, kept in one script so CI runs it against a
# real pip installation (no container runtime can pull the XPU image there).
#
#   docker/install-fork.sh [--python PY | --into SITE] [--upstream VERSION]
#                          [--revision REV] [--bin DIR]
#
# --python PY   the Python whose sglang gets the series (default: python3 on PATH)
# --into SITE   or name the site-packages folder directly
# --upstream V  the sglang release the install must be (a mismatch fails, exit 4)
# --revision R  the sglang-xpu revision to record in the provenance
# --bin DIR     also install an `xpu-series` launcher there (the tool needs nothing
#               but the Python that runs it)
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=python3
where=()
args=()
bindir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=$2; where=(--python "$2"); shift 2 ;;
    --into) where=(--into "$2"); shift 2 ;;
    --upstream | --revision) args+=("$1" "$2"); shift 2 ;;
    --bin) bindir=$2; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; echo "hint: see $0 --help" >&2; exit 2 ;;
  esac
done
[ ${#where[@]} -gt 0 ] || where=(--python "$python")

tool() { PYTHONPATH="$src/python" "$python" -m xpu_series -C "$src" "$@"; }

# The overlay checks the release and every file it patches before it writes.
tool overlay "${where[@]}" "${args[@]}"
tool overlay --status "${where[@]}"

if [ -n "$bindir" ]; then
  mkdir -p "$bindir"
  launcher="$bindir/xpu-series"
  printf '#!/bin/sh\n# sglang-xpu: the xpu-series tool, from %s\nPYTHONPATH="%s/python" exec "%s" -m xpu_series "$@"\n' \
    "$src" "$src" "$(command -v "$python" || echo "$python")" >"$launcher.tmp"
  chmod 755 "$launcher.tmp"
  mv "$launcher.tmp" "$launcher"
  echo "installed $launcher"
fi
