# ---- hpctrain preamble (rendered from templates/preamble.sh) ----
# Runs once in the batch step, before srun starts the tasks. Setup lines come
# from the cluster profile and the spec's `setup:`; values are shell-quoted.
{{setup}}
{{env}}
export HPCTRAIN_RUN_DIR={{run_dir}}
# ---- end of hpctrain preamble ----
