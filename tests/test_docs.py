"""The runnable examples in the public docstrings (FlashInfer-style docs must not rot)."""
import doctest

import pytest

import pagedattn.api
import pagedattn.plan


@pytest.mark.parametrize("module", [pagedattn.api, pagedattn.plan], ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, raise_on_error=False, verbose=False)
    assert result.attempted > 0 and result.failed == 0, result
