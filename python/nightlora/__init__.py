"""nightlora: LoRA fine-tuning on the device that holds the data (Python bindings).

A ctypes layer over the public C API of libnightlora.so (include/nightlora.h); nothing is
compiled at install. The library is found, in this order, at:

  1. $NIGHTLORA_LIB (the path of libnightlora.so),
  2. $NIGHTLORA_PREFIX/lib (a `make install PREFIX=...` prefix),
  3. the prefix pkg-config knows (`pkg-config --variable=libdir nightlora`),
  4. the system's library path (ldconfig, LD_LIBRARY_PATH; /usr/local after `make install`),
  5. the build/ directory of the source tree this package sits in.

    import nightlora
    nightlora.mkmodel("tiny.gguf")                                  # a synthetic model
    run = nightlora.Run()
    def show(p):                                                    # after every step
        print(p.step, p.total_steps, p.loss, p.tokens_per_s)
        if p.loss < 2.0:
            run.cancel()                                            # ends it with a commit
    r = nightlora.train("tiny.gguf", "train.jsonl", "adapter.gguf", steps=20, progress=show, run=run)
    with nightlora.Model("tiny.gguf", adapter="adapter.gguf") as m:
        ids = m.tokenize("Note: buy milk")
        logits = m.logits(ids)          # numpy float32 [n, n_vocab] when numpy is there, else lists
        print(m.generate("Note: buy milk", n_predict=8), m.eval("test.jsonl").loss)

Errors raise NightloraError with the library's message (the file and the offset or line).
"""

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys

try:
    import numpy as _np
except ImportError:  # logits come back as lists of floats then
    _np = None

__all__ = [
    "NightloraError", "Model", "Run", "Progress", "TrainResult", "EvalResult",
    "abi_version", "version", "mkmodel", "train", "eval", "generate", "logits", "tokenize", "library_path",
    "merge", "export", "MergeResult",
]

ABI_VERSION = 4  # the NIGHTLORA_ABI_VERSION these bindings mirror


class NightloraError(RuntimeError):
    """A nightlora call failed; the message is the library's."""


# ---- the structs of nightlora.h, field for field ----

_c = ctypes
_str = _c.c_char_p


class _MkmodelParams(_c.Structure):
    _fields_ = [("arch", _str), ("preset", _str), ("type", _str), ("seed", _c.c_uint64)]


class _ModelParams(_c.Structure):
    _fields_ = [("adapter", _str), ("backend", _str), ("n_threads", _c.c_int), ("precision", _str),
                ("compute", _str), ("wire_f16", _c.c_int), ("device", _str)]


_TOKEN_FN = _c.CFUNCTYPE(None, _c.c_void_p, _c.c_int32, _c.POINTER(_c.c_char), _c.c_size_t)


class _GenerateParams(_c.Structure):
    _fields_ = [("n_predict", _c.c_int), ("temp", _c.c_float), ("top_p", _c.c_float), ("seed", _c.c_uint64),
                ("raw", _c.c_int), ("chat_template", _str), ("on_token", _TOKEN_FN), ("user", _c.c_void_p)]


class _EvalParams(_c.Structure):
    _fields_ = [("chat_template", _str), ("ctx", _c.c_int)]


class _EvalResult(_c.Structure):
    _fields_ = [("loss", _c.c_double), ("ppl", _c.c_double), ("accuracy", _c.c_double), ("n_targets", _c.c_int64),
                ("n_examples", _c.c_int), ("n_items", _c.c_int), ("n_correct", _c.c_int),
                ("n_truncated", _c.c_int), ("n_dropped", _c.c_int)]


class _Progress(_c.Structure):
    _fields_ = [("kind", _c.c_int), ("step", _c.c_int64), ("total_steps", _c.c_int64),
                ("loss", _c.c_double), ("lr", _c.c_double), ("grad_norm", _c.c_double), ("tokens", _c.c_int64),
                ("seconds", _c.c_double), ("tokens_per_s", _c.c_double), ("paused_seconds", _c.c_double),
                ("elapsed_seconds", _c.c_double),
                ("eval_loss", _c.c_double), ("eval_accuracy", _c.c_double), ("eval_examples", _c.c_int64),
                ("eval_tokens", _c.c_int64), ("eval_seconds", _c.c_double)]


_PROGRESS_FN = _c.CFUNCTYPE(None, _c.c_void_p, _c.POINTER(_Progress))

# (name, ctypes type, default from nightlora_train_default_params) in the header's order
_TRAIN_FIELDS = [
    ("model", _str), ("data", _str), ("out", _str), ("init_adapter", _str), ("targets", _str),
    ("chat_template", _str), ("rank", _c.c_int), ("alpha", _c.c_float), ("dropout", _c.c_float),
    ("lr", _c.c_double), ("steps", _c.c_int64), ("epochs", _c.c_double), ("batch_tokens", _c.c_int),
    ("warmup", _c.c_int), ("schedule", _str), ("lr_min", _c.c_double), ("clip", _c.c_double),
    ("weight_decay", _c.c_double), ("ctx", _c.c_int), ("refuse_long", _c.c_int), ("shuffle", _c.c_int),
    ("seed", _c.c_uint64), ("checkpoint_dir", _str), ("commit_every", _c.c_int64), ("resume", _c.c_int),
    ("act_budget_mb", _c.c_int64), ("mem_limit_mb", _c.c_double), ("backend", _str), ("n_threads", _c.c_int),
    ("precision", _str), ("compute", _str), ("method", _str), ("mezo_eps", _c.c_double), ("thermal", _str),
    ("thermal_status_file", _str), ("battery_temp_file", _str), ("log_json", _str), ("log_stderr", _c.c_int),
    ("on_progress", _PROGRESS_FN), ("user", _c.c_void_p),
    ("val_data", _str), ("val_split", _c.c_double), ("eval_every", _c.c_int64), ("keep_best", _str),
    ("early_stop", _c.c_int64),
    ("save_every", _c.c_int64), ("report", _str), ("strict_keys", _c.c_int), ("columns", _str), ("alpaca_prompt", _str),
    ("overlap", _str), ("allow_kernel_change", _c.c_int), ("device", _str),
]


class _TrainParams(_c.Structure):
    _fields_ = _TRAIN_FIELDS


class _TrainResult(_c.Structure):
    _fields_ = [("steps_done", _c.c_int64), ("total_steps", _c.c_int64), ("first_loss", _c.c_double),
                ("last_loss", _c.c_double), ("seconds", _c.c_double), ("service_seconds", _c.c_double),
                ("paused_seconds", _c.c_double), ("tokens", _c.c_int64), ("cancelled", _c.c_int),
                ("early_stopped", _c.c_int), ("evaluations", _c.c_int), ("eval_seconds", _c.c_double),
                ("best_step", _c.c_int64), ("best_loss", _c.c_double), ("best_accuracy", _c.c_double)]


class _MergeResult(_c.Structure):
    _fields_ = [("n_adapted", _c.c_int), ("n_retyped", _c.c_int), ("lost", _c.c_double), ("worst", _c.c_double)]


_STRUCTS = {
    "nightlora_mkmodel_params": _MkmodelParams, "nightlora_model_params": _ModelParams,
    "nightlora_generate_params": _GenerateParams, "nightlora_eval_params": _EvalParams,
    "nightlora_eval_result": _EvalResult, "nightlora_progress": _Progress,
    "nightlora_train_params": _TrainParams, "nightlora_train_result": _TrainResult,
    "nightlora_merge_result": _MergeResult,
}

# ---- finding and loading the library ----


def _candidates():
    env = os.environ.get("NIGHTLORA_LIB")
    if env:
        yield env
        return  # asked for that one: no other
    prefix = os.environ.get("NIGHTLORA_PREFIX")
    if prefix:
        for sub in ("lib", "lib64"):
            yield os.path.join(prefix, sub, "libnightlora.so.%d" % ABI_VERSION)
    if shutil.which("pkg-config"):
        try:
            libdir = subprocess.run(["pkg-config", "--variable=libdir", "nightlora"], capture_output=True,
                                    text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            libdir = ""
        if libdir:
            yield os.path.join(libdir, "libnightlora.so.%d" % ABI_VERSION)
    yield os.path.join(sys.prefix, "lib", "libnightlora.so.%d" % ABI_VERSION)
    yield "libnightlora.so.%d" % ABI_VERSION  # the dynamic loader's own search
    found = ctypes.util.find_library("nightlora")
    if found:
        yield found
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "libnightlora.so")


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (no such file)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("nightlora: libnightlora.so not found; set NIGHTLORA_LIB to its path or NIGHTLORA_PREFIX to the "
                      "`make install` prefix. Tried: " + "; ".join(tried))


_lib, library_path = _load()


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_abi = _fn("nightlora_abi_version", _c.c_int)
_version = _fn("nightlora_version", _str)
_last_error = _fn("nightlora_last_error", _str)
_free = _fn("nightlora_free", None, _c.c_void_p)
_sizeof = _fn("nightlora_sizeof", _c.c_size_t, _str)
_mk_defaults = _fn("nightlora_mkmodel_default_params", None, _c.POINTER(_MkmodelParams))
_mkmodel = _fn("nightlora_mkmodel", _c.c_int, _str, _c.POINTER(_MkmodelParams))
_model_defaults = _fn("nightlora_model_default_params", None, _c.POINTER(_ModelParams))
_model_open = _fn("nightlora_model_open", _c.c_void_p, _str, _c.POINTER(_ModelParams))
_model_close = _fn("nightlora_model_close", None, _c.c_void_p)
_n_vocab = _fn("nightlora_model_n_vocab", _c.c_int, _c.c_void_p)
_n_ctx = _fn("nightlora_model_n_ctx", _c.c_int, _c.c_void_p)
_tokenize = _fn("nightlora_tokenize", _c.c_int, _c.c_void_p, _str, _c.c_int, _c.POINTER(_c.c_int32), _c.c_int)
_detokenize = _fn("nightlora_detokenize", _c.c_int64, _c.c_void_p, _c.POINTER(_c.c_int32), _c.c_int,
                  _c.c_char_p, _c.c_size_t)
_logits = _fn("nightlora_logits", _c.c_int, _c.c_void_p, _c.POINTER(_c.c_int32), _c.c_int, _c.c_void_p)
_gen_defaults = _fn("nightlora_generate_default_params", None, _c.POINTER(_GenerateParams))
_generate = _fn("nightlora_generate", _c.c_int, _c.c_void_p, _str, _c.POINTER(_GenerateParams),
                _c.POINTER(_c.c_void_p))
_eval_defaults = _fn("nightlora_eval_default_params", None, _c.POINTER(_EvalParams))
_eval = _fn("nightlora_eval", _c.c_int, _c.c_void_p, _str, _c.POINTER(_EvalParams), _c.POINTER(_EvalResult))
_run_new = _fn("nightlora_run_new", _c.c_void_p)
_run_cancel = _fn("nightlora_run_cancel", None, _c.c_void_p)
_run_cancelled = _fn("nightlora_run_cancelled", _c.c_int, _c.c_void_p)
_run_reset = _fn("nightlora_run_reset", None, _c.c_void_p)
_run_free = _fn("nightlora_run_free", None, _c.c_void_p)
_train_defaults = _fn("nightlora_train_default_params", None, _c.POINTER(_TrainParams))
_train = _fn("nightlora_train", _c.c_int, _c.POINTER(_TrainParams), _c.c_void_p, _c.POINTER(_TrainResult))
_merge = _fn("nightlora_merge", _c.c_int, _str, _str, _str, _str, _c.c_double, _c.POINTER(_MergeResult))
_export = _fn("nightlora_export", _c.c_int, _str, _str, _str, _str, _str)

if _abi() != ABI_VERSION:
    raise ImportError("nightlora: %s has ABI %d, these bindings mirror ABI %d" % (library_path, _abi(), ABI_VERSION))
for _name, _cls in _STRUCTS.items():
    if _sizeof(_name.encode()) != ctypes.sizeof(_cls):
        raise ImportError("nightlora: struct %s is %d bytes in %s, %d here: the bindings do not match the library"
                          % (_name, _sizeof(_name.encode()), library_path, ctypes.sizeof(_cls)))


def _b(s, what="a string"):
    """A str or path as the C side's bytes (None stays NULL); a NUL byte inside is refused,
    since C would read only the part before it."""
    if s is None:
        return None
    b = os.fsencode(s)
    if b"\0" in b:
        raise ValueError("%s: %r holds a NUL byte (C would read only %r)" % (what, s, b.split(b"\0", 1)[0]))
    return b


def _text(s, what):
    """UTF-8 text for the C side, a NUL byte inside refused."""
    b = s.encode("utf-8")
    if b"\0" in b:
        raise ValueError("%s: the text holds a NUL byte (C would read only what is before it)" % what)
    return b


_INT_RANGES = {
    _c.c_int: (-(2 ** 31), 2 ** 31 - 1, "int"), _c.c_int32: (-(2 ** 31), 2 ** 31 - 1, "int32"),
    _c.c_int64: (-(2 ** 63), 2 ** 63 - 1, "int64"), _c.c_uint64: (0, 2 ** 64 - 1, "uint64"),
}


def _num(v, ctype, what):
    """v checked against the C field's width: an integer that does not fit is refused, not
    wrapped; a float beyond float's range is refused, not made infinite."""
    if ctype in _INT_RANGES:
        if isinstance(v, bool):
            v = int(v)
        if not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise TypeError("%s: expected an integer, got %r" % (what, v))
        lo, hi, name = _INT_RANGES[ctype]
        if not lo <= v <= hi:
            raise ValueError("%s: %d does not fit the C %s of the library ([%d, %d])" % (what, v, name, lo, hi))
        return v
    if ctype in (_c.c_float, _c.c_double):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError("%s: expected a number, got %r" % (what, v))
        v = float(v)
        if ctype is _c.c_float and v == v and abs(v) != float("inf") and abs(v) > 3.4028234663852886e38:
            raise ValueError("%s: %r is beyond a C float's range" % (what, v))
        return v
    return v


def _set(cstruct, name, v, what):
    """cstruct.name = v, checked as _b / _num check it."""
    t = dict(cstruct._fields_)[name]
    setattr(cstruct, name, _b(v, "%s: %s" % (what, name)) if t is _str else _num(v, t, "%s: %s" % (what, name)))


def _ids(ids, what):
    """Token ids as a C int32 array: each an integer that fits int32 (the vocabulary is the
    library's check)."""
    ids = [_num(i, _c.c_int32, "%s: token %d" % (what, k)) for k, i in enumerate(ids)]
    return ids, (_c.c_int32 * max(len(ids), 1))(*ids)


def _fail(what):
    raise NightloraError("%s: %s" % (what, (_last_error() or b"").decode("utf-8", "replace")))


def abi_version():
    """The library's NIGHTLORA_ABI_VERSION."""
    return _abi()


def version():
    """The library's project version, e.g. "0.2.0"."""
    return _version().decode()


def mkmodel(path, arch="qwen3", preset="tiny", type="f32", seed=42):
    """Write a synthetic model (random weights, a real byte-level BPE vocabulary) to path;
    type: "f32", "f16", "q8_0", "q4_0" or "q4_1"."""
    p = _MkmodelParams()
    _mk_defaults(p)
    for k, v in (("arch", arch), ("preset", preset), ("type", type), ("seed", seed)):
        _set(p, k, v, "mkmodel")
    if _mkmodel(_b(path, "mkmodel: path"), p):
        _fail("mkmodel")


class _Record:
    """Plain attributes, printed as name=value."""

    def __init__(self, cstruct):
        for name, _t in cstruct._fields_:
            setattr(self, name, getattr(cstruct, name))

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in vars(self).items()))


class EvalResult(_Record):
    """loss, ppl, accuracy (-1 without labelled examples), n_targets, n_examples, n_items,
    n_correct, n_truncated, n_dropped."""


class TrainResult(_Record):
    """steps_done, total_steps, first_loss, last_loss, seconds, service_seconds,
    paused_seconds, tokens, cancelled; with validation early_stopped, evaluations,
    eval_seconds, best_step, best_loss, best_accuracy (-1 without choices)."""


class Progress(_Record):
    """One progress row: kind ("step" or "eval"), step, total_steps; for a step loss, lr,
    grad_norm, tokens, seconds, tokens_per_s, paused_seconds, elapsed_seconds; for
    a validation pass eval_loss, eval_accuracy, eval_examples, eval_tokens, eval_seconds."""

    def __init__(self, cstruct):
        super().__init__(cstruct)
        self.kind = {1: "step", 2: "eval"}.get(cstruct.kind, cstruct.kind)


class Run:
    """A training run's cancel handle: cancel() from the progress callback, another thread or a
    signal handler ends the run at the next step boundary with a commit."""

    def __init__(self):
        self._h = _run_new()
        if not self._h:
            _fail("Run")

    def cancel(self):
        _run_cancel(self._h)

    @property
    def cancelled(self):
        return bool(_run_cancelled(self._h))

    def reset(self):
        """Clear a cancel, to use the handle for another run."""
        _run_reset(self._h)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _run_free(h)


_TRAIN_DEFAULTS = None


def _train_defaults_dict():
    global _TRAIN_DEFAULTS
    if _TRAIN_DEFAULTS is None:
        p = _TrainParams()
        _train_defaults(p)
        _TRAIN_DEFAULTS = {n: getattr(p, n) for n, _t in _TRAIN_FIELDS if n not in ("on_progress", "user")}
    return dict(_TRAIN_DEFAULTS)


def train(model, data, out, progress=None, run=None, **params):
    """Train a LoRA adapter (what `nightlora train` does) and write it to out.

    params are nightlora_train_params' fields: rank, alpha, dropout, lr, steps, epochs,
    batch_tokens, warmup, schedule, lr_min, clip, weight_decay, ctx, refuse_long, shuffle, seed,
    checkpoint_dir, commit_every, resume, act_budget_mb, mem_limit_mb, backend, n_threads,
    precision, compute, method, mezo_eps, thermal, thermal_status_file, battery_temp_file,
    log_json, log_stderr, init_adapter, targets, chat_template, and the validation set's
    val_data (a JSONL file) or val_split (a fraction of data), eval_every, keep_best ("loss" or
    "accuracy"), early_stop, save_every (snapshots OUT-stepN.gguf), report (an HTML report, with
    log_json), strict_keys, columns ("prompt=question,completion=answer"), alpaca_prompt
    ("auto", "alpaca" or "chat"), overlap, allow_kernel_change, device (backend="vulkan"'s
    device index as a string or int, what --vulkan-device takes; threads= stands for n_threads,
    template= for chat_template). Every value is checked as the CLI checks its flag: an
    integer that does not fit the C field, a NUL byte in a string, an epochs of inf are refused.
    progress(Progress) is called after every step and every validation pass on this thread;
    run (a Run) cancels it. An exception raised by progress cancels the run and is raised again
    once the run has ended (its last commit kept). Returns a TrainResult."""
    alias = {"threads": "n_threads", "template": "chat_template"}
    p = _TrainParams()
    _train_defaults(p)
    keep = []
    fields = dict(_TRAIN_FIELDS)
    for k, v in dict(model=model, data=data, out=out, **params).items():
        k = alias.get(k, k)
        if k not in fields or k in ("on_progress", "user"):
            raise TypeError("train: unknown parameter '%s'" % k)
        if k == "device" and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if fields[k] is _str:
            v = _b(v, "train: %s" % k)
            keep.append(v)
        else:
            v = _num(v, fields[k], "train: %s" % k)
        setattr(p, k, v)
    own_run = None
    if progress is not None and run is None:
        run = own_run = Run()  # so that an exception in the callback can stop the run
    raised = []

    def relay(_user, cp):
        if raised:
            return
        try:
            progress(Progress(cp.contents))
        except BaseException as e:  # noqa: B902 - re-raised below, after the run has stopped
            raised.append(e)
            run.cancel()

    cb = _PROGRESS_FN(relay) if progress is not None else _PROGRESS_FN()
    p.on_progress = cb
    r = _TrainResult()
    rc = _train(p, run._h if run is not None else None, r)
    del own_run
    if raised:
        raise raised[0]
    if rc:
        _fail("train")
    return TrainResult(r)


class MergeResult(_Record):
    """n_adapted, n_retyped (written finer than stored), lost (the part of the update the
    written weights' rounding loses: 0 all kept), worst (one tensor's largest)."""


def merge(model, adapter, out, type=None, max_lost=None):
    """Base + adapter merged into one GGUF at out (`nightlora merge`): type None keeps what was
    learned (adapted tensors of a <= 6-bit base as Q8_0), else "f32", "f16", "bf16", "q8_0",
    "q4_0" or "q4_1". max_lost (a fraction): nothing is written when more of the update is lost.
    Returns a MergeResult."""
    r = _MergeResult()
    if _merge(_b(model, "merge: model"), _b(adapter, "merge: adapter"), _b(out, "merge: out"), _b(type, "merge: type"),
              -1.0 if max_lost is None else _num(max_lost, _c.c_double, "merge: max_lost"), r):
        _fail("merge")
    return MergeResult(r)


def export(model, adapter, out, format="peft", base_model=None):
    """The adapter (a GGUF or a PEFT directory) converted (`nightlora export`): format "peft" (a
    PEFT directory; base_model: its base_model_name_or_path, None: the repository the GGUF names)
    or "gguf" (llama.cpp's LoRA GGUF)."""
    if _export(_b(model, "export: model"), _b(adapter, "export: adapter"), _b(format, "export: format"), _b(out, "export: out"),
               _b(base_model, "export: base_model")):
        _fail("export")


class Model:
    """A base GGUF (with an adapter) and its projection service, for inference. One call at a
    time per Model; open one per thread to infer concurrently."""

    def __init__(self, path, adapter=None, backend="host", threads=0, precision=None, compute=None, wire_f16=False,
                 device=None):
        p = _ModelParams()
        _model_defaults(p)
        if isinstance(device, int) and not isinstance(device, bool):
            device = str(device)
        for k, v in (("adapter", adapter), ("backend", backend), ("n_threads", threads), ("precision", precision),
                     ("compute", compute), ("wire_f16", int(wire_f16)), ("device", device)):
            _set(p, k, v, "Model")
        self._h = _model_open(_b(path, "Model: path"), p)
        if not self._h:
            _fail(str(path))
        self.path = str(path)

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _model_close(h)

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._h:
            raise NightloraError("%s: the model is closed" % self.path)
        return self._h

    @property
    def n_vocab(self):
        return _n_vocab(self._handle())

    @property
    def n_ctx(self):
        return _n_ctx(self._handle())

    def tokenize(self, text, special=True):
        """Token ids of text (special: BOS/EOS as the vocabulary says and control-token text
        matched, as `nightlora tokenize`; False: neither, as --no-special)."""
        t = _text(text, "tokenize")
        n = _tokenize(self._handle(), t, int(special), None, 0)
        if n < 0:
            _fail("tokenize")
        buf = (_c.c_int32 * max(n, 1))()
        if _tokenize(self._handle(), t, int(special), buf, n) != n:
            _fail("tokenize")
        return list(buf[:n])

    def detokenize(self, ids):
        ids, arr = _ids(ids, "detokenize")
        n = _detokenize(self._handle(), arr, len(ids), None, 0)
        if n < 0:
            _fail("detokenize")
        buf = _c.create_string_buffer(n + 1)
        _detokenize(self._handle(), arr, len(ids), buf, n + 1)
        return buf.raw[:n].decode("utf-8", "replace")

    def logits(self, ids):
        """The forward over ids: float32 logits [len(ids)][n_vocab], what `nightlora logits`
        writes; a numpy array when numpy is importable, else a list of lists."""
        ids, arr = _ids(ids, "logits")
        n, V = len(ids), self.n_vocab
        if _np is not None:
            out = _np.empty((n, V), dtype=_np.float32)
            ptr = out.ctypes.data_as(_c.c_void_p)
        else:
            out = (_c.c_float * (n * V))()
            ptr = _c.cast(out, _c.c_void_p)
        if _logits(self._handle(), arr, n, ptr):
            _fail("logits")
        if _np is not None:
            return out
        flat = list(out)
        return [flat[i * V:(i + 1) * V] for i in range(n)]

    def generate(self, prompt, n_predict=32, temp=0.0, top_p=1.0, seed=0, raw=False, template=None, on_token=None):
        """Text generated after prompt (one user message in the chat template unless raw),
        control tokens left out, as `nightlora generate` prints it. on_token(id, text) is
        called with each token."""
        p = _GenerateParams()
        _gen_defaults(p)
        for k, v in (("n_predict", n_predict), ("temp", temp), ("top_p", top_p), ("seed", seed), ("raw", int(raw)),
                     ("chat_template", template)):
            _set(p, k, v, "generate")
        raised = []

        def relay(_user, tid, text, n):
            if not raised:
                try:
                    on_token(tid, _c.string_at(text, n).decode("utf-8", "replace"))
                except BaseException as e:  # noqa: B902 - raised after the call
                    raised.append(e)

        cb = _TOKEN_FN(relay) if on_token is not None else _TOKEN_FN()
        p.on_token = cb
        text = _c.c_void_p()
        n = _generate(self._handle(), _text(prompt, "generate: prompt"), p, _c.byref(text))
        if raised:
            if text:
                _free(text)
            raise raised[0]
        if n < 0:
            _fail("generate")
        try:
            return _c.string_at(text).decode("utf-8", "replace")
        finally:
            _free(text)

    def eval(self, data, template=None, ctx=0):
        """Loss, perplexity and accuracy on a JSONL file (`nightlora eval`): an EvalResult."""
        p = _EvalParams()
        _eval_defaults(p)
        _set(p, "chat_template", template, "eval")
        _set(p, "ctx", ctx, "eval")
        r = _EvalResult()
        if _eval(self._handle(), _b(data, "eval: data"), p, r):
            _fail("eval")
        return EvalResult(r)


def _with_model(model, adapter, kw, fn):
    keys = ("backend", "threads", "precision", "compute", "wire_f16", "device")
    mkw = {k: kw.pop(k) for k in keys if k in kw}
    with Model(model, adapter=adapter, **mkw) as m:
        return fn(m, kw)


def eval(model, data, adapter=None, **kw):
    """Model(model, adapter).eval(data, ...)."""
    return _with_model(model, adapter, kw, lambda m, k: m.eval(data, **k))


def generate(model, prompt, adapter=None, **kw):
    """Model(model, adapter).generate(prompt, ...)."""
    return _with_model(model, adapter, kw, lambda m, k: m.generate(prompt, **k))


def logits(model, ids, adapter=None, **kw):
    """Model(model, adapter).logits(ids)."""
    return _with_model(model, adapter, kw, lambda m, k: m.logits(ids, **k))


def tokenize(model, text, special=True, **kw):
    """Model(model).tokenize(text, special)."""
    return _with_model(model, None, kw, lambda m, k: m.tokenize(text, special, **k))
