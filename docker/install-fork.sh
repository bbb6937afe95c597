#!/usr/bin/env bash
# Put the sglang-xpu series into an installed sglang: the whole of what
# docker/Dockerfile does in the image, kept in one script so CI runs it against a
# real pip installation (no container runtime can pull the XPU image there).
#
#   docker/install-fork.sh [--mode overlay|wheel] [--python PY | --into SITE]
#                          [--upstream VERSION] [--revision REV] [--wheels DIR]
#                          [--bin DIR]
#
# --mode M      overlay (default): rewrite the files the series changes inside the
#               installed sglang, each checked against the release first;
#               wheel: `pip install --no-deps` the fork wheel for PY's CPython
#               tag over the installed sglang: the one in --wheels whose label is
#               the series', else one built here with `xpu-series wheel`
#               (release wheel fetched and hash-checked; needs git and the
#               package index)
# --python PY   the Python whose sglang gets the series (default: python3 on PATH)
# --into SITE   or name the site-packages folder directly (overlay only)
# --upstream V  the sglang release (overlay: the install must be it, else exit 4;
#               wheel: default the installed release, else the pin)
# --revision R  the sglang-xpu revision to record in the provenance
# --wheels DIR  where prebuilt fork wheels are (`xpu-series wheel --out DIR`);
#               a wheel of another series or Python is not used
# --bin DIR     also install an `xpu-series` launcher there (the tool needs nothing
#               but the Python that runs it)
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=python3
mode=overlay
where=()
args=()
upstream=""
bindir=""
wheels=""
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) mode=$2; shift 2 ;;
    --python) python=$2; where=(--python "$2"); shift 2 ;;
    --into) where=(--into "$2"); shift 2 ;;
    --upstream) upstream=$2; args+=("$1" "$2"); shift 2 ;;
    --revision) args+=("$1" "$2"); shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --bin) bindir=$2; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; echo "hint: see $0 --help" >&2; exit 2 ;;
  esac
done
[ ${#where[@]} -gt 0 ] || where=(--python "$python")

tool() { PYTHONPATH="$src/python" "$python" -m xpu_series "$@"; }

case "$mode" in
  overlay)
    # The overlay checks the release and every file it patches before it writes.
    tool -C "$src" overlay "${where[@]}" "${args[@]}"
    tool -C "$src" overlay --status "${where[@]}"
    ;;
  wheel)
    if [ "${where[0]}" = --into ]; then
      echo "error: --mode wheel installs with pip: name the Python with --python" >&2
      exit 2
    fi
    if [ -z "$upstream" ]; then
      # The release the image has, so the fork replaces it with the same release.
      upstream=$("$python" -c 'import importlib.metadata as m
try:
    print(m.version("sglang").split("+")[0])
except m.PackageNotFoundError:
    pass')
      [ -z "$upstream" ] || args+=(--upstream "$upstream")
    fi
    # The series' label for that release, and the tag of PY's CPython: a wheel
    # whose name carries both is this series for this Python.
    label=$(tool -C "$src" --json overlay --describe "${args[@]}" |
      "$python" -c 'import json, sys; print(json.load(sys.stdin)["version"])')
    tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    built=""
    if [ -n "$wheels" ]; then
      for found in "$wheels/sglang-$label-$tag-$tag-"*.whl; do
        [ -f "$found" ] && built=$found && break
      done
    fi
    if [ -n "$built" ]; then
      echo "installing the prebuilt fork wheel $(basename "$built")"
    else
      [ -z "$wheels" ] || echo "no sglang-$label-$tag wheel in $wheels: building it"
      # Built in a copy of patches/, so its scratch tree and release wheel stay
      # out of this checkout (and out of the image).
      work=$(mktemp -d)
      trap 'rm -rf "$work"' EXIT
      cp -r "$src/patches" "$work/patches"
      case " ${args[*]} " in
        *" --revision "*) ;;
        *) args+=(--revision "$(git -C "$src" rev-parse HEAD 2>/dev/null || true)") ;;
      esac
      if ! built=$(tool -C "$work" --json wheel --python "$python" \
        --out "$work/wheels" "${args[@]}" |
        "$python" -c 'import json, sys; print(json.load(sys.stdin).get("path", ""))'); then
        echo "hint: build it where the package index is reachable:" \
          "xpu-series wheel --python-tag $tag --out docker/wheels," \
          "then build the image again" >&2
        exit 1
      fi
    fi
    "$python" -m pip install --no-deps --disable-pip-version-check "$built"
    # The installed version must be the wheel's, and its plugin must say so.
    "$python" - "$label" <<'PY'
import importlib.metadata, sys

want = sys.argv[1]
have = importlib.metadata.version("sglang")
if have != want:
    sys.exit(f"error: pip installed sglang {have}, not the fork wheel's {want}")
import sglang_xpu_series

sglang_xpu_series.announce()
print(f"installed sglang {have}")
PY
    ;;
  *) echo "error: --mode is overlay or wheel, not $mode" >&2; exit 2 ;;
esac

if [ -n "$bindir" ]; then
  mkdir -p "$bindir"
  launcher="$bindir/xpu-series"
  printf '#!/bin/sh\n# sglang-xpu: the xpu-series tool, from %s\nPYTHONPATH="%s/python" exec "%s" -m xpu_series "$@"\n' \
    "$src" "$src" "$(command -v "$python" || echo "$python")" >"$launcher.tmp"
  chmod 755 "$launcher.tmp"
  mv "$launcher.tmp" "$launcher"
  echo "installed $launcher"
fi
