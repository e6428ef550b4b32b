#!/bin/sh
# What an edge box's firmware runs: plan -> deploy -> golden -> serve -> one request -> stop, every branch on
# an exit code or a JSON field (docs/deploy.md#a-firmware-script). POSIX sh (`dash -n` clean, no bashisms).
#
# Needs: `edgeinfer` on PATH and `python3` (edgeinfer's own interpreter will do; it reads the JSON and sends the
# HTTP request, so neither jq nor curl is needed).
#
# Usage: firmware.sh MODEL BOARD WORKDIR INPUT=FILE.npy   (env PORT: serve's port, default 8000)
#   MODEL  a model file or directory edgeinfer deploys (e.g. model.onnx)
#   BOARD  a board name or profile YAML (e.g. host)
#   INPUT  the model input for the one request, as NAME=FILE.npy
#
# Exit: 0 deployed, checked, served and answered; 1 a negative verdict (does not fit, golden failed); 2 what
# it was given is wrong (unknown board, missing model, ...); 3 the backend or device failed; 4 the server did
# not become ready or did not answer. edgeinfer's exit codes are passed on as they are.
set -u

if [ $# -ne 4 ]; then
    echo "usage: $0 MODEL BOARD WORKDIR INPUT=FILE.npy" >&2
    exit 2
fi
MODEL=$1
BOARD=$2
WORK=$3
INPUT=$4
PORT=${PORT:-8000}
BUNDLE=$WORK/bundle
mkdir -p "$WORK" || exit 2

# field FILE KEY[.KEY...]: a field of the JSON object in FILE, a KEY of digits indexing a list ("" when absent
# or FILE is not JSON); true/false print as true/false
field() {
    python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
for k in sys.argv[2].split("."):
    if isinstance(d, list):
        d = d[int(k)] if k.isdigit() and int(k) < len(d) else None
    else:
        d = d.get(k) if isinstance(d, dict) else None
print("" if d is None else json.dumps(d) if isinstance(d, bool) else d)' "$1" "$2"
}

# failed STEP CODE: report edgeinfer's failure from its exit code and the `{"error": {"code", "kind",
# "message"}}` object it prints under --json (its one line on stderr when there is none), then exit CODE
failed() {
    kind=$(field "$WORK/$1.json" error.kind)
    message=$(field "$WORK/$1.json" error.message)
    [ -n "$message" ] || message=$(tail -n 1 "$WORK/$1.err")
    echo "firmware: $1 failed (exit $2, kind ${kind:-none}): $message" >&2
    case $kind in
        unknown_board) echo "firmware: this board has no profile here: install its plugin or pass its YAML" >&2 ;;
        backend_unavailable | package_missing) echo "firmware: install the board's runtime (edgeinfer doctor)" >&2 ;;
    esac
    exit "$2"
}

# 1. plan: will it fit? exit 0 fits, 1 does not fit (the plan JSON says why), 2/3 a failure
edgeinfer plan "$MODEL" --board "$BOARD" --json >"$WORK/plan.json" 2>"$WORK/plan.err"
rc=$?
case $rc in
    0 | 1) ;;
    *) failed plan $rc ;;
esac
if [ "$(field "$WORK/plan.json" verdict)" != fits ]; then
    reason=$(field "$WORK/plan.json" reasons.0)
    [ -n "$reason" ] || reason=$(field "$WORK/plan.json" error.message)
    echo "firmware: $MODEL does not fit $BOARD: $reason" >&2
    exit 1
fi
echo "firmware: plan: fits ($(field "$WORK/plan.json" options.runtime), $(field "$WORK/plan.json" options.quant))"

# 2. deploy: convert, golden-check and seal the bundle (exit 1: the golden check failed, nothing written)
rm -rf "$BUNDLE"
edgeinfer deploy "$MODEL" --board "$BOARD" -o "$BUNDLE" --json >"$WORK/deploy.json" 2>"$WORK/deploy.err"
rc=$?
[ $rc -eq 0 ] || failed deploy $rc
[ "$(field "$WORK/deploy.json" golden.passed)" = true ] || { echo "firmware: deploy's golden check did not pass" >&2; exit 1; }
echo "firmware: deploy: $BUNDLE on $(field "$WORK/deploy.json" backend)"

# 3. golden: the check again, on this box (exit 1: outputs differ from the recorded reference)
edgeinfer golden "$BUNDLE" --json >"$WORK/golden.json" 2>"$WORK/golden.err"
rc=$?
[ $rc -eq 0 ] || failed golden $rc
[ "$(field "$WORK/golden.json" passed)" = true ] || { echo "firmware: golden did not pass" >&2; exit 1; }
echo "firmware: golden: passed"

# 4. serve in the background; ready when GET /ready answers 200 (every model loaded; /health only says alive)
edgeinfer serve "$BUNDLE" --port "$PORT" >"$WORK/serve.log" 2>&1 &
SERVER=$!
stop() {
    kill "$SERVER" 2>/dev/null
    wait "$SERVER"
}
# poll GET /ready in one python3 (POSIX `sleep` takes whole seconds): exit 0 ready, 1 the server exited, 2 not
# ready in 60 s
python3 -c '
import os, sys, time, urllib.request
url, pid, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(url, timeout=2)
        sys.exit(0)
    except OSError:
        pass
    try:  # an exited child stays a zombie until `wait`: read its state where /proc is
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                sys.exit(1)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            sys.exit(1)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit(1)
    time.sleep(0.1)
sys.exit(2)' "http://127.0.0.1:$PORT/ready" "$SERVER"
case $? in
    0) ;;
    1)
        wait "$SERVER"
        rc=$?
        echo "firmware: serve exited $rc: $(tail -n 1 "$WORK/serve.log")" >&2
        exit $rc
        ;;
    *)
        echo "firmware: serve not ready after 60 s" >&2
        stop
        exit 4
        ;;
esac
echo "firmware: serve: ready on port $PORT"

# 5. one request: POST /v1/infer with INPUT; the answer's outputs are checked for shapes
python3 -c '
import json, sys, urllib.request
import numpy as np
name, _, path = sys.argv[2].partition("=")
body = {"model": sys.argv[3], "inputs": {name: np.load(path).tolist()}}
req = urllib.request.Request(sys.argv[1], json.dumps(body).encode(), {"Content-Type": "application/json"})
try:
    out = json.load(urllib.request.urlopen(req, timeout=60))["outputs"]
except Exception as e:
    sys.exit(f"firmware: request failed: {e}")
if not out:
    sys.exit("firmware: the answer has no outputs")
print("firmware: request: " + ", ".join(k + " " + str(v.get("shape")) for k, v in out.items()))' \
    "http://127.0.0.1:$PORT/v1/infer" "$INPUT" "$(basename "$BUNDLE")" >"$WORK/request.out"
rc=$?
cat "$WORK/request.out"

# 6. stop: SIGTERM, and serve's own exit code (0 after a clean shutdown)
stop
served=$?
if [ $rc -ne 0 ]; then
    exit 4
fi
if [ $served -ne 0 ]; then
    echo "firmware: serve exited $served on stop" >&2
    exit 3
fi
echo "firmware: done"
