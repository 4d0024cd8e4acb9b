# bench/llamacpp/env.sh: the Python environment of the peer checks, sourced by
# bench/llamacpp_check.sh and bench/peers_compare.sh. One virtual environment in the model cache
# (outside git), made once and reused by every later run and by CI on the same machine:
#
#   $NL_MODEL_CACHE/venv   (NL_MODEL_CACHE defaults to $HOME/.cache/nightlora; NL_VENV overrides)
#
# nl_need_llamacpp  llama-cpp-python, built from its PyPI sdist (the real llama.cpp, CPU, -march=native,
#                   without the multimodal library), nice -n 10 on 2 build jobs, and gguf-py (for
#                   bench/llamacpp/dequant.py); returns 1 with the reason when they cannot be had
# nl_need_torch     torch, transformers and peft from PyPI (for the transformers comparison
#                   and the PEFT peer; PyPI's Linux torch wheel is the CUDA build: ~5 GB installed,
#                   its CUDA libraries are loaded but nothing runs on a GPU)
NL_MODEL_CACHE=${NL_MODEL_CACHE:-$HOME/.cache/nightlora}
NL_VENV=${NL_VENV:-$NL_MODEL_CACHE/venv}
NL_PY="$NL_VENV/bin/python"
LLAMACPP_PY_VERSION=0.3.36
GGUF_PY_VERSION=0.19.0
NL_TORCH_PKGS="torch==2.15.0 transformers==5.24.0 peft==0.21.2"

nl_make_venv() {
    [ -x "$NL_PY" ] && return 0
    mkdir -p "$NL_MODEL_CACHE"
    if ! python3 -m venv "$NL_VENV" >"$NL_MODEL_CACHE/venv.log" 2>&1; then
        tail -3 "$NL_MODEL_CACHE/venv.log"
        echo "cannot create a Python virtual environment at $NL_VENV (python3 -m venv)"
        return 1
    fi
}

nl_need_llamacpp() {
    if [ -x "$NL_PY" ] && "$NL_PY" -c "import sys, llama_cpp; sys.exit(llama_cpp.__version__ != '$LLAMACPP_PY_VERSION')" \
        2>/dev/null; then
        "$NL_PY" -c "import gguf" 2>/dev/null && return 0
        if ! "$NL_PY" -m pip install --quiet "gguf==$GGUF_PY_VERSION" >"$NL_MODEL_CACHE/gguf-install.log" 2>&1; then
            tail -3 "$NL_MODEL_CACHE/gguf-install.log"
            echo "cannot install gguf $GGUF_PY_VERSION from PyPI"
            return 1
        fi
        return 0
    fi
    nl_make_venv || return 1
    log="$NL_MODEL_CACHE/llama-cpp-python-build.log"
    echo "building llama-cpp-python $LLAMACPP_PY_VERSION (llama.cpp from its PyPI sdist) into $NL_VENV, once; log: $log"
    t0=$(date +%s)
    if ! CMAKE_BUILD_PARALLEL_LEVEL=2 \
        CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
        nice -n 10 "$NL_PY" -m pip install "llama-cpp-python==$LLAMACPP_PY_VERSION" "gguf==$GGUF_PY_VERSION" >"$log" 2>&1; then
        tail -5 "$log"
        echo "cannot build or install llama-cpp-python $LLAMACPP_PY_VERSION from PyPI"
        return 1
    fi
    echo "llama-cpp-python built in $(($(date +%s) - t0)) s"
}

nl_need_torch() {
    if [ -x "$NL_PY" ] && "$NL_PY" -c "import torch, transformers, peft" 2>/dev/null; then
        return 0
    fi
    nl_make_venv || return 1
    log="$NL_MODEL_CACHE/torch-install.log"
    echo "installing $NL_TORCH_PKGS from PyPI into $NL_VENV, once (~5 GB); log: $log"
    if ! nice -n 10 "$NL_PY" -m pip install $NL_TORCH_PKGS >"$log" 2>&1; then
        tail -5 "$log"
        echo "cannot install $NL_TORCH_PKGS from PyPI"
        return 1
    fi
}
