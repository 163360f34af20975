#!/usr/bin/env bash
# The agent's and the checkpoint's CUDA paths, checked in one go on a machine with a CUDA GPU: at
# most 8 minutes once a CUDA torch is there (each step has its own timeout, cut to what is left of
# a 480 s budget: a step with no time left is reported as not run).
#
#   1. setup: find a CUDA torch (the one installed, if it sees the GPU; else torch==<the pyproject
#      pin> from the package index, whose Linux x86-64 wheel is a CUDA build: said loudly), then
#      the project's other requirements (from the wheel folder when it holds wheels: the GPU
#      machines lent here reach no index) and `pip install -e .` (else links cliffguard/<part>);
#   2. cuda_tests: the cuda cases of tests/*/test_*_cuda.py (marker cuda; none may skip);
#   3. agent_overhead: bench.agent_overhead --device cuda, the default GPT (goal: ratio <= 1.01,
#      histograms every 10 steps), and agent_overhead_wide: the wide GPT on a 256-sequence batch,
#      a step long enough to keep the GPU busy (same goal);
#   4. checkpoint_stall: bench.checkpoint_stall --device cuda (goal: the async save blocks the
#      training thread <= 0.05 of a synchronous torch.save);
#   5. one table (python -m bench.gpu.summary) and summary.json.
#
#   bash bench/gpu/check.sh                  on the GPU machine, in a copy of the repository
#   bash bench/gpu/check.sh --fetch-wheels   where the package index is reachable: the wheels the
#                                            GPU image lacks, into the wheel folder, to carry there
#   bash bench/gpu/check.sh --smoke          tiny runs of every step (the plumbing, ~1 minute)
#   bash bench/gpu/check.sh --smoke --cpu --no-install
#                                            the same on the CPU, in the environment as it is: checks
#                                            this script where there is no GPU (the cpu twins of the
#                                            device tests run instead of the cuda cases)
#
# Environment: OUT (where results go; default ./gpu-out), PYTHON (default python3), CG_WHEELS (the
# wheel folder; default .whl), CG_WHEELS_PYTHON (--fetch-wheels: the GPU machine's Python, default
# 3.12), CG_TORCH_INSTALL=0 (never download torch), CG_GPU_BUDGET_S (the budget, default 480).
# It writes 8 files under OUT: check.log, env.json, steps.tsv, cuda_tests.xml, agent_overhead.json,
# agent_overhead_wide.json, checkpoint_stall.json, summary.json.
# Exit: 0 every step passed; 1 a step failed; 2 no CUDA GPU or no CUDA torch (no step was run).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
WHEELS=${CG_WHEELS:-.whl}
SMOKE=0 CPU=0 INSTALL=1 FETCH=0
for arg in "$@"; do
  case $arg in
    --smoke) SMOKE=1 ;;
    --cpu) CPU=1 ;;
    --no-install) INSTALL=0 ;;
    --fetch-wheels) FETCH=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
if (( CPU && !SMOKE )); then
  echo "check.sh: --cpu is for --smoke only (the goals are GPU figures)" >&2
  exit 2
fi

say() { printf '\n== %s\n' "$*"; }
loud() { printf '\n!! %s\n' "$*"; }
no_gpu() { loud "$*"; echo "GPU check: not run (exit 2)"; exit 2; }

# The project's requirements less torch (the CUDA build is found or fetched apart), one a line.
requirements() {
  "$PY" - "$@" <<'EOF'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join([d for d in deps if re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() != "torch"] + sys.argv[1:]))
EOF
}

if (( FETCH )); then
  # What the GPU image lacks of them (it has torch, accelerate, numpy and pytest; nothing outside
  # it can be reached from it), as wheels for its Python: cryptography's own needs are named,
  # since --no-deps fetches none. The folder goes with the repository (`carry` it) to the machine.
  mkdir -p "$WHEELS"
  # shellcheck disable=SC2046  # one requirement a word
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "${CG_WHEELS_PYTHON:-3.12}" --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" \
    $(requirements "cffi>=2.0" pycparser) || exit 1
  ls -l "$WHEELS"
  exit 0
fi

OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
for f in check.log env.json steps.tsv cuda_tests.xml agent_overhead.json agent_overhead_wide.json checkpoint_stall.json \
  summary.json; do
  rm -f "${OUT:?}/$f"  # a step cut short must not leave the last run's figure in its place
done
exec > >(tee -a "$OUT/check.log") 2>&1
TEE=$!
finish() { exec 1>&- 2>&-; wait "$TEE" 2>/dev/null; }
trap finish EXIT
say "GPU check $(date -u +%FT%TZ) in $ROOT, results in $OUT$( ((SMOKE)) && echo ' (smoke: tiny runs, not the figures)')"

DEVICE=cuda
if (( CPU )); then
  DEVICE=cpu
else
  # before any Python: a machine without a GPU is told so at once
  if ! { nvidia-smi -L 2>/dev/null | grep -q '^GPU '; } && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    no_gpu "no CUDA GPU on this machine (nvidia-smi lists none, no /dev/nvidia0): nothing to check"
  fi
fi

# env.json: the interpreter, torch and the GPU it sees; TORCH_SOURCE says where torch came from.
probe() {
  TORCH_SOURCE=${1:-} timeout 45 "$PY" - >"$OUT/env.json" <<'EOF'
import json, os, platform, sys
env = {"python": platform.python_version(), "executable": sys.executable, "torch": None, "cuda": None,
       "cuda_available": False, "gpus": 0, "gpu": None, "torch_source": os.environ.get("TORCH_SOURCE") or None}
try:
    import torch
except Exception as exc:  # noqa: BLE001 - said in the file
    env["torch_error"] = repr(exc)
else:
    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if env["cuda_available"]:
        env.update(gpus=torch.cuda.device_count(), gpu=torch.cuda.get_device_name(0),
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))))
print(json.dumps(env))
EOF
}
field() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]) or "")' "$OUT/env.json" "$1"; }

BUDGET=${CG_GPU_BUDGET_S:-480}
DEADLINE=$((SECONDS + BUDGET))  # the whole check, setup included (a torch download moves it)

step() {  # step NAME SECONDS COMMAND...: one row of the table, cut short at the deadline
  local name=$1 limit=$2 t0=$SECONDS rc left=$((DEADLINE - SECONDS))
  shift 2
  if (( left < 10 )); then
    loud "$name: not run, the ${BUDGET}s budget is spent"
    printf '%s\t%s\t%s\n' "$name" -1 0 >>"$OUT/steps.tsv"
    return 1
  fi
  (( limit > left )) && limit=$left
  say "$name (at most ${limit}s): $*"
  timeout -k 10 "$limit" "$@"
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv"
  return "$rc"
}

pip_install() { timeout 75 "$PY" -m pip install -q --disable-pip-version-check --no-input --retries 1 --timeout 15 "$@"; }
wheel_args=()
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  wheel_args=(--no-index --find-links "$WHEELS")
fi

setup() {
  local source
  probe || { echo "the interpreter $PY did not answer"; return 1; }
  if (( CPU )); then
    source="as installed (--cpu smoke)"
  elif [[ $(field cuda_available) == True ]]; then
    source="already installed"
    loud "using the CUDA torch already installed: torch $(field torch), CUDA $(field cuda), $(field gpu) ($(field executable))"
  else
    local have cuda
    have=$(field torch) cuda=$(field cuda)
    if [[ -z $have ]]; then
      loud "no torch in $PY: this check needs a CUDA build"
    else
      loud "torch $have (CUDA ${cuda:-none: a CPU build}) sees no GPU: this check needs a CUDA build"
    fi
    (( INSTALL )) || return 2
    if [[ ${CG_TORCH_INSTALL:-1} == 0 ]]; then
      echo "CG_TORCH_INSTALL=0: no torch download"
      return 2
    fi
    local pin
    pin=$("$PY" -c 'import re, tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print(next(x for x in d if re.match(r"torch\b", x)))')
    source="downloaded ($pin)"
    loud "DOWNLOADING $pin from the package index: its Linux x86-64 wheel is a CUDA build, with ~3 GB of" \
         "nvidia-* libraries; up to 10 minutes, outside the check's 8 (CG_TORCH_INSTALL=0 forbids this)"
    timeout 600 "$PY" -m pip install -q --disable-pip-version-check --retries 1 --timeout 30 --force-reinstall "$pin" ||
      return 2
    DEADLINE=$((SECONDS + BUDGET - 30))  # the download is not the check's time
    probe || return 2
    [[ $(field cuda_available) == True ]] || return 2
    loud "now using torch $(field torch), CUDA $(field cuda), $(field gpu)"
  fi
  if (( INSTALL )); then
    local req
    req=$(mktemp)
    requirements pytest pytest-timeout >"$req"  # no floor: the GPU image brings its own
    echo "the project's requirements but torch (from ${wheel_args[*]:-the package index}): $(tr '\n' ' ' <"$req")"
    pip_install "${wheel_args[@]}" -r "$req" ||
      { echo "could not install them: where the index cannot be reached, run --fetch-wheels where it can and bring $WHEELS"; return 1; }
    if ! pip_install --no-deps --no-build-isolation -e .; then
      # setup.py maps each part to cliffguard.<part>; links do the same for a run from the root
      loud "pip install -e . failed: linking the parts into cliffguard/ instead (cliffguard/agent -> ../agent, ...)"
      for part in core agent trainer controller dashboard; do
        [[ -e cliffguard/$part ]] || ln -s "../$part" "cliffguard/$part" || return 1
      done
    fi
  fi
  probe "$source" || return 1
  "$PY" -c 'import cliffguard.agent.hooks, cliffguard.trainer.checkpoint, bench.agent_overhead, bench.checkpoint_stall' || return 1
  echo "setup: $(cat "$OUT/env.json")"
}

say "setup (each part under its own timeout; ~20 s where torch is there)"
t0=$SECONDS
setup
rc=$?
if (( rc == 2 )); then
  have=$(field torch)
  no_gpu "no CUDA torch: torch ${have:-missing} sees no GPU and none could be installed$( ((INSTALL)) || echo ' (--no-install)')"
fi
printf '%s\t%s\t%s\n' setup "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv"

if (( rc == 0 )); then
  if (( CPU )); then marks="not cuda"; else marks=cuda; fi
  # shellcheck disable=SC2207  # paths without spaces
  device_tests=($(compgen -G 'tests/*/test_*_cuda.py'))
  step cuda_tests 120 "$PY" -m pytest -q -p no:cacheprovider -rs -m "$marks" --junitxml="$OUT/cuda_tests.xml" \
    "${device_tests[@]}"
  tiny=()
  (( SMOKE )) && tiny=(--rounds 2 --steps-per-round 2 --warmup 1)
  step agent_overhead 90 "$PY" -m bench.agent_overhead --device "$DEVICE" --nproc 1 --sink memory "${tiny[@]}" \
    --json "$OUT/agent_overhead.json"
  step agent_overhead_wide 90 "$PY" -m bench.agent_overhead --device "$DEVICE" --nproc 1 --sink memory "${tiny[@]}" \
    --size wide --global-batch "$( ((SMOKE)) && echo 16 || echo 256)" --json "$OUT/agent_overhead_wide.json"
  stall=()
  (( SMOKE )) && stall=(--repeats 2 --steps 4 --sizes default)
  step checkpoint_stall 150 "$PY" -m bench.checkpoint_stall --device "$DEVICE" "${stall[@]}" \
    --json "$OUT/checkpoint_stall.json"
fi

say "summary"
"$PY" -m bench.gpu.summary "$OUT"
