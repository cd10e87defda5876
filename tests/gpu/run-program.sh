#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/gpu/run-program.sh PROGRAM [ARGS...] - how meson runs each compiled
# GPU test: exit 77 (skip) when the program cannot even be loaded here
# because a library it links is missing (libcuda.so.1 on a machine without
# the driver, libcudart.so.13 without the toolkit), otherwise run it in
# place (exec: same environment, same exit status).
prog=$1
missing=$(env -u LD_PRELOAD ldd "$prog" 2>/dev/null | awk '/=> not found/ {print $1}' | tr '\n' ' ')
if [ -n "$missing" ]; then
	echo "skip: $(basename "$prog") needs ${missing}which is not installed here"
	exit 77
fi
exec "$@"
