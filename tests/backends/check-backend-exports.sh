#!/bin/sh
# check-backend-exports.sh NM LIB: LIB's dynamic symbol table defines
# emm_backend_get and nothing else.
set -eu
nm=$1 lib=$2
syms=$("$nm" -D --defined-only "$lib" | awk '{print $NF}' | sort)
if [ "$syms" != "emm_backend_get" ]; then
	echo "$lib exports:" >&2
	echo "$syms" >&2
	echo "expected only emm_backend_get" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
echo "1 passed, 0 failed"
