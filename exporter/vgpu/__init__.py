"""The virtual GPU's Python side: the state file the C library (vgpu/) maps, and what fills it.

node.py and records.py describe and encode a GPU's record, state.py writes the file (stdlib only),
image.py and capture_image.py set a record from the simulator or from a real node's nvidia-smi -q,
driver.py keeps it in step with a running simulator. It serves `gpu-triage vgpu` and the tests that
hold the NVML backend to the real pynvml; it depends on the simulator backend and on nothing of
exporter/http/ (exporter/http/vgpu_app.py serves its fault API).
"""
