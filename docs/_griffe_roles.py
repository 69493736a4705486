"""A griffe extension for the API reference (named in mkdocs.yml; not a page).

Some docstrings name other objects with Sphinx roles (:func:`name`, :class:`name`, ...), which read
well in `help()` but which Markdown would show raw. On the site each becomes inline code.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|ref):(`+)~?(.+?)\1")


def roles_to_code(text: str) -> str:
    """`:func:\\`a.b\\`` -> `` `a.b` `` (pure: tested in tests/test_docs.py)."""
    return ROLE.sub(lambda m: f"`{m.group(2)}`", text)


class RolesToCode(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = roles_to_code(obj.docstring.value)
