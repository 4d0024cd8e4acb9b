"""The Python bindings against the library and the CLI: a tiny synthetic model is trained with
the progress callback, cancelled from it, and its logits, tokens, evaluation and generated
text are compared with what the `nightlora` command prints for the same files."""
import os
import shutil
import struct
import subprocess
import threading
import unittest

import nightlora

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TRAIN = os.path.join(ROOT, "examples", "tagging-train.jsonl")
TEST = os.path.join(ROOT, "examples", "tagging-test.jsonl")


def cli():
    path = os.environ.get("NIGHTLORA_CLI") or os.path.join(ROOT, "build", "nightlora")
    if not os.access(path, os.X_OK):
        raise unittest.SkipTest("no nightlora CLI at %s (NIGHTLORA_CLI)" % path)
    return path


def run_cli(*args):
    r = subprocess.run([cli()] + [str(a) for a in args], capture_output=True, timeout=300)
    assert r.returncode == 0, "nightlora %s: exit %d: %s" % (" ".join(map(str, args)), r.returncode, r.stderr.decode())
    return r.stdout.decode()


_shared = {}


def trained():
    """A tiny model and a 4-step adapter, made once for the tests that only read them."""
    if "dir" not in _shared:
        import tempfile
        d = tempfile.mkdtemp(prefix="nl_py_shared_")
        model, adapter = os.path.join(d, "tiny.gguf"), os.path.join(d, "adapter.gguf")
        nightlora.mkmodel(model, arch="qwen3", preset="tiny", type="f32", seed=3)
        nightlora.train(model, TRAIN, adapter, steps=4, batch_tokens=256, lr=2e-3, thermal="off")
        _shared.update(dir=d, model=model, adapter=adapter)
    return _shared["model"], _shared["adapter"]


def test_versions():
    assert nightlora.abi_version() == nightlora.ABI_VERSION == 4
    assert nightlora.version().count(".") == 2
    assert os.path.exists(nightlora.library_path) or os.sep not in nightlora.library_path


def test_train_progress(tmp_path):
    model = str(tmp_path / "tiny.gguf")
    nightlora.mkmodel(model, seed=3)
    rows = []
    r = nightlora.train(model, TRAIN, str(tmp_path / "a.gguf"), steps=3, batch_tokens=256, thermal="off",
                        progress=rows.append, log_json=str(tmp_path / "log.jsonl"))
    assert r.steps_done == 3 and r.total_steps == 3 and not r.cancelled
    assert [p.step for p in rows] == [1, 2, 3] and all(p.kind == "step" and p.total_steps == 3 for p in rows)
    assert rows[-1].loss == r.last_loss and rows[0].loss == r.first_loss and rows[-1].tokens_per_s > 0
    # the callback's losses are the log's, exactly
    import json
    logged = [json.loads(line)["loss"] for line in open(tmp_path / "log.jsonl")]
    assert logged == [p.loss for p in rows]


def test_train_validation(tmp_path):
    model = str(tmp_path / "tiny.gguf")
    nightlora.mkmodel(model, seed=3)
    val = tmp_path / "val.jsonl"
    with open(TEST) as f:
        val.write_text("".join(f.readlines()[:6]))
    rows = []
    out, log = str(tmp_path / "a.gguf"), str(tmp_path / "log.jsonl")
    r = nightlora.train(model, TRAIN, out, steps=3, batch_tokens=256, thermal="off", val_data=str(val), eval_every=2,
                        progress=rows.append, log_json=log)
    # a validation row after steps 2 and 3, after their step rows
    assert [(p.kind, p.step) for p in rows] == [("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("eval", 3)]
    evals = [p for p in rows if p.kind == "eval"]
    assert all(p.eval_examples == 6 and p.eval_tokens > 0 and 0 <= p.eval_accuracy <= 1 and p.eval_seconds > 0 for p in evals)
    assert r.evaluations == 2 and r.eval_seconds > 0 and 2 <= r.best_step <= 3 and not r.early_stopped
    # the callback's rows are the log's {"eval": ...} rows, exactly
    import json
    logged = [json.loads(line)["eval"] for line in open(log) if line.startswith('{"eval"')]
    assert [(e["step"], e["loss"], e["accuracy"], e["examples"], e["tokens"]) for e in logged] == \
        [(p.step, p.eval_loss, p.eval_accuracy, p.eval_examples, p.eval_tokens) for p in evals]
    # the last pass is eval's on the adapter written
    e = nightlora.eval(model, str(val), adapter=out, precision="auto")  # training's resident weights
    assert e.loss == evals[-1].eval_loss and e.accuracy == evals[-1].eval_accuracy
    try:
        nightlora.train(model, TRAIN, out, steps=2, batch_tokens=256, thermal="off", early_stop=1)
    except nightlora.NightloraError as err:
        assert "needs a validation set" in str(err)
    else:
        raise AssertionError("early_stop without a validation set was taken")


def test_cancel_from_callback(tmp_path):
    model = str(tmp_path / "tiny.gguf")
    nightlora.mkmodel(model, seed=3)
    run = nightlora.Run()
    seen = []

    def cb(p):
        seen.append(p.step)
        if p.step == 2:
            run.cancel()

    out = tmp_path / "a.gguf"
    r = nightlora.train(model, TRAIN, str(out), steps=8, batch_tokens=256, thermal="off", progress=cb, run=run,
                        checkpoint_dir=str(tmp_path / "ckpt"))
    assert r.cancelled and r.steps_done == 2 and seen == [1, 2] and run.cancelled and out.stat().st_size > 0
    # resumed with a fresh handle, it runs to the end
    run.reset()
    r = nightlora.train(model, TRAIN, str(out), steps=8, batch_tokens=256, thermal="off", run=run,
                        checkpoint_dir=str(tmp_path / "ckpt"), resume=True)
    assert not r.cancelled and r.steps_done == 8


def test_cancel_from_thread(tmp_path):
    model = str(tmp_path / "tiny.gguf")
    nightlora.mkmodel(model, seed=3)
    run = nightlora.Run()
    started = threading.Event()
    t = threading.Thread(target=lambda: (started.wait(60), run.cancel()))
    t.start()
    r = nightlora.train(model, TRAIN, str(tmp_path / "a.gguf"), steps=200, batch_tokens=256, thermal="off",
                        progress=lambda p: started.set(), run=run)
    t.join()
    assert r.cancelled and 1 <= r.steps_done < 200


def test_callback_exception(tmp_path):
    model = str(tmp_path / "tiny.gguf")
    nightlora.mkmodel(model, seed=3)

    def cb(p):
        raise KeyError("stop here")

    try:
        nightlora.train(model, TRAIN, str(tmp_path / "a.gguf"), steps=5, batch_tokens=256, thermal="off", progress=cb)
    except KeyError as e:
        assert "stop here" in str(e)
    else:
        raise AssertionError("the callback's exception was not raised")
    assert (tmp_path / "a.gguf").stat().st_size > 0  # the run stopped cleanly, adapter written


def test_logits_equal_cli(tmp_path):
    model, adapter = trained()
    ids = [1, 5, 9, 200, 31, 7]
    out = tmp_path / "l.f32"
    run_cli("logits", "--model", model, "--adapter", adapter, "--tokens", " ".join(map(str, ids)), "--out", out)
    raw = out.read_bytes()
    with nightlora.Model(model, adapter=adapter) as m:
        got = m.logits(ids)
        V = m.n_vocab
    assert len(raw) == 4 * len(ids) * V
    if nightlora._np is not None:
        assert got.shape == (len(ids), V) and str(got.dtype) == "float32"
        assert got.tobytes() == raw
    else:
        assert len(got) == len(ids) and len(got[0]) == V
        assert struct.pack("<%df" % (len(ids) * V), *[x for row in got for x in row]) == raw


def test_logits_as_lists_without_numpy():
    model, adapter = trained()
    saved = nightlora._np
    try:
        nightlora._np = None
        rows = nightlora.logits(model, [1, 2, 3], adapter=adapter)
    finally:
        nightlora._np = saved
    assert isinstance(rows, list) and len(rows) == 3 and isinstance(rows[0], list) and isinstance(rows[0][0], float)
    if saved is not None:
        arr = nightlora.logits(model, [1, 2, 3], adapter=adapter)
        assert arr.tolist() == rows


def test_tokenize_equals_cli():
    model, _ = trained()
    text = "Note: Book the hotel for Friday <|im_end|>"
    for special, flags in ((True, []), (False, ["--no-special"])):
        want = [int(x) for x in run_cli("tokenize", "--model", model, "--text", text, *flags).split()]
        assert nightlora.tokenize(model, text, special=special) == want
    with nightlora.Model(model) as m:
        assert m.detokenize(m.tokenize("Book the hotel", special=False)) == "Book the hotel"


def test_eval_equals_cli():
    model, adapter = trained()
    line = run_cli("eval", "--model", model, "--adapter", adapter, "--data", TEST)
    r = nightlora.eval(model, TEST, adapter=adapter)
    assert "%d examples, %d target tokens, loss %.4f, ppl %.3f" % (r.n_examples, r.n_targets, r.loss, r.ppl) in line
    assert r.n_items and "accuracy %.1f%% (%d/%d)" % (100.0 * r.accuracy, r.n_correct, r.n_items) in line


def test_generate_equals_cli():
    model, adapter = trained()
    printed = run_cli("generate", "--model", model, "--adapter", adapter, "--prompt", "Note: Book the hotel", "--n", "6")
    pieces = []
    with nightlora.Model(model, adapter=adapter) as m:
        text = m.generate("Note: Book the hotel", n_predict=6, on_token=lambda i, t: pieces.append(t))
    assert printed == text + "\n" and "".join(pieces) == text and 1 <= len(pieces) <= 6


def test_errors(tmp_path):
    try:
        nightlora.Model(str(tmp_path / "missing.gguf"))
    except nightlora.NightloraError as e:
        assert "missing.gguf" in str(e)
    else:
        raise AssertionError("no error for a missing model")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n')
    model, _ = trained()
    try:
        nightlora.eval(model, str(bad))
    except nightlora.NightloraError as e:
        assert "bad.jsonl:2" in str(e)
    else:
        raise AssertionError("no error for a bad data line")
    try:
        nightlora.train(model, TRAIN, str(tmp_path / "a.gguf"), steps=2, rnak=4)
    except TypeError as e:
        assert "rnak" in str(e)
    else:
        raise AssertionError("an unknown parameter was accepted")
    m = nightlora.Model(model)
    m.close()
    try:
        m.tokenize("x")
    except nightlora.NightloraError as e:
        assert "closed" in str(e)
    else:
        raise AssertionError("a closed model was used")


def test_merge_export(tmp_path):
    """merge and export are functions: the same files as the CLI's."""
    model, adapter = trained()
    merged, cli_merged = str(tmp_path / "m.gguf"), str(tmp_path / "cli.gguf")
    r = nightlora.merge(model, adapter, merged)
    assert r.n_adapted > 0 and 0 <= r.lost < 0.01, r
    run_cli("merge", "--model", model, "--adapter", adapter, "--out", cli_merged)
    assert open(merged, "rb").read() == open(cli_merged, "rb").read()
    _refused(nightlora.NightloraError, lambda: nightlora.merge(model, adapter, model), "the output would replace an input")
    _refused(nightlora.NightloraError, lambda: nightlora.merge(model, adapter, merged, type="q5_k"), "type 'q5_k'")
    peft_dir, cli_dir = str(tmp_path / "peft"), str(tmp_path / "cli-peft")
    nightlora.export(model, adapter, peft_dir, base_model="org/base")
    run_cli("export", "--model", model, "--adapter", adapter, "--format", "peft", "--out", cli_dir, "--base-model", "org/base")
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        assert open(os.path.join(peft_dir, f), "rb").read() == open(os.path.join(cli_dir, f), "rb").read()
    back = str(tmp_path / "back.gguf")
    nightlora.export(model, peft_dir, back, format="gguf")
    assert nightlora.eval(model, TEST, adapter=back).loss == nightlora.eval(model, TEST, adapter=adapter).loss
    _refused(nightlora.NightloraError, lambda: nightlora.export(model, adapter, back, format="onnx"), "format 'onnx'")


def test_device():
    """device= (ABI 4) reaches the service config: a device for the host backend is refused by name,
    from Model, eval and train (test_vulkan opens a model on vulkan's device 0 through the C API)."""
    model, adapter = trained()
    _refused(nightlora.NightloraError, lambda: nightlora.Model(model, device=0), "backend 'host' has no devices")
    _refused(nightlora.NightloraError, lambda: nightlora.eval(model, TEST, device="0"), "backend 'host' has no devices")
    _refused(nightlora.NightloraError, lambda: nightlora.train(model, TRAIN, adapter + ".x", thermal="off", steps=1, device=0),
             "backend 'host' has no devices")


def _refused(exc, fn, *want):
    try:
        fn()
    except exc as e:
        for w in want:
            assert w in str(e), "%r not in %r" % (w, str(e))
    else:
        raise AssertionError("accepted: %s" % (want,))


def test_validation_as_the_cli(tmp_path):
    """One validation for every face: integers that do not fit the C field are refused (not
    wrapped), NUL bytes in strings and paths are refused (not cut), and the library refuses
    the values the CLI refuses, naming the option."""
    model, _ = trained()
    out = str(tmp_path / "a.gguf")
    m = nightlora.Model(model)
    try:
        _refused(ValueError, lambda: m.logits([2 ** 32 + 5]), "logits: token 0", "does not fit the C int32")
        _refused(ValueError, lambda: m.detokenize([-(2 ** 40)]), "detokenize: token 0")
        _refused(ValueError, lambda: m.tokenize("Hello\x00 world"), "tokenize", "NUL byte")
        _refused(ValueError, lambda: m.generate("a\x00b"), "generate: prompt", "NUL byte")
        _refused(ValueError, lambda: m.generate("a", n_predict=2 ** 31), "generate: n_predict", "int")
        _refused(ValueError, lambda: m.generate("a", seed=-1), "generate: seed", "uint64")
        _refused(ValueError, lambda: m.eval(TEST + "\x00x"), "eval: data", "NUL byte")
        _refused(nightlora.NightloraError, lambda: m.logits([m.n_vocab]), "outside the vocabulary")
        assert m.tokenize("Hello") != m.tokenize("Hello world")
    finally:
        m.close()
    _refused(ValueError, lambda: nightlora.Model(model + "\x00.bak"), "Model: path", "NUL byte")
    _refused(ValueError, lambda: nightlora.Model(model, threads=2 ** 32 + 1), "Model: n_threads")
    for k, v, want in [("steps", 2 ** 64 + 1, "does not fit the C int64"), ("rank", 2 ** 32 + 4, "does not fit the C int"),
                       ("seed", 2 ** 64, "uint64"), ("alpha", 1e300, "beyond a C float"),
                       ("log_json", str(tmp_path / "l\x00og"), "NUL byte"), ("rank", 2.5, "expected an integer")]:
        _refused((ValueError, TypeError), lambda: nightlora.train(model, TRAIN, out, thermal="off", **{k: v}), "train: " + k, want)
    for k, v, want in [("epochs", float("inf"), "--epochs inf"), ("epochs", 1e300, "--epochs 1.0000000000000001e+300"),
                       ("epochs", 1e19, "--epochs 1e+19"), ("rank", 0, "--rank 0: expected an integer in [1, 4096]"),
                       ("lr", float("nan"), "--lr nan"), ("batch_tokens", -1, "--batch-tokens -1"),
                       ("dropout", 2.0, "--dropout 2")]:
        _refused(nightlora.NightloraError, lambda: nightlora.train(model, TRAIN, out, thermal="off", steps=0 if k == "epochs" else 2,
                                                                 **{k: v}), want)
    assert not os.path.exists(out)


def teardown_module(module=None):
    if "dir" in _shared:
        shutil.rmtree(_shared["dir"], ignore_errors=True)


def test_pip_install_offline(tmp_path):
    """`pip install --no-build-isolation ./python` with no index: setuptools (or the in-tree
    fallback) builds the wheel, and the installed package loads the library."""
    import sys
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        raise unittest.SkipTest("no pip for %s" % sys.executable)
    target, src = tmp_path / "site", tmp_path / "src"
    # from a copy: setuptools writes build/ and *.egg-info beside the sources
    shutil.copytree(os.path.join(ROOT, "python"), str(src), ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                        "--target", str(target), str(src)], capture_output=True, timeout=240)
    assert r.returncode == 0, r.stderr.decode()
    env = dict(os.environ, PYTHONPATH=str(target), NIGHTLORA_LIB=nightlora.library_path)
    r = subprocess.run([sys.executable, "-c", "import nightlora; print(nightlora.__file__); print(nightlora.abi_version())"],
                       capture_output=True, env=env, cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    where, abi = r.stdout.decode().split()
    assert where.startswith(str(target)) and abi == str(nightlora.ABI_VERSION)
