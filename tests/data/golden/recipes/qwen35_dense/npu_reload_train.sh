LOCAL_DEFAULT_PATH='{out}/output' \
LOG_MF_PATH='{out}/output/log' \
HCCL_DETERMINISTIC=true \
LCCL_DETERMINISTIC=1 \
'{python}' \
/data/src/mindformers/run_mindformer.py \
--config '{out}/config.yaml' \
--mode 1
