"""mkdocs hooks (mkdocs.yml: hooks): the build fails when docs/results.md is not what
scripts/results_page.py makes from docs/results/, so CI's `mkdocs build --strict` checks it."""

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError

_SCRIPT = Path(__file__).resolve().parent / "results_page.py"


def on_pre_build(config, **kwargs):
    spec = importlib.util.spec_from_file_location("results_page", _SCRIPT)
    results_page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results_page)
    if not results_page.PAGE.exists() or results_page.PAGE.read_text() != results_page.page():
        raise PluginError("docs/results.md is out of date with docs/results/: run python scripts/results_page.py")
