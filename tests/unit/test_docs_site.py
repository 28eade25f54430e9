"""Issue 45: the documentation site builds with `mkdocs build --strict` (a broken link, anchor or
page fails it; .ci/run builds it too), and the README's own links, which the site does not
include, point at files and headings that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index", "getting-started", "voices", "streaming", "long-form", "profiles", "scaling-out",
                 "operations", "performance", "coming-from-peers", "api", "architecture", "model", "contributing"):
        assert (site / f"{page}.html").is_file(), page
    # the plots are drawn from the JSON at build time
    for plot in ("serving", "step"):
        svg = (site / "plots" / f"{plot}.svg").read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_the_strict_build_checks_links_and_anchors():
    """mkdocs.yml keeps strict mode and link/anchor validation as warnings (which strict fails on)."""
    text = (REPO / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true$", text, flags=re.M)
    links = text.split("\n  links:\n", 1)[1]
    for key in ("not_found", "anchors", "unrecognized_links", "absolute_links"):
        assert re.search(rf"^    {key}: warn$", links, flags=re.M), key
    # offline at build time: no plugin beyond search (material's social and privacy plugins fetch)
    plugins = re.search(r"^plugins:\n((?:  - .*\n)+)", text, flags=re.M).group(1)
    assert plugins.split() == ["-", "search"]


def _slug(heading: str) -> str:
    """GitHub's heading anchor (mkdocs.yml uses the same: pymdownx.slugs, case lower)."""
    from pymdownx.slugs import slugify

    return slugify(case="lower")(re.sub(r"`([^`]*)`", r"<code>\1</code>", heading), "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1).strip()) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_readmes_links_resolve():
    pytest.importorskip("pymdownx")
    readme = (REPO / "README.md").read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        path = REPO / file
        if not path.exists():
            broken.append(target)
        elif anchor and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, broken


def test_the_docs_server_and_the_ray_examples_leave_the_servers_port_free():
    """Issue 50: `mkdocs serve` (mkdocs.yml's dev_addr) and the Ray examples' proxies listen on
    ports other than higgs-serve's default, so the pages' examples run with a server beside them."""
    import yaml

    from higgs_serve.server.settings import ServerSettings

    dev_addr = re.search(r"^dev_addr: (\S+):(\d+)$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    assert dev_addr and int(dev_addr.group(2)) != ServerSettings.port
    for example in sorted((REPO / "examples").glob("*.yaml")):
        port = yaml.safe_load(example.read_text())["http_options"]["port"]
        assert port != ServerSettings.port, example.name
