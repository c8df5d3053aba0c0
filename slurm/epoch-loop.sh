#!/usr/bin/env bash
# Submits E epochs of training, each on a freshly reshuffled copy of the dataset, as a chain of
# Slurm jobs. Run it once, on a login node, from the repository root:
#
#     EPOCHS=10 TRAIN_SCRIPT=path/to/train.sbatch slurm/epoch-loop.sh
#
# For each epoch e (FIRST_EPOCH .. FIRST_EPOCH+EPOCHS-1) it submits
#
#   * train(e):      TRAIN_SCRIPT, with DATA=$DATA_ROOT/epoch-e and EPOCH=e in its environment,
#                    after shuffle(e) and train(e-1) succeeded (--dependency=afterok:...);
#   * shuffle(e+1):  slurm/reshard.sbatch with --epoch e+1 --output $DATA_ROOT/epoch-(e+1),
#                    which with OVERLAP=1 (default) runs while train(e) trains (after shuffle(e)
#                    and train(e-1)), and with OVERLAP=0 only after train(e) succeeded (use that
#                    when the reshuffle's I/O would slow the training down).
#
# Overlapping reshuffles (OVERLAP=1, every one but the first, which runs alone) share the storage
# with training, so they run with `--io-priority $OVERLAP_IO_PRIORITY` (default low: best effort,
# lowest level; idle can starve behind a training that reads all the time) and, when set,
# `--max-read-rate/--max-write-rate $OVERLAP_RATE`. OVERLAP_RATE defaults to a quarter of
# STORAGE_BANDWIDTH (what the file system sustains for one job, e.g. 4GiB/s, from your site's
# documentation or a measurement: it is not measured here, from a login node it would be wrong);
# with neither set, no rate limit. A limit that is too low delays train(e+1), which waits for
# the reshuffle: `reshard plan --max-write-rate R` says how long the reshuffle then takes.
# A quarter because a reshuffle reads as much as it writes: at a quarter each it takes half the
# storage, and leaves training the other half. Measured on the test VM (docs/performance.md,
# "Rate limits beside training"): with both limits at half the disk's write bandwidth a reader at
# full speed kept 0.59-0.73 of its throughput, at a quarter 0.98. Where the reshuffle shares
# training's nodes, their CPUs are contended too (on the 2-core test VM a reader at full speed
# needs a core of its own): OVERLAP_NICE=N adds `--nice N` (default empty: the nice value is
# left as it is).
#
# and, when $DATA_ROOT/epoch-FIRST_EPOCH does not exist yet, shuffle(FIRST_EPOCH) first. Every
# shuffle reads the original INPUT with the same SEED and its own EPOCH, so each epoch is an
# unrelated global order of the same samples. The job ids are parsed from `sbatch --parsable`;
# a failed job cancels what depends on it (Slurm leaves it pending with DependencyNeverSatisfied;
# add --kill-on-invalid-dep=yes to SBATCH_ARGS to have such jobs removed).
#
# Disk: every epoch's output stays until removed. Delete epoch-(e-1) in train(e)'s script.
# (reshard's --keep K needs the '{epoch}' template in --output, which this loop does not use: it
# names each epoch's output itself, so --keep in RESHARD_EXTRA_ARGS is refused.)
#
# DRY_RUN=1 prints the sbatch commands with made-up job ids instead of submitting.
set -euo pipefail

# ---- what to do -----------------------------------------------------------------------------
EPOCHS=${EPOCHS:-3}                                  # number of epochs to submit (E)
FIRST_EPOCH=${FIRST_EPOCH:-0}                        # the first epoch's number
TRAIN_SCRIPT=${TRAIN_SCRIPT:-path/to/train.sbatch}   # placeholder: your training batch script;
                                                     # it reads DATA and EPOCH from its environment
DATA_ROOT=${DATA_ROOT:-data}                         # outputs: $DATA_ROOT/epoch-0, epoch-1, ...
INPUT=${INPUT:-/shared/datasets/mydata/train}        # the original dataset (any reshard --input)
SHARDS=${SHARDS:-1024}                               # output shards per epoch
SEED=${SEED:-42}                                     # one seed for the whole run
OVERLAP=${OVERLAP:-1}                                # 1: reshuffle e+1 while training e
RESHARD_SBATCH=${RESHARD_SBATCH:-slurm/reshard.sbatch}   # or slurm/rescale.sbatch (GPUS=...)
# A symlink that always points at the newest complete epoch (e.g. data/current): setting LINK
# passes `--link $LINK` to every reshuffle, so the switch is atomic and readers of $LINK never
# see a half-written dataset. Empty: no link.
LINK=${LINK:-}
RESHARD_EXTRA_ARGS=${RESHARD_EXTRA_ARGS-}            # more reshard flags for every reshuffle
SBATCH_ARGS=${SBATCH_ARGS-}                          # for every job, e.g. '--account=abc'
TRAIN_SBATCH_ARGS=${TRAIN_SBATCH_ARGS-}              # for the training jobs only
RESHARD_SBATCH_ARGS=${RESHARD_SBATCH_ARGS-}          # for the reshuffle jobs only
STORAGE_BANDWIDTH=${STORAGE_BANDWIDTH:-}             # e.g. 4GiB/s: the file system's for one job
OVERLAP_RATE=${OVERLAP_RATE:-}                       # default: a quarter of STORAGE_BANDWIDTH
OVERLAP_IO_PRIORITY=${OVERLAP_IO_PRIORITY:-low}      # idle, low or normal
OVERLAP_NICE=${OVERLAP_NICE:-}                       # e.g. 10: --nice for overlapping reshuffles
DRY_RUN=${DRY_RUN:-0}
SBATCH=${SBATCH:-sbatch}

case $EPOCHS in '' | *[!0-9]*)
    echo "epoch-loop: EPOCHS must be a number, not '$EPOCHS'" >&2
    exit 2
    ;;
esac
case $FIRST_EPOCH in '' | *[!0-9]*)
    echo "epoch-loop: FIRST_EPOCH must be a number, not '$FIRST_EPOCH'" >&2
    exit 2
    ;;
esac
if [ "$DRY_RUN" != 1 ]; then
    for f in "$TRAIN_SCRIPT" "$RESHARD_SBATCH"; do
        if [ ! -f "$f" ]; then
            echo "epoch-loop: $f not found (set TRAIN_SCRIPT / RESHARD_SBATCH; run from the repository root)" >&2
            exit 2
        fi
    done
fi

if [ -n "$LINK" ]; then
    # An older reshard without --link: refuse early rather than submit jobs that all fail.
    RESHARD=${RESHARD:-reshard}
    if command -v "$RESHARD" >/dev/null && ! "$RESHARD" run --help 2>/dev/null | grep -q -- --link; then
        echo "epoch-loop: LINK=$LINK, but $RESHARD has no --link option (too old); unset LINK" >&2
        exit 2
    fi
fi

# quarter RATE: a quarter of a rate such as 4GiB/s or 500MB/s, in bytes per second
# (4GiB/s -> 1073741824/s).
quarter() {
    awk -v r="$1" 'BEGIN {
        n = r; sub(/\/s$/, "", n); u = n; sub(/^[0-9.]+/, "", u); n = substr(n, 1, length(n) - length(u))
        u = tolower(u); m["" ] = 1; m["b"] = 1
        m["k"] = m["kb"] = 1e3; m["m"] = m["mb"] = 1e6; m["g"] = m["gb"] = 1e9; m["t"] = m["tb"] = 1e12
        m["kib"] = 2^10; m["mib"] = 2^20; m["gib"] = 2^30; m["tib"] = 2^40
        if (n == "" || !(u in m)) exit 1
        printf "%.0f/s\n", n * m[u] / 4 }'
}
if [ -z "$OVERLAP_RATE" ] && [ -n "$STORAGE_BANDWIDTH" ]; then
    if ! OVERLAP_RATE=$(quarter "$STORAGE_BANDWIDTH"); then
        echo "epoch-loop: STORAGE_BANDWIDTH must be a rate such as 4GiB/s, not '$STORAGE_BANDWIDTH'" >&2
        exit 2
    fi
fi
overlap_args="--io-priority $OVERLAP_IO_PRIORITY"
if [ -n "$OVERLAP_NICE" ]; then
    overlap_args="$overlap_args --nice $OVERLAP_NICE"
fi
if [ -n "$OVERLAP_RATE" ]; then
    overlap_args="$overlap_args --max-read-rate $OVERLAP_RATE --max-write-rate $OVERLAP_RATE"
fi

read -r -a sbatch_args <<<"$SBATCH_ARGS"
read -r -a train_args <<<"$TRAIN_SBATCH_ARGS"
read -r -a reshard_sbatch_args <<<"$RESHARD_SBATCH_ARGS"

# join ID...: the non-empty job ids, colon-separated, as --dependency=afterok: wants them.
join() {
    local out="" id
    for id in "$@"; do
        [ -n "$id" ] && out=${out:+$out:}$id
    done
    echo "$out"
}

fake_id=1000
JOB=""
# submit NAME DEPENDENCY VAR=VALUE... -- SBATCH-ARGS... SCRIPT: sets JOB to the job id. The variables
# go into sbatch's environment, which the job inherits (--export=ALL, sbatch's default): unlike
# --export=VAR=VALUE lists, values may then contain commas, as brace patterns do.
submit() {
    local name=$1 dep=$2
    shift 2
    local vars=()
    while [ "$1" != -- ]; do
        vars+=("$1")
        shift
    done
    shift
    local cmd=("$SBATCH" --parsable --job-name="$name" ${dep:+--dependency=afterok:"$dep"}
        "${sbatch_args[@]}" "$@")
    echo "  $(printf '%q ' "${vars[@]}" "${cmd[@]}")" >&2
    if [ "$DRY_RUN" = 1 ]; then
        fake_id=$((fake_id + 1))
        JOB=$fake_id
        return
    fi
    local out
    out=$(env "${vars[@]}" "${cmd[@]}")
    # --parsable prints "jobid" or "jobid;cluster".
    out=${out%%;*}
    case $out in '' | *[!0-9]*)
        echo "epoch-loop: sbatch printed '$out', not a job id" >&2
        exit 1
        ;;
    esac
    JOB=$out
}

# shuffle E DEPENDENCY [FLAGS]: submits the reshuffle that writes $DATA_ROOT/epoch-E, with FLAGS
# added to its reshard arguments; sets JOB.
shuffle() {
    local epoch=$1 dep=$2 extra="$RESHARD_EXTRA_ARGS${3:+ $3}"
    if [ -n "$LINK" ]; then
        # Only once reshard supports it: publish, then point $LINK at the new epoch atomically.
        extra="$extra --link $LINK"
    fi
    submit "reshuffle-$epoch" "$dep" \
        INPUT="$INPUT" OUTPUT="$DATA_ROOT/epoch-$epoch" SHARDS="$SHARDS" SEED="$SEED" \
        EPOCH="$epoch" EXTRA_ARGS="$extra" -- "${reshard_sbatch_args[@]}" "$RESHARD_SBATCH"
}

last=$((FIRST_EPOCH + EPOCHS - 1))
echo "epoch-loop: epochs $FIRST_EPOCH..$last, data in $DATA_ROOT/epoch-N, training $TRAIN_SCRIPT" >&2
[ "$DRY_RUN" = 1 ] && echo "epoch-loop: DRY_RUN=1, nothing is submitted" >&2

# reshard writes each epoch's output next to its final place: the parent must exist.
[ "$DRY_RUN" = 1 ] || mkdir -p "$DATA_ROOT"
shuffle_job=""   # the reshuffle that writes the current epoch's data ("" if it exists)
if [ -f "$DATA_ROOT/epoch-$FIRST_EPOCH/index.json" ]; then
    echo "epoch-loop: $DATA_ROOT/epoch-$FIRST_EPOCH exists, not reshuffling it" >&2
else
    shuffle "$FIRST_EPOCH" ""
    shuffle_job=$JOB
    echo "epoch $FIRST_EPOCH: reshuffle job $shuffle_job"
fi
train_job=""
for ((e = FIRST_EPOCH; e <= last; e++)); do
    prev_train=$train_job
    # train(e) after its data is written and the previous epoch's training succeeded.
    deps=$(join "$shuffle_job" "$prev_train")
    submit "train-$e" "$deps" DATA="$DATA_ROOT/epoch-$e" EPOCH="$e" -- \
        "${train_args[@]}" "$TRAIN_SCRIPT"
    train_job=$JOB
    echo "epoch $e: training job $train_job${deps:+ (after $deps)}"
    if [ "$e" -lt "$last" ]; then
        if [ "$OVERLAP" = 1 ]; then
            # While train(e) runs: after shuffle(e) and train(e-1), so that reshuffles do not
            # race ahead of the training and fill the disk with future epochs.
            next_dep=$(join "$shuffle_job" "$prev_train")
            beside=$overlap_args
        else
            next_dep=$train_job # after train(e)
            beside=""
        fi
        shuffle $((e + 1)) "$next_dep" "$beside"
        shuffle_job=$JOB
        echo "epoch $((e + 1)): reshuffle job $shuffle_job${next_dep:+ (after $next_dep)}"
    fi
done
