"""A griffe extension for the API reference (named in mkdocs.yml; not a page).

Two docstring habits read well in `help()` but not on the site, and are rewritten there:
- Sphinx roles (:func:`name`, :class:`name`, ...), which Markdown would show raw, become inline code;
- Hugging Face's argument lines, ``lr (`float`, *optional*, defaults to `None`):``, whose type Google
  style would show with its backticks and asterisks, become ``lr (float):`` (the default is in the
  signature and in the parameters table).
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|ref):(`+)~?(.+?)\1")


def roles_to_code(text: str) -> str:
    """`:func:\\`a.b\\`` -> `` `a.b` `` (pure: tested in tests/test_docs.py)."""
    return ROLE.sub(lambda m: f"`{m.group(2)}`", text)


HF_ARG = re.compile(r"^(\s+\*{0,2}\w+) \((`[^`]+`(?: or `[^`]+`)*)(?:, \*optional\*)?(?:, defaults to .*?)?\):(?=\s*$)",
                    re.M)


def hf_args_to_google(text: str) -> str:
    """``name (`type`, *optional*, defaults to `x`):`` -> ``name (type):`` (pure: tested in tests/test_docs.py)."""
    return HF_ARG.sub(lambda m: f"{m.group(1)} ({' | '.join(re.findall(r'`([^`]+)`', m.group(2)))}):", text)


class RolesToCode(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = hf_args_to_google(roles_to_code(obj.docstring.value))
