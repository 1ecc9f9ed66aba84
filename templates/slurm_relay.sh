# ---- hpctrain Slurm relay (rendered from templates/slurm_relay.sh) ----
# The tasks run inside a container image that may have no scontrol. Rank 0 asks
# this loop, which runs here in the batch step outside the image, by dropping
# "show JOBID", "requeue JOBID" or "norequeue JOBID" into a file; only those
# three commands, only for job ids of digits (and _digits), are ever run.
hpctrain_slurm_relay() {
  local dir=$1 req base verb id out rc
  while :; do
    for req in "$dir"/*.req; do
      [ -e "$req" ] || continue
      base=${req%.req}
      # Claim the request before running it: "scontrol requeue" ends this very
      # step, and a request still lying here would requeue the next start too.
      mv -f "$req" "$base.run" 2>/dev/null || continue
      read -r verb id < "$base.run"
      if [[ $id =~ ^[0-9]+(_[0-9]+)?$ && ( $verb == show || $verb == requeue || $verb == norequeue ) ]]; then
        if [ "$verb" = show ]; then out=$(scontrol --oneliner show job "$id" 2>&1); rc=$?
        elif [ "$verb" = requeue ]; then out=$(scontrol requeue "$id" 2>&1); rc=$?
        else out=$(scontrol update JobId="$id" Requeue=0 2>&1); rc=$?; fi
      else
        out="hpctrain relay: refused '$verb $id'"; rc=2
      fi
      printf '%s\n%s' "$rc" "$out" > "$base.tmp" && mv -f "$base.tmp" "$base.res"
      rm -f "$base.run"
    done
    sleep 0.2
  done
}
export HPCTRAIN_SLURM_RELAY={{relay_dir}}/"$SLURM_JOB_ID"
# The tasks cannot ask the image which Slurm runs the job (rank 0's requeue rule
# depends on the release): record it here, outside the image.
export HPCTRAIN_SLURM_VERSION="$(scontrol --version 2>/dev/null)"
# Whatever an earlier start of this job left here (it was requeued mid-request)
# is stale: drop it before any task can ask anything.
mkdir -p "$HPCTRAIN_SLURM_RELAY" && rm -f "$HPCTRAIN_SLURM_RELAY"/*.req "$HPCTRAIN_SLURM_RELAY"/*.run \
  "$HPCTRAIN_SLURM_RELAY"/*.res "$HPCTRAIN_SLURM_RELAY"/*.tmp "$HPCTRAIN_SLURM_RELAY"/.*.tmp
hpctrain_slurm_relay "$HPCTRAIN_SLURM_RELAY" &
# ---- end of hpctrain Slurm relay ----
