#!/bin/sh
# A Spark resource discovery script announcing one "gpu" whose address is this script's pid (a fake device
# for tests/torch_gpu_job.py: no GPU is used).
echo "{\"name\": \"gpu\", \"addresses\": [\"$$\"]}"
