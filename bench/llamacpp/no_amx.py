"""bench/llamacpp/no_amx.py: imported by the llama.cpp peer scripts before they build a Llama.

On a CPU with AMX tiles, llama-cpp-python 0.3.36 (built with GGML_NATIVE) puts Q4_0/Q8_0/...
weights in its AMX "extra" buffer type, and its tile kernels then die with SIGILL at the first
`tilezero` (seen on a 2-vCPU Xeon guest with amx_bf16/amx_int8/amx_tile, with the XTILEDATA
permission granted: the tile configuration is not loaded in the thread that runs them). The
peer checks compare nightlora with llama.cpp's plain CPU path, so on such a CPU the extra
buffer types are turned off (llama_model_params.use_extra_bufts = false); the dot products are
then the CPU backend's vector ones, the same as on a CPU without AMX. NL_LLAMACPP_EXTRA_BUFTS=1
keeps them."""
import os
import sys

import llama_cpp
import llama_cpp.llama as _llama


def _cpu_has_amx():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        pass
    return False


if _cpu_has_amx() and os.environ.get("NL_LLAMACPP_EXTRA_BUFTS") != "1":
    _default = llama_cpp.llama_model_default_params

    def _no_extra_bufts():
        p = _default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = _no_extra_bufts
    _llama.llama_cpp.llama_model_default_params = _no_extra_bufts
    if not os.environ.get("NL_NO_AMX_SAID"):
        os.environ["NL_NO_AMX_SAID"] = "1"
        print("llama.cpp: AMX CPU: its extra (AMX) buffer types off, the plain CPU path "
              "(bench/llamacpp/no_amx.py)", file=sys.stderr)
