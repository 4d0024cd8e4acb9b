"""The build backend of the nightlora bindings (PEP 517): setuptools' own, except where
setuptools cannot make a wheel by itself (setuptools < 70.1 without the `wheel` package, as on a
bare pyenv or python.org Python). There the pure-Python wheel (the package's .py files, no
compiled code) is written here with the standard library, so that
`pip install --no-build-isolation ./python` works offline with setuptools alone."""
import base64
import hashlib
import os
import re
import zipfile

from setuptools import build_meta as _st

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build_sdist = _st.build_sdist
get_requires_for_build_sdist = _st.get_requires_for_build_sdist


def _setuptools_builds_wheels():
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401 (setuptools >= 70.1)
        return True
    except ImportError:
        pass
    try:
        from wheel.bdist_wheel import bdist_wheel  # noqa: F401,F811
        return True
    except ImportError:
        return False


def _project():
    """name, version, description, requires-python of pyproject.toml's [project] table."""
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[)", text, re.S | re.M).group(1)
    return {k: v for k, v in re.findall(r'^([a-z-]+) = "([^"]*)"$', table, re.M)}


def _dist_info(p):
    name, version = p["name"], p["version"]
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\nProvides-Extra: numpy\n" \
           "Requires-Dist: numpy ; extra == \"numpy\"\n" % (name, version, p.get("description", ""), p.get("requires-python", ""))
    wheel = "Wheel-Version: 1.0\nGenerator: nightlora nl_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return "%s-%s.dist-info" % (name, version), {"METADATA": meta, "WHEEL": wheel, "top_level.txt": name + "\n"}


def get_requires_for_build_wheel(config_settings=None):
    return _st.get_requires_for_build_wheel(config_settings) if _setuptools_builds_wheels() else []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    if _setuptools_builds_wheels():
        return _st.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    d, files = _dist_info(_project())
    os.makedirs(os.path.join(metadata_directory, d), exist_ok=True)
    for n, body in files.items():
        with open(os.path.join(metadata_directory, d, n), "w", encoding="utf-8") as f:
            f.write(body)
    return d


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if _setuptools_builds_wheels():
        return _st.build_wheel(wheel_directory, config_settings, metadata_directory)
    p = _project()
    d, files = _dist_info(p)
    entries = []
    pkg = os.path.join(HERE, p["name"])
    for root, _dirs, names in os.walk(pkg):
        for n in sorted(names):
            if n.endswith(".py"):
                full = os.path.join(root, n)
                entries.append((os.path.relpath(full, HERE).replace(os.sep, "/"), open(full, "rb").read()))
    entries += [("%s/%s" % (d, n), body.encode()) for n, body in files.items()]
    record = []
    for arc, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (arc, digest, len(data)))
    record.append("%s/RECORD,," % d)
    whl = "%s-%s-py3-none-any.whl" % (p["name"], p["version"])
    with zipfile.ZipFile(os.path.join(wheel_directory, whl), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(arc, data)
        z.writestr("%s/RECORD" % d, "\n".join(record) + "\n")
    return whl
