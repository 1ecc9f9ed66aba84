# ---- hpctrain preamble (rendered from templates/preamble.sh) ----
# Runs once in the batch step, before srun starts the tasks. Setup lines come
# from the cluster profile and the spec's `setup:`; values are shell-quoted.
# Rank variables leaked from the submitting shell would pin every job to them.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID
{{setup}}
{{env}}
export HPCTRAIN_RUN_DIR={{run_dir}}
# ---- end of hpctrain preamble ----
