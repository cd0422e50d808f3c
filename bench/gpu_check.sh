#!/usr/bin/env bash
# The GPU checks on a CUDA machine, in phases that each fit a 10-minute command.
#
#   bash bench/gpu_check.sh tests    # the gpu tests alone (about a minute on an H200)
#   bash bench/gpu_check.sh verify   # gpu tests, the whole suite, CartPole end to end on cuda
#   bash bench/gpu_check.sh sanitize # compute-sanitizer memcheck and racecheck, short training run
#   bash bench/gpu_check.sh bench    # bench/acting.py, replay.py, noisy_forward.py, learner.py
#   bash bench/gpu_check.sh atari    # bench/atari.py on cuda: SPS and where the time goes
#   bash bench/gpu_check.sh seeds    # seeds stacked on cuda: bench/seeds.py, bench/seed_group.py
#   bash bench/gpu_check.sh der      # one Atari 100k run of --config der on cuda (resumes)
#   bash bench/gpu_check.sh der_parts  # where a der step's time goes on cuda, frames both ways
#   bash bench/gpu_check.sh atari_seeds  # der seeds of one game stacked on cuda: steps/s by S
#   bash bench/gpu_check.sh der_seeds    # SEEDS der seeds (2) trained whole in one process, timed
#   bash bench/gpu_check.sh pong     # Pong from scratch in one command, its curve (resumes)
#   bash bench/gpu_check.sh figures  # the figures docs/performance.md lacks, in one command
#
# BUDGET=S caps the whole command at S seconds: each step's limit is cut to what is left
# (less a margin), and a step with under 20 s left is skipped, so a short lease still
# returns every log.
# Each step runs under its own time limit and logs to $LOGS/<step>.log (default
# /tmp/gpu_logs); a line per step says its exit status and seconds, and a failed step
# prints the end of its log. With $OUT set (the lent-device tool), the logs are packed
# into $OUT/logs.tgz after every step, so they come back even if the command is cut off.
# Wheels that the machine lacks (gymnasium, ale-py) are installed from .whl/ if present.
set -u
phase=${1:?usage: bash bench/gpu_check.sh tests|verify|sanitize|bench|atari|seeds|der|der_parts|der_seeds|atari_seeds|pong|figures}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
LOGS=${LOGS:-/tmp/gpu_logs}
RUNS=${RUNS:-/tmp/gpu_runs}
mkdir -p "$LOGS" "$RUNS"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=python3
failed=0

pack() {
    if [ -n "${OUT:-}" ]; then tar -czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"; fi
}

BUDGET=${BUDGET:-0}

# step NAME SECONDS COMMAND...: run it with a time limit, log it, report it.
step() {
    local name=$1 limit=$2
    shift 2
    if [ "$BUDGET" -gt 0 ]; then
        local left=$((BUDGET - SECONDS - 30))
        if [ "$left" -lt 20 ]; then
            printf '== %-28s skipped: %ss of the budget left\n' "$name" "$((BUDGET - SECONDS))"
            failed=$((failed + 1))
            return 124
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    local t0=$SECONDS
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    printf '== %-28s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))"
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        tail -n 25 "$LOGS/$name.log" | sed 's/^/   | /'
    fi
    pack
    return "$rc"
}

# json FILE KEY: one key of a JSON file (run.py's result.json or an --eval --json line).
json() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

# ended RUN_DIR: the run ended (an interrupted run's result.json says "interrupted").
ended() { [ -f "$1/result.json" ] && [ "$(json "$1/result.json" status)" != interrupted ]; }

# train NAME SECONDS RUN_DIR ARGS...: run.py on cuda from scratch, or resumed where an
# earlier command on this machine stopped it (cut off by its limit, it saves last.pt).
train() {
    local name=$1 limit=$2 r=$3
    shift 3
    if [ -f "$r/checkpoints/last.pt" ] && ! ended "$r"; then
        step "${name}_resumed" "$limit" $PY run.py --resume "$r" --device cuda --no-progress
    else
        rm -rf "$r"
        step "$name" "$limit" $PY run.py --device cuda --run-dir "$r" --no-progress "$@"
    fi
}

# cartpole_cuda RUN_DIR SECONDS: CartPole-v1 from scratch on cuda (its YAML, seed 1), its
# outcome in a line and its result.json among the logs.
cartpole_cuda() {
    rm -rf "$1"
    step train_cuda "$2" $PY run.py --env CartPole-v1 --device cuda --seed 1 --run-dir "$1" \
        --no-progress
    if [ -f "$1/result.json" ]; then
        echo "   status $(json "$1/result.json" status), solved at $(json "$1/result.json" \
solved_step), final $(json "$1/result.json" final_eval_return), $(json "$1/result.json" \
wall_time_s) s"
        cp "$1/result.json" "$LOGS/cartpole_cuda_result.json"
        pack
    fi
}

# der_parts: where a der step's time goes on cuda (bench.atari's breakdown, one env,
# Krull), with the frames on the host (pinned staging) and in GPU memory.
der_parts() {
    for frames in pinned device; do
        step "bench_atari_der_$frames" 60 $PY -m bench.atari --env KrullNoFrameskip-v4 \
            --config der --envs 1 --breakdown --no-sps --device cuda \
            --set "replay_storage=$frames"
        sed -n '/^|/p' "$LOGS/bench_atari_der_$frames.log"
    done
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY -c "import sys, torch, gymnasium; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, gymnasium.__version__, torch.cuda.get_device_name())"
    nproc
} 2>&1 | tee "$LOGS/machine.log"

case $phase in
tests)
    # Cheap enough to lead any lease's command, e.g. before der:
    #   BUDGET=100 bash bench/gpu_check.sh tests; BUDGET=480 bash bench/gpu_check.sh der
    step pytest_gpu 120 $PY -m pytest -m gpu -q -rs -p no:cacheprovider
    grep -E "passed|failed|error" "$LOGS/pytest_gpu.log" | tail -n 1
    ;;
verify)
    step pytest_gpu 240 $PY -m pytest -m gpu -q -rs -p no:cacheprovider
    grep -E "passed|failed|error" "$LOGS/pytest_gpu.log" | tail -n 1
    # The whole suite on the GPU machine: the device="auto" paths now pick CUDA.
    step pytest_all 300 $PY -m pytest -q -rfs -p no:cacheprovider --durations=5
    grep -E "passed|failed|error" "$LOGS/pytest_all.log" | tail -n 1

    # End to end: train CartPole-v1 on cuda (its YAML, seed 1), then evaluate its best
    # policy on cpu and on cuda.
    r=$RUNS/cartpole_cuda
    cartpole_cuda "$r" 240
    for dev in cpu cuda; do
        step "eval_cuda_ckpt_on_$dev" 120 $PY run.py --env CartPole-v1 --eval \
            "$r/checkpoints/best.pt" --device "$dev" --episodes 20 --json
        tail -n 1 "$LOGS/eval_cuda_ckpt_on_$dev.log"
    done
    # A checkpoint written on the cpu, evaluated and resumed on cuda; and the reverse.
    c=$RUNS/cartpole_cpu
    rm -rf "$c"
    step train_cpu_3k 120 $PY run.py --env CartPole-v1 --device cpu --seed 2 --run-dir "$c" \
        --total-steps 3000 --no-progress
    step eval_cpu_ckpt_on_cuda 120 $PY run.py --env CartPole-v1 --eval "$c/checkpoints/last.pt" \
        --device cuda --episodes 5 --json
    tail -n 1 "$LOGS/eval_cpu_ckpt_on_cuda.log"
    step resume_cpu_run_on_cuda 120 $PY run.py --resume "$c" --device cuda --total-steps 5000 \
        --no-progress
    step resume_cuda_run_on_cpu 120 $PY run.py --resume "$c" --device cpu --total-steps 6000 \
        --no-progress
    echo "   steps after both resumes: $(json "$c/result.json" global_step)"

    # Exact resume on cuda, save_buffer on: 6,000 steps straight against 3,000 + 3,000.
    a=$RUNS/straight b=$RUNS/halves
    rm -rf "$a" "$b"
    common=(--env CartPole-v1 --device cuda --seed 3 --no-progress --set save_buffer=true
        --set early_stop=false)
    step exact_straight 150 $PY run.py "${common[@]}" --run-dir "$a" --total-steps 6000
    step exact_first_half 150 $PY run.py "${common[@]}" --run-dir "$b" --total-steps 3000
    step exact_resumed_half 150 $PY run.py --resume "$b" --total-steps 6000 --no-progress
    $PY - "$a" "$b" <<'EOF'
import sys, torch
from agent.checkpoint import load_checkpoint
a, b = (load_checkpoint(f"{d}/checkpoints/last.pt") for d in sys.argv[1:])
pa, pb = a["q_network"], b["q_network"]
diff = max((pa[k].double() - pb[k].double()).abs().max().item() for k in pa)
print(f"   exact resume on cuda: eval curves equal {a['eval_curve'] == b['eval_curve']}, "
      f"max |param difference| {diff:.3g}")
EOF

    # Ctrl-C on a cuda run: saves, says how to resume, exits 130.
    s=$RUNS/sigint
    rm -rf "$s"
    $PY run.py --env CartPole-v1 --device cuda --seed 4 --run-dir "$s" --total-steps 200000 \
        --set early_stop=false --no-progress >"$LOGS/sigint.log" 2>&1 &
    pid=$!
    sleep 25
    kill -INT "$pid"
    wait "$pid"
    echo "== sigint: rc=$? (want 130); $(grep -c 'resume with' "$LOGS/sigint.log") resume line(s)"
    pack
    ;;
sanitize)
    # Short training runs on cuda (graph capture, pinned replay, learner; memcheck's also
    # evaluates and checkpoints). racecheck is several times slower than memcheck: on an
    # H100 it did not finish memcheck's 1,200 steps in 270 s, and took 108 s for 400.
    common=(run.py --env CartPole-v1 --device cuda --seed 5 --no-progress
        --set confirm_episodes=0 --set eval_episodes=2)
    rm -rf "$RUNS/san_memcheck" "$RUNS/san_racecheck"
    step sanitizer_memcheck 270 compute-sanitizer --tool memcheck $PY "${common[@]}" \
        --total-steps 1200 --set learning_starts=300 --set eval_interval=600 \
        --set log_interval=300 --set checkpoint_interval=600 --run-dir "$RUNS/san_memcheck"
    step sanitizer_racecheck 270 compute-sanitizer --tool racecheck $PY "${common[@]}" \
        --total-steps 400 --set learning_starts=200 --set eval_interval=0 \
        --set log_interval=200 --set checkpoint_interval=400 --run-dir "$RUNS/san_racecheck"
    for tool in memcheck racecheck; do
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid" "$LOGS/sanitizer_$tool.log" | tail -n 3
    done
    ;;
bench)
    step bench_acting 240 $PY -m bench.acting
    sed -n '/^|/p' "$LOGS/bench_acting.log"
    step bench_learner 150 $PY -m bench.learner --device cuda
    step bench_learner_all 150 $PY -m bench.learner --device cuda --noisy-layers all
    step bench_replay 240 $PY -m bench.replay --quick
    step bench_noisy_forward 120 $PY -m bench.noisy_forward --quick
    # Rainbow's update (C51, importance weights, priorities read back) as a CUDA graph in
    # training, against the default's: MinAtar Breakout, 30k steps each, the same seed.
    for arm in default rainbow; do
        extra=""
        [ "$arm" = rainbow ] && extra="--config rainbow"
        r=$RUNS/breakout_$arm
        rm -rf "$r"
        step "train_breakout_$arm" 240 $PY run.py --env MinAtar/Breakout-v0 --device cuda \
            --seed 1 --total-steps 30000 --set eval_interval=0 --no-progress --run-dir "$r" $extra
        grep -h "finished" "$LOGS/train_breakout_$arm.log" | tail -n 1
    done
    ;;
seeds)
    step bench_seeds 120 $PY -m bench.seeds --device cuda --quick
    sed -n '/^|/p' "$LOGS/bench_seeds.log"
    step bench_seed_group 420 $PY -m bench.seed_group speed --seeds 16 64 256 --steps 5000 \
        --device cuda
    sed -n '/^|/p' "$LOGS/bench_seed_group.log"
    ;;
atari)
    step bench_atari 420 $PY -m bench.atari --device cuda --breakdown
    cat "$LOGS/bench_atari.log" | sed -n '/^|/p;/^#/p'
    ;;
atari_seeds)
    # S der seeds of Krull stacked in one process against one seed alone (its single-run
    # CUDA-graph path): each variant's env steps/s between steps 2,000 and 10,000, so the
    # start-up and the final evaluation (one episode a seed here) stay out of the figure;
    # rows print as they land, so a command cut short still reports the ones it finished.
    # First the update alone, S seeds stacked with a convolution call per seed and with one
    # grouped call, eager and captured as a CUDA graph (what a group on cuda runs),
    # against one seed's CUDA graph; then a step's action, one seed's against the stack's.
    # A dry run on a CPU: DEVICE=cpu SEEDS=2 STEPS=2500 WINDOW="1700 2400".
    step der_updates 90 $PY -m bench.seeds --net der --seeds ${SEEDS:-16 8 32} --quick \
        --device "${DEVICE:-cuda}"
    sed -n '/^|/p' "$LOGS/der_updates.log"
    # The goal's S = 16 first; each group also with the host's two suspected bounds
    # lifted: its seeds' envs in worker processes stepped at once, its frames in GPU memory.
    step atari_seeds "${LIMIT:-480}" $PY -m bench.seed_group speed --env KrullNoFrameskip-v4 \
        --config der --seeds ${SEEDS:-16 8 32} --also "${ALSO:-vector=async replay_storage=device}" \
        --steps "${STEPS:-10000}" \
        --window ${WINDOW:-2000 10000} --device "${DEVICE:-cuda}" --set final_episodes=1 \
        --set eval_envs=1 --set log_interval=100
    sed -n '/^|/p' "$LOGS/atari_seeds.log"
    ;;
der_parts)
    # After `der` in a lease: where the 3.6 ms of a der step go, both ways (about 2 min).
    der_parts
    ;;
der_seeds)
    # SEEDS der seeds of Krull (default 2) trained whole in one process on cuda, their
    # final 100 episodes included, timed: the stacked run end to end, with S from what the
    # atari_seeds phase's figures say fits one command. A group refuses eval_vector async
    # (each seed would start workers of its own), so its evaluations step in ale-py's
    # vector env (C++ threads; other episodes than sync's: a timing, not a report's score).
    # A dry run on a CPU (STEPS shortens the run and its evaluations):
    #   DEVICE=cpu SEEDS=2 STEPS=300 bash bench/gpu_check.sh der_seeds
    r=$RUNS/der_seeds
    rm -rf "$r"
    step der_seeds "${LIMIT:-540}" $PY run.py --env KrullNoFrameskip-v4 --config der \
        --seeds "${SEEDS:-2}" --device "${DEVICE:-cuda}" --run-dir "$r" --no-progress \
        --set eval_vector=ale ${STEPS:+--set total_steps=$STEPS --set learning_starts=200 \
        --set final_episodes=1 --set eval_envs=1 --set eval_interval=0}
    for f in "$r"/seed_*/result.json; do
        [ -f "$f" ] || continue
        echo "   $(basename "$(dirname "$f")"): $(json "$f" status), final $(json "$f" \
final_eval_return), $(json "$f" wall_time_s) s in all, $(json "$f" final_eval_wall_s) s of \
final evaluation"
        cp "$f" "$LOGS/der_seeds_$(basename "$(dirname "$f")").json"
    done
    pack
    ;;
der)
    # Data-efficient Rainbow on Krull, seed 1, 100k steps and the 100 final episodes on
    # cuda, as bench.atari100k speed times it on a CPU core, the final episodes on the
    # machine's cores (eval_vector async: the same scores). A command cut off by its limit
    # saves last.pt (SIGINT, in the final evaluation too); the next one resumes it.
    r=$RUNS/der_krull
    train der_cuda 540 "$r" --env KrullNoFrameskip-v4 --config der --seed 1 \
        --set eval_vector=async
    if ended "$r"; then
        echo "   final $(json "$r/result.json" final_eval_return), $(json "$r/result.json" \
wall_time_s) s in all, $(json "$r/result.json" final_eval_wall_s) s of final evaluation"
    else
        grep -h "resume" "$LOGS"/der_cuda*.log | tail -n 1
    fi
    cp "$r/result.json" "$LOGS/der_result.json" 2>/dev/null
    pack
    ;;
pong)
    # Pong from scratch inside one 10-minute command, the goal a noise-free +18:
    # atari.yaml's network and noise with the replay ratio of the DQN tutorials that solve
    # Pong in about 400k agent steps (32 sampled transitions per env step, learning from
    # 10k, a 100k replay, the target every 1,000 env steps), spent as a batch of 64 every
    # 2 env steps: on a GPU an update of 64 costs about what one of 32 does. Frames in GPU
    # memory when their gpu tests pass here, else pinned host frames. 16 envs in ale-py's
    # AtariVectorEnv (C++ threads), and the evaluation's 4 copies in another, so that
    # the evaluations every 25k steps hold training up less. The evaluation plays at
    # epsilon 0.001, as the Atari protocols do: a greedy Pong policy can hold a rally up
    # to the game's cap of 108k frames (docs/research/log.md#gpu-2026-11-28b). It stops
    # once 8 noise-free episodes confirm +18 (4 are played every 25k steps). Cut off at
    # the limit it saves last.pt (SIGINT) and the next command on the same machine
    # resumes it (a fresh machine starts over: its replay is too large to carry); the
    # curve (return against steps and wall time) is drawn either way.
    r=$RUNS/pong
    storage=pinned
    if [ ! -f "$r/checkpoints/last.pt" ]; then
        step pytest_frames_on_gpu 60 $PY -m pytest -m gpu -q -p no:cacheprovider \
            tests/test_atari.py -k frames_on_the_gpu && storage=device
        echo "   replay_storage=$storage"
    fi
    # Under BUDGET the run leaves a minute for its curve.
    limit=520
    [ "$BUDGET" -gt 0 ] && limit=$((BUDGET - SECONDS - 90))
    train pong "$limit" "$r" --env PongNoFrameskip-v4 --seed 1 --set num_envs=16 \
        --set vector=ale --set eval_vector=ale --set batch_size=64 --set train_freq=2 \
        --set replay_storage=$storage --set learning_starts=10000 \
        --set random_starts=10000 --set buffer_size=100000 --set target_update_interval=1000 \
        --set total_steps=1000000 --set eval_interval=25000 --set eval_episodes=4 \
        --set eval_envs=4 --set eval_epsilon=0.001 --set target_return=18 \
        --set confirm_episodes=8 --set early_stop=true --set final_episodes=10 \
        --set log_interval=5000 --set checkpoint_interval=50000
    # The run's events and result come back too, to draw its curve here if need be.
    mkdir -p "$LOGS/pong_run"
    cp "$r"/events.out.tfevents.* "$r"/result.json "$r"/config.yaml "$LOGS/pong_run/" 2>/dev/null
    pack
    step pong_curve 60 $PY -m bench.curve "$r" --out "$LOGS/pong_curve.png" \
        --title "PongNoFrameskip-v4 on $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    sed -n '/^|/p;/^training/p' "$LOGS/pong_curve.log"
    ;;
figures)
    # The figures the docs still lack, most wanted first, for what a lease has left after
    # pong (BUDGET caps it): the gpu tests (one fixed since the last lease); Pong's
    # steps/s with 16 envs, async and ale-py's AtariVectorEnv, frames on the host (pinned
    # staging) and in GPU memory (replay_storage=device), against 2,132; 256 CartPole seeds in one
    # process against one seed alone; where a DER step's time goes, both ways. (CartPole
    # end to end was measured on the H200; it stays in verify. A whole DER run has its
    # own phase: der.)
    step pytest_gpu 120 $PY -m pytest -m gpu -q -rs -p no:cacheprovider
    grep -E "passed|failed|error" "$LOGS/pytest_gpu.log" | tail -n 1
    for frames in pinned device; do
        step "bench_atari_$frames" 120 $PY -m bench.atari --device cuda --envs 16 --async \
            --ale --breakdown --set "replay_storage=$frames"
        sed -n '/^|/p' "$LOGS/bench_atari_$frames.log"
    done
    step bench_seed_group 240 $PY -m bench.seed_group speed --seeds 256 --steps 2000 \
        --device cuda
    sed -n '/^|/p' "$LOGS/bench_seed_group.log"
    der_parts
    ;;
*)
    echo "unknown phase $phase" >&2
    exit 2
    ;;
esac
echo "== $phase: $failed step(s) failed"
[ "$failed" -eq 0 ]
