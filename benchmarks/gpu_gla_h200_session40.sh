export PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 100 python3 benchmarks/gpu_profile.py --ordered --kinds gla 2>&1 | tail -60
GRAPH=1 TAG=gla_h200_session40 timeout 420 python3 benchmarks/gpu_tile_sweep.py vec_output_h200:gla,vec_state_h200:gla,chunks:gla 2>&1 | tail -25
