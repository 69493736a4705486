"""The English-prose corpus (dataset='embedded:prose'): pydoc topics and stdlib docstrings, offline."""

from hf_fasttrain.data.corpus import PROSE_CORPUS, build_prose_corpus, load_text_datasets, module_prose

SOURCE = '''"""A module docstring that is long enough to count as prose for the corpus, so it is kept here.

>>> 1 + 1
2
"""


def f():
    """Short."""


class C:
    """A class docstring, also long enough to be kept: it explains what the class is for, in words."""

    def g(self):
        return 1
'''


def test_module_prose_keeps_long_docstrings_without_doctest_lines():
    text = module_prose(SOURCE)
    assert text == ("A module docstring that is long enough to count as prose for the corpus, so it is kept here.\n\n"
                    "2\n\n"
                    "A class docstring, also long enough to be kept: it explains what the class is for, in words.")
    assert module_prose("def broken(:\n") == ""


def test_prose_corpus_has_topics_and_docstrings_and_no_code():
    dd = build_prose_corpus(max_files=40)
    paths = list(dd["train"]["path"]) + list(dd["validation"]["path"])
    assert len(dd["validation"]) > 0 and len(dd["train"]) > len(dd["validation"])
    assert any(p.startswith("pydoc/") for p in paths) and any(p.startswith("doc/") for p in paths)
    assert len(set(paths)) == len(paths)
    for text in list(dd["train"]["text"]):
        assert not any(line.lstrip().startswith(">>>") for line in text.splitlines())
    assert not any("import " in t[:7] for t in list(dd["train"]["text"]))  # no document starts as source code
    # selectable by name through the common loader
    again = load_text_datasets(PROSE_CORPUS, max_files=40)
    assert list(again["train"]["path"]) == list(dd["train"]["path"])
