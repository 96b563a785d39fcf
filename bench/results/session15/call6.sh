source bench/device_call.sh; t gpu_tests 400 python3 -m pytest -q -m gpu tests > $L/gpu_tests.log 2>&1; tail -3 $L/gpu_tests.log; finish
