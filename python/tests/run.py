"""Runs the bindings' tests: with pytest when it is importable, else with the plain runner
below (each test_* function of test_*.py in this folder, a fresh tmp_path for those that ask;
a test that raises unittest.SkipTest is skipped). The ctest python_bindings calls this.
Exit 0 all passed, 1 a failure, 77 no library found (ctest: skipped; with NIGHTLORA_LIB set, a
library that does not load is a failure)."""
import importlib
import inspect
import os
import shutil
import sys
import tempfile
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def plain():
    sys.path.insert(0, HERE)
    failed = passed = skipped = 0
    for fname in sorted(os.listdir(HERE)):
        if not (fname.startswith("test_") and fname.endswith(".py")):
            continue
        mod = importlib.import_module(fname[:-3])
        for name, fn in sorted(vars(mod).items()):
            if not (name.startswith("test_") and callable(fn)):
                continue
            tmp = tempfile.mkdtemp(prefix="nl_py_")
            try:
                args = {"tmp_path": __import__("pathlib").Path(tmp)} if "tmp_path" in inspect.signature(fn).parameters else {}
                fn(**args)
                passed += 1
                print("PASS %s::%s" % (fname, name))
            except unittest.SkipTest as e:
                skipped += 1
                print("SKIP %s::%s (%s)" % (fname, name, e))
            except Exception:
                failed += 1
                print("FAIL %s::%s" % (fname, name))
                traceback.print_exc()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if hasattr(mod, "teardown_module"):
            mod.teardown_module(mod)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


def main():
    try:
        import nightlora  # noqa: F401
    except ImportError as e:
        if os.environ.get("NIGHTLORA_LIB"):  # the library asked for does not load: a failure
            print("python_bindings: %s" % e)
            return 1
        print("python_bindings: %s: skipped" % e)
        return 77
    try:
        import pytest
    except ImportError:
        pytest = None
    if pytest is None:
        print("(pytest is not installed: the plain runner)")
        return plain()
    return pytest.main(["-q", "-p", "no:cacheprovider", HERE])


if __name__ == "__main__":
    sys.exit(main())
