"""Implementation selection: the compiled core unless told or unable otherwise."""

import importlib.util
import os
import subprocess
import sys

import pytest

import fastdispatch


def _implementation_with(env_value):
    env = dict(os.environ)
    env.pop("FASTDISPATCH_NO_EXTENSIONS", None)
    if env_value is not None:
        env["FASTDISPATCH_NO_EXTENSIONS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", "import fastdispatch; print(fastdispatch.IMPLEMENTATION)"],
        env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_environment_variable_forces_the_pure_python_core():
    assert _implementation_with("1") == "python"


def test_compiled_core_is_used_when_present():
    if importlib.util.find_spec("fastdispatch._ringbuf") is None:
        pytest.skip("the compiled core is not built in this installation")
    assert _implementation_with(None) == "cython"
    assert _implementation_with("0") == "cython"


def test_public_classes_come_from_the_selected_core():
    name = {"cython": "fastdispatch._ringbuf", "python": "fastdispatch._core_py"}[
        fastdispatch.IMPLEMENTATION]
    core = importlib.import_module(name)
    assert fastdispatch.SendContext is core.SendContext
    assert issubclass(fastdispatch.OutboundDispatcher, core.DispatcherCore)


def test_the_selected_core_is_not_a_public_attribute():
    # pydoc lists a package's module attributes as SUBMODULES: only the API.
    assert not hasattr(fastdispatch, "_core")
    out = subprocess.run([sys.executable, "-m", "pydoc", "fastdispatch"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    submodules = out.split("SUBMODULES", 1)[1].split("\n\n", 1)[0] if "SUBMODULES" in out else ""
    assert "_core" not in submodules


def test_demo_verifies_order_and_exits_zero():
    out = subprocess.run(
        [sys.executable, "-m", "fastdispatch", "demo", "--messages", "600",
         "--chats", "60", "--latency-ms", "2", "--max-inflight", "20"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "per-chat order  OK" in out.stdout and "all checks passed" in out.stdout


def test_command_line_lists_its_commands():
    out = subprocess.run([sys.executable, "-m", "fastdispatch", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "demo" in out.stdout and "bench" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "fastdispatch", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown command" in bad.stderr


def test_help_shows_the_api_not_cython_internals(impl):
    import pydoc
    text = pydoc.render_doc(impl.OutboundDispatcher, renderer=pydoc.plaintext)
    for internal in ("__pyx_vtable__", "__reduce_cython__", "__setstate_cython__"):
        assert internal not in text
    for method in ("submit(", "post(", "drain(", "shutdown(", "force_close(", "stats("):
        assert method in text


def test_every_documentation_pointer_can_be_followed_from_an_install():
    # An installed package has no docs/ directory: docstrings point to the
    # project's pages by URL.
    import inspect
    import re
    import pydoc
    url = "https://github.com/fastdispatch/fastdispatch/"
    texts = {"fastdispatch": fastdispatch.__doc__ or ""}
    for name in fastdispatch.__all__:
        obj = getattr(fastdispatch, name)
        texts[name] = pydoc.render_doc(obj, renderer=pydoc.plaintext) \
            if inspect.isclass(obj) or inspect.ismodule(obj) else (obj.__doc__ or "")
    for module in ("fastdispatch.pacing", "fastdispatch.context", "fastdispatch.engine",
                   "fastdispatch.platform", "fastdispatch.rules"):
        texts[module] = importlib.import_module(module).__doc__ or ""
    for where, text in texts.items():
        for found in re.finditer(r"\S*docs/\S*", text):
            assert found.group().lstrip("(<`").startswith(url), (where, found.group())


def test_metadata_names_the_project_pages():
    from importlib.metadata import metadata
    urls = dict(entry.split(", ", 1) for entry in metadata("fastdispatch").get_all("Project-URL"))
    for label in ("Homepage", "Documentation", "Source", "Issues"):
        assert urls[label].startswith("https://github.com/fastdispatch/fastdispatch"), label


def test_supported_pythons_agree_across_classifiers_wheels_and_ci():
    # The classifiers, the wheels cibuildwheel builds and the versions the
    # test workflow runs on name the same CPythons (3.9 through 3.15, and
    # the free-threaded 3.14t/3.15t built as wheels).
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pyproject = os.path.join(root, "pyproject.toml")
    workflow = os.path.join(root, ".github", "workflows", "tests.yml")
    if not (os.path.exists(pyproject) and os.path.exists(workflow)):
        pytest.skip("needs the source checkout")
    with open(pyproject) as f:
        text = f.read()
    classifiers = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text))
    build = re.search(r"\[tool\.cibuildwheel\]\s*\nbuild = \[([^\]]*)\]", text).group(1)
    wheels = set(re.findall(r'"cp3(\d+)(t?)-\*"', build))
    with open(workflow) as f:
        matrix = re.search(r'python: \[([^\]]*)\]', f.read()).group(1)
    tested = set(re.findall(r'"(3\.\d+t?)"', matrix))
    expected = {"3.%d" % minor for minor in range(9, 16)}
    assert classifiers == expected
    assert {"3." + minor for minor, t in wheels if not t} == expected
    assert {"3." + minor + "t" for minor, t in wheels if t} == {"3.14t", "3.15t"}
    assert tested >= expected | {"3.14t", "3.15t"}
    assert 'requires-python = ">=3.9"' in text
