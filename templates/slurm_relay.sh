# ---- hpctrain Slurm relay (rendered from templates/slurm_relay.sh) ----
# The tasks run inside a container image that may have no scontrol. Rank 0 asks
# this loop, which runs here in the batch step outside the image, by dropping
# "show JOBID" or "requeue JOBID" into a file; only those two commands, only
# for job ids of digits (and _digits), are ever run.
hpctrain_slurm_relay() {
  local dir=$1 req base verb id out rc
  mkdir -p "$dir" || return
  while :; do
    for req in "$dir"/*.req; do
      [ -e "$req" ] || continue
      base=${req%.req}
      read -r verb id < "$req"
      if [[ $id =~ ^[0-9]+(_[0-9]+)?$ && ( $verb == show || $verb == requeue ) ]]; then
        if [ "$verb" = show ]; then out=$(scontrol --oneliner show job "$id" 2>&1); rc=$?
        else out=$(scontrol requeue "$id" 2>&1); rc=$?; fi
      else
        out="hpctrain relay: refused '$verb $id'"; rc=2
      fi
      printf '%s\n%s' "$rc" "$out" > "$base.tmp" && mv -f "$base.tmp" "$base.res"
      rm -f "$req"
    done
    sleep 0.2
  done
}
export HPCTRAIN_SLURM_RELAY={{relay_dir}}/"$SLURM_JOB_ID"
hpctrain_slurm_relay "$HPCTRAIN_SLURM_RELAY" &
# ---- end of hpctrain Slurm relay ----
