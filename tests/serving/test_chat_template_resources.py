"""The shipped chat templates are package data: found through `importlib.resources` inside the
`workbench.serving` package (as in a non-editable install), and listed in pyproject's
package-data so a wheel carries them."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib.resources import files
from pathlib import Path

from workbench.serving.chat_tools import TOOLS_TEMPLATE

ROOT = Path(__file__).resolve().parents[2]


def test_the_tools_template_is_a_resource_of_the_serving_package():
    resource = files("workbench.serving").joinpath("chat_templates/smollm2_tools.jinja")
    assert resource.is_file()
    assert TOOLS_TEMPLATE.read_text() == resource.read_text()
    assert "<tool_call>" in resource.read_text()


def test_the_template_lives_inside_the_package_not_beside_it():
    package = Path(str(files("workbench.serving"))).resolve()
    assert Path(str(TOOLS_TEMPLATE)).resolve().parent == package / "chat_templates"


def test_package_data_lists_every_shipped_template():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["workbench.serving"]
    shipped = [p.name for p in files("workbench.serving").joinpath("chat_templates").iterdir()]
    assert shipped and all(any(fnmatch.fnmatch(f"chat_templates/{name}", g) for g in globs)
                           for name in shipped)


def test_the_template_renders_tools_into_the_system_turn():
    from jinja2 import Environment

    text = Environment().from_string(TOOLS_TEMPLATE.read_text()).render(
        messages=[{"role": "user", "content": "Hi"}],
        tools=[{"type": "function", "function": {"name": "add", "parameters": {}}}],
        add_generation_prompt=True)
    assert "<tools>" in text and '"add"' in text
