#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Frees of a driver component's memory, seen from outside the program.

usage: check-driver-component.py TEST_SHIMS_DRIVER_COMPONENT LIBNVCUVID_DOUBLE

Runs test_shims_driver_component (LD_PRELOAD and LD_LIBRARY_PATH from the
environment, as meson sets them) three times and reads its stderr:
EMM_STATS=1 shows the "driver components" row with its calls and bytes
next to the one unknown free the program made itself; EMM_STATS=json has
passby_driver_calls/_bytes in the "all" row; EMM_VERBOSE=2 prints the
lines that found the path: the resolver substituting libemm's shim for the
library's dlsym and cuGetProcAddress lookups, and each foreign free with
its caller library (the library's marked as a driver component's, the
program's not).
"""
import json
import os
import re
import subprocess
import sys

failures = 0


def check(cond, what, detail=""):
    global failures
    if cond:
        print("ok:", what)
    else:
        failures += 1
        print("FAIL:", what)
        if detail:
            print(detail)


def run(prog, lib, env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("EMM_")}
    e.update(env)
    p = subprocess.run([prog, lib], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    check(p.returncode == 0, "the program passes under %s" % env, p.stdout + p.stderr)
    return p.stderr


def main():
    prog, lib = sys.argv[1], sys.argv[2]
    # 160 KiB + 240 KiB + 1200 KiB device, 64 KiB pinned (test_component_frees), and the
    # 160 KiB test_component_refused_free frees before its refused frees
    total = (160 + 240 + 1200 + 64) << 10

    err = run(prog, lib, {"EMM_STATS": "1"})
    check(re.search(r"passed by +driver components +5 calls +1\.8 MiB \(libnvcuvid: NVDEC, nvJPEG's hardware "
                    r"path", err), "table: the driver-components row, 5 calls and their bytes", err)
    check(re.search(r"passed by +unknown frees +1 calls \(sizes are the driver's\)", err),
          "table: the program's own free of such memory stays an unknown free", err)

    err = run(prog, lib, {"EMM_STATS": "json"})
    lines = [l for l in err.splitlines() if l.startswith('{"schema":"emm-stats"')]
    check(len(lines) == 1, "json: one statistics line", err)
    if lines:
        doc = json.loads(lines[0])
        a = doc["all"]
        check(doc["stats_version"] == 5, "json: stats_version 5", str(doc["stats_version"]))
        check(a["passby_driver_calls"] == 5 and a["passby_driver_bytes"] == total + (160 << 10) and
              a["passby_unknown_free_calls"] == 1, "json: the all row's driver-component fields", str(a))
        check(all(d["passby_driver_calls"] == 0 for d in doc["devices"]),
              "json: a device row carries none", str(doc["devices"]))

    err = run(prog, lib, {"EMM_VERBOSE": "2"})
    name = re.escape(os.path.basename(lib))
    check(re.search(r'resolve: dlsym\("cuMemFree_v2"\) from \S*%s -> libemm\'s shim' % name, err),
          "verbose: the library's dlsym of cuMemFree_v2 got libemm's shim", err)
    check(re.search(r'resolve: cuGetProcAddress_v2\("cuMemFreeHost", 12000\) from \S*%s: cuMemFreeHost '
                    r'-> libemm\'s shim' % name, err),
          "verbose: the library's cuGetProcAddress_v2 of cuMemFreeHost got libemm's shim", err)
    check(not re.search(r'resolve: dlsym\("cuGetExportTable"\) from \S*%s -> ' % name, err),
          "verbose: cuGetExportTable is the driver's (no shim)", err)
    comp = re.findall(r"free of 0x[0-9a-f]+, not libemm's, from \S*%s: memory type ([12]), .*range "
                      r"0x[0-9a-f]+\+(\d+), .*; a driver component's" % name, err)
    check(sorted(int(s) for _, s in comp) == sorted([160 << 10, 160 << 10, 240 << 10, 1200 << 10, 64 << 10]),
          "verbose: the library's five foreign frees, marked a driver component's, with the driver's sizes",
          err)
    check([t for t, s in comp if int(s) != 64 << 10] == ["2"] * 4,
          "verbose: the device frees have memory type 2 (device)", str(comp))
    prog_name = re.escape(os.path.basename(prog))
    check(re.search(r"free of 0x[0-9a-f]+, not libemm's, from \S*%s: memory type 2, [^;\n]*$" % prog_name, err,
                    re.M), "verbose: the program's own foreign free, not marked", err)
    # (the driver answers an unknown pointer's attributes with type 0, no range)
    refused = re.findall(r"free of 0x[0-9a-f]+, not libemm's, from \S*%s: memory type 0, .*range 0\+0, " % name,
                         err)
    check(len(refused) == 2, "verbose: the two refused frees, of memory the driver does not know", err)

    print("%d failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
