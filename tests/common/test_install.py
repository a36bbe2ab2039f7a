"""The hint for a missing extra names the install that works for how membench was installed."""

from __future__ import annotations

import json
from importlib import metadata

from membench.common import install


class _Dist:
    def __init__(self, direct: dict | None):
        self.direct = direct

    def read_text(self, name: str):
        return json.dumps(self.direct) if self.direct is not None else None


def test_a_clone_installed_editable_gets_pip_install_e_of_that_clone(monkeypatch):
    monkeypatch.setattr(metadata, "distribution",
                        lambda name: _Dist({"url": "file:///src/membench", "dir_info": {"editable": True}}))
    assert install.extra_hint("hf") == 'pip install -e "/src/membench[hf]"'


def test_a_package_install_gets_the_extra_by_name(monkeypatch):
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(None))
    assert install.extra_hint("hf") == 'pip install "membench[hf]"'
