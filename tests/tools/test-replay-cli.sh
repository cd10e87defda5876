#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tools/test-replay-cli.sh EMM_REPLAY DATADIR - the emm-replay command
# as a user meets it: the report on the bundled traces, a failure's
# description and exit status, --min-capacity's answer checked by replaying
# at it and one step below, --compare's table, --timeline, --snapshot, bad
# input, the simulated vmm backend, simulated fences.
# Ends with "N passed, N failed, N skipped".
R=$1
D=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-replay-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
# EMM_* of the caller's environment would change the numbers.
for v in $(env | sed -n 's/^\(EMM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; [ -f "$tmp/out" ] && sed 's/^/  | /' "$tmp/out"; }
# run EXPECTED_STATUS ARGS...: output (stdout and stderr) in $tmp/out
run() {
	want=$1
	shift
	"$R" "$@" >"$tmp/out" 2>&1
	rc=$?
	[ "$rc" -eq "$want" ]
}
has() { grep -q -- "$1" "$tmp/out"; }
peak_of() { sed -n 's/^peak reserved .*(\([0-9]*\) B).*/\1/p' "$tmp/out"; }

if run 0 "$D/synthetic-train.csv" && has '^peak allocated ' && has '^peak reserved ' &&
	has '^fragmentation ' && has '^backend calls ' && has '^ops/s ' && has '4 threads' &&
	has '1 failed here too'; then
	ok "synthetic trace replays, with every report line"
else bad "synthetic trace report"; fi

if run 0 --one-thread "$D/rmm-sample.csv" && has 'untraced frees   2 ' && has '2 threads, 2 streams' &&
	has '1 failed here too, 0 succeeded'; then
	ok "RMM sample: (nil), hex streams, untraced frees"
else bad "RMM sample"; fi

if run 0 --capacity 128G "$D/rmm-sample.csv" && has '1 succeeded here'; then
	ok "a traced failure that succeeds on a bigger device is counted"
else bad "unexpected success"; fi

if run 1 --capacity 16M "$D/synthetic-train.csv" &&
	grep -q '^emm-replay: FAILED at line [0-9]* (event [0-9]* of [0-9]*): thread [0-9]*, allocate of [0-9]* B: out of memory' "$tmp/out" &&
	has 'live as asked' && has 'reserved, largest free block'; then
	ok "failure: exit 1 with line, thread, size, live and reserved bytes"
else bad "failure report"; fi

# --min-capacity: the answer must replay and one step below must not.
if run 0 --min-capacity --step 1M "$D/rmm-sample.csv" && has '^check            replays at' &&
	has '^check            fails at'; then
	min=$(sed -n 's/^minimum capacity \([0-9]*\) MiB.*/\1/p' "$tmp/out")
	if [ -n "$min" ] && run 0 --capacity "${min}M" "$D/rmm-sample.csv" &&
		run 1 --capacity "$((min - 1))M" "$D/rmm-sample.csv"; then
		ok "--min-capacity: ${min} MiB replays, $((min - 1)) MiB does not"
	else bad "--min-capacity answer ${min:-none} does not check out"; fi
else bad "--min-capacity"; fi

if run 0 --compare default 'EMM_ARENAS=1' 'EMM_LARGE_SEGMENT=40M EMM_SMALL_SEGMENT=4M' "$D/synthetic-train.csv" &&
	has '^| setting | peak allocated | peak reserved | fragmentation at peak | backend allocs | backend frees | ops/s | result |$' &&
	[ "$(grep -c '^| `' "$tmp/out")" -eq 3 ] && has '^| `EMM_ARENAS=1` | .* | ok |$'; then
	ok "--compare prints one Markdown table, a row per setting"
else bad "--compare"; fi

if run 2 --compare 'EMM_ARENAS=100' "$D/rmm-sample.csv" && has 'EMM_ARENAS=100'; then
	ok "--compare refuses an invalid value"
else bad "--compare invalid value"; fi

if run 2 --compare 'EMM_ARENA=1' "$D/rmm-sample.csv" && has 'did you mean EMM_ARENAS'; then
	ok "--compare refuses an unknown name and suggests the near one"
else bad "--compare unknown name"; fi

if run 0 --timeline "$tmp/tl.csv" "$D/rmm-sample.csv" &&
	[ "$(head -1 "$tmp/tl.csv")" = "Line,Time,Thread,Action,Size,Requested,Allocated,Reserved" ] &&
	[ "$(wc -l <"$tmp/tl.csv")" -eq 26 ]; then
	ok "--timeline writes one row per event"
else bad "--timeline"; fi

printf 'Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1000,512,0x0\n1,1.1,allocate,0x2000\n' >"$tmp/bad.csv"
if run 2 "$tmp/bad.csv" && has "bad.csv:3: expected 6 or 7 comma-separated columns"; then
	ok "a malformed line is named by file and line"
else bad "malformed trace"; fi

if run 0 --help && has '^usage: emm-replay' && run 2 --frobnicate "$D/rmm-sample.csv" && has "unknown option '--frobnicate'" &&
	run 2 && has '^usage:' && run 2 --capacity 12Q "$D/rmm-sample.csv" && has 'wants a size'; then
	ok "usage: --help, unknown option, no trace, bad size"
else bad "usage"; fi

# --snapshot: PyTorch's snapshot format (tests/obs/snapshot_check.py), the
# replayed events as trace entries; a failed replay's ends with an 'oom'.
snapcheck() { # FILE MIN_ENTRIES ACTION (one of the entries) [last: the last one]
	python3 - "$D/../obs" "$@" <<'PY'
import pickle, sys
sys.path.insert(0, sys.argv[1])
import snapshot_check
s = pickle.load(open(sys.argv[2], "rb"))
bad = snapshot_check.problems(s)
trace = s["device_traces"][0]
acts = [e["action"] for e in trace]
want = acts[-1:] == [sys.argv[4]] if sys.argv[5:] == ["last"] else sys.argv[4] in acts
if bad or len(s["segments"]) == 0 or len(trace) < int(sys.argv[3]) or not want:
    print(bad[:5], len(s["segments"]), len(trace), trace[-1:] if trace else None)
    sys.exit(1)
PY
}
if run 0 --snapshot "$tmp/s.pickle" "$D/synthetic-train.csv" && snapcheck "$tmp/s.pickle" 4000 free_completed >"$tmp/out" 2>&1 &&
	run 1 --capacity 16M --snapshot "$tmp/f.pickle" "$D/synthetic-train.csv" && snapcheck "$tmp/f.pickle" 1 oom last >"$tmp/out" 2>&1 &&
	run 2 --compare default 'EMM_ARENAS=1' --snapshot "$tmp/c.pickle" "$D/rmm-sample.csv" && has 'none of'; then
	ok "--snapshot: the heap and the replayed events as a PyTorch snapshot, up to a failure"
else bad "--snapshot"; fi

# The traces recorded on the GPU (tests/data/record-traces.sh, H200): each
# replays on hostsim with the live run's own peak of requested bytes (the
# live statistics said 5.6 GiB and 413.3 MiB allocated at the peak), and
# --min-capacity finds a size at which it replays, one step below it fails.
for t in "pytorch-train 5965915792" "cupy-pool-off 433101488"; do
	set -- $t
	if run 0 "$D/$1.csv" && has "^traced peak .*($2 B)"; then
		ok "$1.csv replays to the live run's peak ($2 B as asked)"
	else bad "$1.csv replay"; fi
done
if run 0 --min-capacity "$D/cupy-pool-off.csv" && has '^minimum capacity'; then
	cap=$(sed -n 's/^minimum capacity [0-9]* MiB (\([0-9]*\) B).*/\1/p' "$tmp/out" | head -1)
	if [ -n "$cap" ] && run 0 --capacity "$cap" "$D/cupy-pool-off.csv" &&
		run 1 --capacity $((cap - 2 * 1024 * 1024)) "$D/cupy-pool-off.csv"; then
		ok "--min-capacity on a GPU trace: replays at $cap B, fails one 2 MiB step below"
	else bad "--min-capacity on cupy-pool-off.csv ($cap)"; fi
else bad "--min-capacity on cupy-pool-off.csv"; fi

# The training trace has two threads (PyTorch's main thread runs the
# forward pass, its autograd thread the backward), each on its own arena: a
# miss takes the other arena's ready block before reserving more, so the
# peak reserved is one pool's (EMM_ARENAS=1, 7071596544 B when written;
# 8308916224 B with an arena's peak each), and the same as a model of
# PyTorch's caching allocator (tests/data/torch-caching-model.py) gives.
if run 0 "$D/pytorch-train.csv" && has '2 threads' && two=$(peak_of) &&
	EMM_ARENAS=1 run 0 "$D/pytorch-train.csv" && one=$(peak_of) &&
	torch=$(python3 "$D/torch-caching-model.py" "$D/pytorch-train.csv" --peak) &&
	[ -n "$two" ] && [ -n "$one" ] && [ "$two" -le "$one" ] && [ "$one" = "$torch" ]; then
	ok "two threads reserve one pool's peak ($two B; one arena: $one B; PyTorch's model: $torch B)"
else bad "two threads' peak ($two B), one arena's ($one B), PyTorch's model ($torch B)"; fi

# The 40-step training trace (pytorch-train-40.csv, the first 30 999 events
# of RESULTS.md section 37's run I2; its peak lies inside): with simulated
# fences libemm reserves no more than PyTorch's caching allocator at the
# peak (18947768320 against 19008585728 B when written). A large miss
# closes an epoch holding blocks of its pool before it reserves a segment;
# before that (49425de) frees parked in the epoch made it 19165872128.
if torch=$(python3 "$D/torch-caching-model.py" "$D/pytorch-train-40.csv" --peak) &&
	run 0 --fences 0 "$D/pytorch-train-40.csv" && f0=$(peak_of) &&
	run 0 --fences 300 "$D/pytorch-train-40.csv" && f300=$(peak_of) &&
	[ -n "$f0" ] && [ -n "$f300" ] && [ -n "$torch" ] && [ "$f0" -le "$torch" ] && [ "$f300" -le "$torch" ]; then
	ok "40-step trace with fences: $f0 and $f300 B at most PyTorch's $torch B"
else bad "40-step trace with fences ($f0, $f300 B) over PyTorch's model ($torch B)"; fi

# EMM_BACKEND=vmm replays on a simulated page-granular device: pages are
# grown, given back and mapped again (the "pages" line), and holding the
# mapped bytes at their high-water mark (EMM_HOLD_PEAK, on by default)
# keeps the training trace's peak below what it is without (6568280064 B
# off, 5995757568 B on when written) and below the driver backend's.
if EMM_BACKEND=vmm EMM_HOLD_PEAK=off run 0 "$D/pytorch-train.csv" && has '^pages .* grows' && off=$(peak_of) &&
	EMM_BACKEND=vmm run 0 "$D/pytorch-train.csv" && has '^pages .* unmaps' && on=$(peak_of) &&
	run 0 "$D/pytorch-train.csv" && drv=$(peak_of) &&
	[ -n "$on" ] && [ -n "$off" ] && [ "$on" -lt "$off" ] && [ "$off" -lt "$drv" ] &&
	[ "$on" -lt 6100000000 ]; then
	ok "EMM_BACKEND=vmm: simulated pages, peak $on B held (off: $off B, driver: $drv B)"
else bad "EMM_BACKEND=vmm replay (held $on, off $off, driver $drv)"; fi

# --fences: simulated GPU fences. Synchronous frees then wait in epochs,
# which hold memory: the training trace's peak is above the one without
# fences (7535067136 against 7071596544 B when written), and epochs closed
# by bytes only at 4 GiB park far more (18803064832 B: the GPU run of
# RESULTS.md section 27 doubled PyTorch's NVML peak the same way). On a
# trace with streams an event that completes later holds more.
if run 0 "$D/pytorch-train.csv" && none=$(peak_of) &&
	run 0 --fences 0 "$D/pytorch-train.csv" && has '^fences  *[1-9][0-9]* epochs closed, [1-9][0-9]* events recorded' &&
	f0=$(peak_of) && EMM_EPOCH_BLOCKS=1024 EMM_EPOCH_BYTES=4G run 0 --fences 0 "$D/pytorch-train.csv" &&
	big=$(peak_of) && [ -n "$none" ] && [ -n "$f0" ] && [ -n "$big" ] && [ "$f0" -gt "$none" ] &&
	[ "$big" -gt $((2 * f0)) ]; then
	ok "--fences: epochs hold memory ($none B without, $f0 B with, $big B with 4 GiB epochs)"
else bad "--fences on the training trace (without $none, with $f0, 4 GiB epochs $big)"; fi
if run 0 --fences 0 "$D/synthetic-train.csv" && now=$(peak_of) &&
	run 0 --fences 50 "$D/synthetic-train.csv" && later=$(peak_of) && [ -n "$now" ] && [ -n "$later" ] &&
	[ "$later" -gt "$now" ] && ! run 0 "$D/synthetic-train.csv" --fences && has 'wants a number of events' &&
	run 2 --fences -1 "$D/synthetic-train.csv" && run 0 --fences 0 --compare default 'EMM_EPOCH_BLOCKS=256' \
	"$D/rmm-sample.csv" && has 'EMM_EPOCH_BLOCKS=256'; then
	ok "--fences: a lag of 50 events holds more ($later B against $now B); bad lags refused; with --compare"
else bad "--fences lag (now $now, later $later)"; fi

# The bundled synthetic trace is what its generator writes.
if python3 "$D/gen-synthetic-trace.py" -o "$tmp/synthetic.csv" && cmp -s "$tmp/synthetic.csv" "$D/synthetic-train.csv"; then
	ok "tests/data/synthetic-train.csv is gen-synthetic-trace.py's output"
else bad "synthetic-train.csv differs from gen-synthetic-trace.py's output (regenerate it)"; fi

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
