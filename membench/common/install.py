"""How to install one of membench's extras, said for the way membench itself was installed: from a clone
(`pip install -e .`, where `membench[hf]` names nothing on the package index) or from a package."""

from __future__ import annotations

import json
from importlib import metadata


def extra_hint(extra: str) -> str:
    """The pip command that adds `extra`: `pip install -e "<clone>[hf]"` for an editable install (PEP 610's
    direct_url.json says where it came from), else `pip install "membench[hf]"`."""
    try:
        direct = json.loads(metadata.distribution("membench").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        direct = {}
    url = direct.get("url", "") if isinstance(direct, dict) else ""
    if url.startswith("file://") and (direct.get("dir_info") or {}).get("editable"):
        return f'pip install -e "{url.removeprefix("file://")}[{extra}]"'
    return f'pip install "membench[{extra}]"'
