#!/bin/sh
# Toolchain of the Metal emulator (test-only; never part of the product):
# clang with GCC's Objective-C runtime, GNUstep Foundation and the blocks
# runtime. Idempotent: installs only what is missing, quietly.
set -eu
pkgs="clang libobjc4 libgnustep-base-dev libblocksruntime-dev gnustep-make"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
