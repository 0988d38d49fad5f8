"""llama.cpp as the benchmarks' peer: the `llama_cpp` package's C API (ctypes), loaded once per run."""
import ctypes
import json
import os
import subprocess
import sys


def load_llama(model, lib_dir="", n_gpu_layers=999, n_cpu_moe=0):
    """Loads `model` with n_gpu_layers layers offloaded and the routed experts of the first n_cpu_moe
    layers kept in host RAM and computed by the CPU (llama.cpp's --n-cpu-moe: the buffer-type
    override `blk.<i>.ffn_(up|down|gate)_exps` -> CPU). lib_dir: the directory of libllama.so
    (default: the package's). Returns (the llama_cpp module, the model handle)."""
    if lib_dir:
        os.environ["LLAMA_CPP_LIB_PATH"] = lib_dir
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = n_gpu_layers
    overrides = None  # kept alive until the load, which reads it
    if n_cpu_moe > 0:
        lib = lib_dir or os.path.join(os.path.dirname(L.__file__), "lib")
        cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"))
        cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
        buft = cpu.ggml_backend_cpu_buffer_type()

        class Override(ctypes.Structure):
            _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

        patterns = [("blk\\.%d\\.ffn_(up|down|gate)_exps" % i).encode() for i in range(n_cpu_moe)]
        overrides = (Override * (n_cpu_moe + 1))()  # the last entry null: the list's end
        for i, pat in enumerate(patterns):
            overrides[i].pattern = pat
            overrides[i].buft = buft
        mp.tensor_buft_overrides = ctypes.addressof(overrides)
    mdl = L.llama_model_load_from_file(model.encode(), mp)
    if not mdl:
        raise RuntimeError("llama.cpp could not load " + model)
    return L, mdl


def run_child(script, payload):
    """Runs `script --llama-child JSON(payload)` in a process of its own and returns the JSON of its
    last output line: llama.cpp's libraries never share a process with the caller's (torch's CUDA,
    say), and a crash of the peer leaves the caller's figures standing."""
    p = subprocess.run([sys.executable, os.path.abspath(script), "--llama-child", json.dumps(payload)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        tail = " | ".join(p.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"llama.cpp exited with status {p.returncode}: {tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])
